"""`torch.cuda`'s graph API, emulated on the CPU: `CUDAGraph`, `graph`, `graph_pool_handle`.

    from harness.graphs import emulator
    cg = torch.cuda if torch.cuda.is_available() else emulator
"""
from .emulated import CUDAGraph, graph, graph_pool_handle

__all__ = ["CUDAGraph", "graph", "graph_pool_handle"]
