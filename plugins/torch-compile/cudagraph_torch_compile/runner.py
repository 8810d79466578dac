"""A ModelRunner whose steps go through torch.compile(mode="reduce-overhead").

There is no capture phase and no padding: each step runs the model at its own size through the
compiled function, and reports the mode its graph trees took (harness.graphs.trees): NONE for a
warm-up, FULL for a recording or a replay (each launches the graph once). An eager step runs the
same Inductor kernels without graphs (trees.compile_pair), as vLLM's eager reference runs its
compiled pieces.
"""
from __future__ import annotations

import torch

from harness.graphs import trees
from harness.protocol import CaptureReport, StepResult
from reference_runtime.engine.plan import NONE
from reference_runtime.engine.runner import ModelRunner


class CompiledRunner(ModelRunner):
    graphs_enabled = True

    def __init__(self, config, **seams):
        super().__init__(config, **seams)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        self.compiled, self.compiled_eager = trees.compile_pair(self.compiled_forward)

    def compiled_forward(self, ids, positions, meta):
        return self.model.forward(ids, positions, self.attention(meta))

    def capture(self):
        # Nothing to capture up front: graphs are recorded on first use of each shape.
        if self.capture_report is not None:
            raise RuntimeError("capture() was called already")
        self.capture_report = CaptureReport({}, 0.0, None, ())
        return self.capture_report

    def step(self, requests, padding_fill=None):
        requests = list(requests)
        return self.execute(self.planner.lay_out(requests, NONE, None, sum(len(r.token_ids) for r in requests)))

    def eager_step(self, requests, padded_num_tokens):
        enabled, self.graphs_enabled = self.graphs_enabled, False
        try:
            return super().eager_step(requests, padded_num_tokens)
        finally:
            self.graphs_enabled = enabled

    def execute(self, plan):
        self.stager.load(plan)
        self.last_plan = plan
        n, size = plan.num_real_tokens, plan.num_padded_tokens
        inputs = self.stager.input_ids[:size], self.stager.positions[:size], self.stager.metadata(plan)
        if not self.graphs_enabled:
            with torch.no_grad():
                return StepResult(self.compiled_eager(*inputs)[:n].clone(), "NONE", n, size)
        # The KV cache is written in place by every step: a static input of the graph trees, as a
        # parameter is (they skip graphs for a mutated input of any other kind). No autograd: with
        # grad on both compilations would be training graphs, waiting for a backward never run.
        torch._dynamo.mark_static_address(self.cache.data)
        with trees.observed() as paths, torch.no_grad():
            logits = self.compiled(*inputs)
        mode = trees.runtime_mode(paths)
        if mode is None:
            raise RuntimeError("this torch's CUDA graph trees cannot be observed (harness.graphs.trees): "
                               "the step's mode is unknown")
        # Outputs of a graph tree are overwritten by its next replay: copy the real rows out.
        return StepResult(logits[:n].clone(), mode, n, size)
