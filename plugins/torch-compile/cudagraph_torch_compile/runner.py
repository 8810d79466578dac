"""The reference runner's steps through torch.compile(mode="reduce-overhead"): two seams replaced.

There is no capture phase and no padding: the planner lays each step out at its own size
(`Unpadded`), and the run strategy (`CompiledSteps`) runs it through the compiled function and
reports the mode its graph trees took (harness.graphs.trees): NONE for a warm-up, FULL for a
recording or a replay (each launches the graph once). An eager step runs the same Inductor
kernels without graphs (trees.compile_pair), as vLLM's eager reference runs its compiled pieces.
"""
from __future__ import annotations

import torch

from harness.graphs import trees
from harness.protocol import CaptureReport, StepResult
from reference_runtime.engine.plan import NONE, Planner
from reference_runtime.engine.runner import ModelRunner
from reference_runtime.engine.seams import Wrapped


class Unpadded(Wrapped):
    """The reference planner, but a step is laid out at its own size, eager: the compiler picks
    its graphs by shape, not a dispatcher."""

    def plan(self, requests, captured):
        return self.inner.lay_out(requests, NONE, None, sum(len(r.token_ids) for r in requests))


class CompiledSteps:
    """Runs every step through one torch.compile'd forward; graphs are recorded on first use."""

    def __init__(self, runner):
        self.runner = runner
        self.graphs_enabled = True  # the runtime turns it off for a NONE engine
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        self.compiled, self.compiled_eager = trees.compile_pair(self._compiled_forward)

    def _compiled_forward(self, ids, positions, meta):
        return self.runner.model.forward(ids, positions, self.runner.attention(meta))

    def capture(self) -> CaptureReport:
        return CaptureReport({}, 0.0, None, ())  # nothing to capture up front

    def run(self, plan, eager=False) -> StepResult:
        stager, cache = self.runner.stager, self.runner.cache
        stager.transfer(stager.stage(plan))
        num_real_tokens, num_padded_tokens = plan.num_real_tokens, plan.num_padded_tokens
        inputs = stager.input_ids[:num_padded_tokens], stager.positions[:num_padded_tokens], stager.metadata(plan)
        if eager or not self.graphs_enabled:
            with torch.no_grad():
                logits = self.compiled_eager(*inputs)
            return StepResult(logits[:num_real_tokens].clone(), "NONE", num_real_tokens, num_padded_tokens)
        # The KV cache is written in place by every step: a static input of the graph trees, as a
        # parameter is (they skip graphs for a mutated input of any other kind). No autograd: with
        # grad on both compilations would be training graphs, waiting for a backward never run.
        torch._dynamo.mark_static_address(cache.data)
        with trees.observed() as paths, torch.no_grad():
            logits = self.compiled(*inputs)
        mode = trees.runtime_mode(paths)
        if mode is None:
            raise RuntimeError("this torch's CUDA graph trees cannot be observed (harness.graphs.trees): "
                               "the step's mode is unknown")
        # Outputs of a graph tree are overwritten by its next replay: copy the real rows out.
        return StepResult(logits[:num_real_tokens].clone(), mode, num_real_tokens, num_padded_tokens)


def compiled_runner(config) -> ModelRunner:
    """The reference runner with the unpadded planner and the compiled run strategy."""
    return ModelRunner(config, planner=Unpadded.around(Planner), strategy=CompiledSteps)
