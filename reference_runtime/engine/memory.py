"""The memory budget (vLLM's): KV cache = budget - model and activations - graph estimate.

The graph estimate captures the two largest keys of each mode into a throwaway pool, measures
what the pool grew by, and extrapolates: the largest costs what it costs; each further graph is
charged what the second one added (smaller graphs reuse the larger one's blocks), with vLLM's
1 MiB floor per graph. Nothing here changes the runner: ModelRunner.fit_kv_cache does.
"""
from __future__ import annotations

import gc

import torch

from harness.graphs import make_backend


def estimate_graph_memory(runner) -> int:
    """Bytes the runner's graphs will hold, from captures into a pool thrown away after."""
    if runner.device.type != "cuda":
        raise ValueError("the memory budget sizes the KV cache from device memory; it needs device='cuda'")
    throwaway = make_backend("cuda", runner.device)
    estimate = 0
    try:
        with runner.capture_phase():
            for mode, keys in runner.dispatcher.capture_keys():
                deltas = []
                for key in keys[:2]:  # what the pool grew by (free device memory can stay put)
                    before = throwaway.pool_stats()["bytes"]
                    runner.strategy.capture_key(mode, key, throwaway)
                    deltas.append(throwaway.pool_stats()["bytes"] - before)
                estimate += deltas[0] + max(deltas[-1], 2**20) * (len(keys) - 1)
    finally:
        del throwaway
        gc.collect()
        torch.cuda.empty_cache()
    return estimate


def kv_blocks(cache, utilization: float, graph_estimate: int) -> int:
    """Blocks of `cache`'s shape that fit in `utilization` of the device, after what is in use
    (the model, buffers, the allocator's cache) and the graph estimate."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    free, total = torch.cuda.mem_get_info(cache.device)
    used = total - free
    per_block = cache.data[:, :, : cache.block_size].numel() * cache.data.element_size()
    available = int(utilization * total) - used - graph_estimate
    blocks = available // per_block
    if blocks < 2:
        raise ValueError(
            f"no memory left for the KV cache: {utilization:.0%} of {total / 2**30:.1f} GiB minus "
            f"{used / 2**30:.2f} GiB in use and a {graph_estimate / 2**30:.2f} GiB graph estimate "
            f"leaves {available / 2**30:.2f} GiB; raise gpu_memory_utilization or shrink the capture sizes")
    return int(blocks)
