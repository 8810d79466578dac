"""Padding: a batch of n tokens runs in the graph of the smallest capture size >= n."""
from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Padding:
    batch: int
    padded: int | None  # None: above the max capture size, runs eager and unpadded

    @property
    def runs(self) -> str:
        return "eager" if self.padded is None else "graph"

    @property
    def waste_tokens(self) -> int:
        return 0 if self.padded is None else self.padded - self.batch

    @property
    def waste_pct(self) -> float:
        return 0.0 if self.padded is None else 100.0 * self.waste_tokens / self.padded


class PaddingTable:
    """Precomputed n -> padded size for every n up to the max, as vLLM's dispatcher does."""

    def __init__(self, sizes: list[int]):
        self.sizes = sorted(set(sizes))
        self.max_size = self.sizes[-1] if self.sizes else 0  # no sizes: every batch runs eager
        self._padded = [0] * (self.max_size + 1)
        for n in range(1, self.max_size + 1):
            self._padded[n] = self.sizes[bisect.bisect_left(self.sizes, n)]

    def padded(self, num_real_tokens: int) -> int | None:
        if num_real_tokens < 1:
            raise ValueError(f"a batch has at least 1 token, got {num_real_tokens}")
        if num_real_tokens > self.max_size:
            return None
        return self._padded[num_real_tokens]

    def pad(self, num_real_tokens: int) -> Padding:
        return Padding(num_real_tokens, self.padded(num_real_tokens))
