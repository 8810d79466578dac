"""A ModelRunner whose eager step goes through torch.compile(mode="reduce-overhead")."""
from __future__ import annotations

import torch

from reference_runtime.engine.runner import CaptureSummary, CUDAGraphMode, ModelRunner, StepOutput


def _skips() -> int:
    from torch._dynamo.utils import counters

    return sum(v for k, v in counters["inductor"].items() if "cudagraph_skip" in k)


class CompiledRunner(ModelRunner):
    graphs_enabled = True

    def __init__(self, config):
        super().__init__(config)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        self._compiled = torch.compile(self._forward_for_compile, mode="reduce-overhead", dynamic=False)
        self.skipped_steps = 0

    def _forward_for_compile(self, ids, positions, meta):
        return self.model.forward(ids, positions, self._attention(meta))

    def capture(self):
        # Nothing to capture up front: graphs are recorded on first use of each shape.
        self.capture_summary = CaptureSummary({}, 0.0, None, {}, [], "cuda-graph-trees")
        return self.capture_summary

    def _execute(self, layout, mode, key):
        if not self.graphs_enabled:
            return super()._execute(layout, mode, key)
        n = layout.num_real_tokens
        meta = self.buffers.metadata(layout)
        size = layout.num_tokens
        before = _skips()
        logits = self._compiled(self.buffers.input_ids[:size], self.buffers.positions[:size], meta)
        skipped = _skips() > before
        self.skipped_steps += skipped
        # Outputs of a graph tree are overwritten by its next replay: copy the real rows out.
        return StepOutput(logits[:n].clone(), "NONE" if skipped else "FULL", n, size)

    def step(self, requests, padding_fill=None):
        n = sum(len(r.token_ids) for r in requests)
        return self._run(requests, CUDAGraphMode.NONE, n, None, None, padding_fill)

    def eager_step(self, requests, padded_num_tokens):
        enabled, self.graphs_enabled = self.graphs_enabled, False
        try:
            return super()._run(requests, CUDAGraphMode.NONE, padded_num_tokens, None, None)
        finally:
            self.graphs_enabled = enabled
