"""A complete minimal runtime: an engine with its own bucket policy, tested by the same suites.

    pytest suites/ --runtime examples.minimal_runtime:MinimalRuntime

It declares only what it answers (capture sizes and padding), so the generic padding and
capture-size invariants run against it and every other suite skips with a reason that names
the capability it lacks. Copy it as the start of a plugin for your own engine.
"""
from __future__ import annotations

import bisect

from harness.protocol import Capabilities, PolicyConfig


class MinimalRuntime:
    name = "minimal"
    version = "1.0"
    # Honest capabilities: its buckets are its own (powers of two), not vLLM's grid.
    capabilities = Capabilities(capture_sizes=True, notes="powers-of-two buckets up to 2 * max_num_seqs")

    def capture_sizes(self, config: PolicyConfig) -> list[int]:
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if config.mode == "NONE":
            return []  # nothing is captured
        budget = config.max_num_batched_tokens or max(8192, config.max_num_seqs)
        limit = min(2 * config.max_num_seqs, budget)
        sizes, size = [], 1
        while size <= limit:
            sizes.append(size)
            size *= 2
        return sizes

    def padded_size(self, config: PolicyConfig, num_tokens: int) -> int | None:
        """The smallest bucket that holds the batch; None (run eager) above the largest."""
        sizes = self.capture_sizes(config)
        index = bisect.bisect_left(sizes, num_tokens)
        return sizes[index] if index < len(sizes) else None
