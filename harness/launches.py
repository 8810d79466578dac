"""Counting what a step submits, measured by the harness rather than reported by the runtime.

On CUDA the profiler sees each kernel launch, graph launch and copy. On the CPU emulator a
dispatch-mode counter sees every aten op that runs outside a graph (a graph replay is opaque
to it, as a CUDA graph is to the profiler), so graph modes show only what runs around them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that move no data: views, metadata and allocation. A graph would not launch a kernel for them.
_FREE = {"detach", "alias", "empty", "empty_like", "empty_strided", "lift_fresh", "_local_scalar_dense"}


@dataclass
class Submissions:
    kernels: int  # kernel launches (CUDA) or data-moving ops (CPU)
    graphs: int | None  # graph launches; None where the counter cannot see them
    copies: int  # memcpy calls (CUDA) or copy ops (CPU), included in kernels on CPU

    def describe(self) -> str:
        graphs = "?" if self.graphs is None else self.graphs
        return f"{self.kernels} kernels/ops, {graphs} graph launches, {self.copies} copies"


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _FREE:
            self.ops += 1
            self.copies += name in ("copy_", "_to_copy", "clone")
        return func(*args, **(kwargs or {}))


def count(fn, device: str) -> Submissions:
    """Run fn once and count what it submitted."""
    if device == "cuda":
        return _count_cuda(fn)
    counter = _OpCounter()
    with counter:
        fn()
    return Submissions(counter.ops, None, counter.copies)


def _count_cuda(fn) -> Submissions:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = graphs = copies = 0
    for event in prof.events():
        name = event.name
        if name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"):
            kernels += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            graphs += 1
        elif name.startswith(("cudaMemcpy", "cuMemcpy")):
            copies += 1
    return Submissions(kernels, graphs, copies)


def kernel_time_us(fn) -> float:
    """Summed device time of everything fn runs on the GPU (the floor a graph can approach)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total += getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
    return total
