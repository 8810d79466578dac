"""The memory budget (vLLM's): KV cache = budget - model and activations - graph estimate.

The graph estimate captures the two largest keys of each mode in a throwaway pool, measures what
the pool grew by, and extrapolates: the largest costs what it costs; each further graph is charged
what the second one added (smaller graphs reuse the larger one's blocks), with vLLM's 1 MiB floor
per graph.
"""
from __future__ import annotations

import gc

import torch

from harness.graphs import make_backend

from .kv_cache import BlockAllocator, KVCache


def size_kv_cache(runner, utilization: float) -> None:
    """Resize the runner's KV cache to what the budget leaves after the graph estimate."""
    if runner.device.type != "cuda":
        raise ValueError("gpu_memory_utilization sizes the KV cache from device memory; it needs device='cuda'")
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    runner.graph_memory_estimate = estimate_graph_memory(runner)
    free, total = torch.cuda.mem_get_info(runner.device)
    used = total - free  # the model, buffers and the allocator's cache so far
    block_size = runner.config.block_size
    per_block = runner.cache.data[:, :, :block_size].numel() * runner.cache.data.element_size()
    available = int(utilization * total) - used - runner.graph_memory_estimate
    blocks = available // per_block
    if blocks < 2:
        raise ValueError(
            f"no memory left for the KV cache: {utilization:.0%} of {total / 2**30:.1f} GiB minus "
            f"{used / 2**30:.2f} GiB in use and a {runner.graph_memory_estimate / 2**30:.2f} GiB graph estimate "
            f"leaves {available / 2**30:.2f} GiB; raise gpu_memory_utilization or shrink the capture sizes")
    model = runner.model
    runner.num_blocks = int(blocks)
    runner.cache = KVCache(model.num_layers, runner.num_blocks, block_size, model.kv_heads, model.head_dim,
                           runner.dtype, runner.device)
    for backend in runner.backends:
        backend.cache = runner.cache
    runner.allocator = BlockAllocator(runner.num_blocks, block_size)


def estimate_graph_memory(runner) -> int:
    real, runner.graphs = runner.graphs, make_backend("cuda", runner.device)
    estimate = 0
    try:
        with runner.capture_phase():
            for mode, keys in runner.dispatcher.capture_keys():
                deltas = []
                for key in keys[:2]:  # what the pool grew by (free device memory can stay put)
                    before = runner.graphs.pool_stats()["bytes"]
                    runner.capture_key(mode, key)
                    deltas.append(runner.graphs.pool_stats()["bytes"] - before)
                estimate += deltas[0] + max(deltas[-1], 2**20) * (len(keys) - 1)
    finally:
        runner.graphs, runner.full_graphs, runner.piece_graphs = real, {}, {}
        gc.collect()
        torch.cuda.empty_cache()
    return estimate
