"""Paged KV cache: fixed-size blocks, a block table per request, a slot per token.

Slot s lives in block s // block_size at offset s % block_size. Padded token rows carry slot
-1 and must write nothing: -1 is redirected to a scratch slot that lies outside every block
(Python-style indexing would wrap -1 onto the last real slot and overwrite it, a bug real
engines shipped). Block 0 is the null block: padded rows read it and it is never allocated.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from harness.protocol import KVCacheFull

NULL_BLOCK = 0


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.num_layers, self.block_size = num_layers, block_size
        self.kv_heads, self.head_dim, self.dtype, self.device = kv_heads, head_dim, dtype, device
        self.resize(num_blocks)

    def resize(self, num_blocks: int) -> None:
        """Hold num_blocks blocks from now on (what was cached is gone): the memory budget sizes the
        cache once the graphs' share is known (ModelRunner.fit_kv_cache)."""
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_slots = num_blocks * self.block_size
        self.scratch_slot = self.num_slots
        # [layer, k/v, slot, kv_heads, head_dim]; the last slot is the scratch slot.
        self.data = torch.zeros(self.num_layers, 2, self.num_slots + 1, self.kv_heads, self.head_dim,
                                dtype=self.dtype, device=self.device)
        # Each layer's keys and values as views made once: an eager step asks for them a few times a
        # layer, and indexing the 5-d tensor each time costs the host more than the kernels it feeds.
        self._keys = [self.data[layer, 0] for layer in range(self.num_layers)]
        self._values = [self.data[layer, 1] for layer in range(self.num_layers)]

    def keys(self, layer: int) -> torch.Tensor:
        # Traced by torch.compile, the view is made inside the trace: a view made beforehand enters
        # it as an input whose view metadata dynamo re-derives, and torch 2.11 failed that check
        # (an AssertionError on requires_grad, reports/h200/matrix/before_fix/reference-compile.log).
        return self.data[layer, 0] if torch.compiler.is_compiling() else self._keys[layer]

    def values(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1] if torch.compiler.is_compiling() else self._values[layer]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        slots = torch.where(slot_mapping >= 0, slot_mapping, self.scratch_slot)
        self.keys(layer).index_copy_(0, slots, k)
        self.values(layer).index_copy_(0, slots, v)

    def real_blocks(self) -> torch.Tensor:
        """Every slot of every real block (the scratch slot excluded), for snapshots in tests."""
        return self.data[:, :, : self.num_slots]

    def snapshot(self) -> torch.Tensor:
        """A copy of every real slot, slot first: [slots, layers, k/v, kv_heads, head_dim]."""
        return self.real_blocks().permute(2, 0, 1, 3, 4).clone()

    @contextmanager
    def poisoned(self, value: float):
        """For one step: `value` (NaN, inf) in what only padded rows read, the null block and the
        scratch slot, so that a real row that reads them shows it; zero again afterwards."""
        null_block, scratch = self.data[:, :, : self.block_size], self.data[:, :, self.scratch_slot]
        null_block.fill_(value)
        scratch.fill_(value)
        try:
            yield
        finally:
            null_block.zero_()
            scratch.zero_()


class BlockAllocator:
    """Hands out blocks to requests; block 0 is reserved as the null block."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.reset(num_blocks)

    def reset(self, num_blocks: int) -> None:
        """Every block free again, num_blocks of them (the cache was resized)."""
        self.free = list(range(num_blocks - 1, NULL_BLOCK, -1))
        self.tables: dict[int, list[int]] = {}

    def ensure(self, request_id: int, num_real_tokens: int) -> list[int]:
        """Grow a request's block table to hold num_real_tokens tokens."""
        table = self.tables.setdefault(request_id, [])
        needed = -(-num_real_tokens // self.block_size) - len(table)
        if needed > 0:
            if needed > len(self.free):
                raise KVCacheFull(
                    f"KV cache is full: request {request_id} needs {needed} more blocks, {len(self.free)} are free; "
                    "raise num_blocks or lower max_num_seqs"
                )
            table += [self.free.pop() for _ in range(needed)]
        return table

    def slot(self, request_id: int, position: int) -> int:
        table = self.tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def release(self, request_id: int) -> None:
        self.free.extend(reversed(self.tables.pop(request_id, [])))
