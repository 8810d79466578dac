"""What one call submits, measured by the harness rather than reported by the runtime.

On CUDA the profiler sees each kernel launch, graph launch and copy. On the CPU an op counter
sees every aten op that runs outside a graph, and the graph log (harness.graphs.log) counts the
emulated replays and the ops inside them; to the op counter a replay is opaque, as a CUDA graph
is to the profiler. A stand-in that "replays" by calling the same Python function again shows
up here as eager ops, not as a graph launch.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass

import torch
from . import modes
from .log import LOG

# Ops that move no data: views, metadata and allocation. A graph would not launch a kernel for them.
_FREE = {"detach", "alias", "empty", "empty_like", "empty_strided", "lift_fresh", "_local_scalar_dense"}
_KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
_GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
_LAUNCHES = _KERNEL_LAUNCHES + _GRAPH_LAUNCHES


@dataclass
class Submissions:
    kernels: int  # kernel launches outside graphs (CUDA) or data-moving aten ops outside graphs (CPU)
    graphs: int  # graph launches
    copies: int  # memcpy calls (CUDA) or copy ops (CPU, also counted in kernels)
    ops_in_graphs: int | None = None  # ops the launched graphs ran (emulator only)
    # CUDA only: each launch API's calls as the profile recorded them, and how many host threads made
    # them: what tells one kernel counted through two APIs (runtime and driver) from two kernels.
    launch_calls: dict | list | None = None  # most(): a dict for each count it took

    def describe(self) -> str:
        inside = "" if self.ops_in_graphs is None else f" ({self.ops_in_graphs} ops inside)"
        return f"{self.kernels} kernels/ops, {self.graphs} graph launches{inside}, {self.copies} copies"

    def as_dict(self) -> dict:
        return asdict(self)


def most(fn, device: str, times: int = 2) -> Submissions:
    """The largest of `times` counts of fn, field by field: a profile can miss launches (kineto now
    and then hands back one without device activity, see kernel_time_us) but never invents one. What
    this does not remove: one engine's eager step at one batch counts differently from one process to
    the next (reports/h100/vllm-v1/README.md, "Launch counts")."""
    counts = [count(fn, device) for _ in range(times)]
    calls = [c.launch_calls for c in counts] if counts[0].launch_calls is not None else None
    return Submissions(*(max(getattr(c, f) for c in counts) if getattr(counts[0], f) is not None else None
                         for f in ("kernels", "graphs", "copies", "ops_in_graphs")), launch_calls=calls)


class _OpCounter(modes.HarnessMode):
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
    before = LOG.snapshot()
    counter = modes.make(_OpCounter)
    with counter:
        fn()
    seen = LOG.since(before)
    return Submissions(counter.ops, seen.replays, counter.copies, seen.ops_in_replays)


class _Profile(torch.autograd.profiler.profile):
    def events(self):  # torch.profiler.profile's name for them
        return self.function_events


def profiler(*activities):
    """torch's kineto profiler (`events()` as torch.profiler.profile has it), told to detach from
    the GPU whenever it stops.

    Kineto leaves CUPTI attached after a profile unless TEARDOWN_CUPTI=1, and an attached CUPTI
    slows every later launch: on the H200 a FULL step at batch 1 took 281 us of host time before a
    profile and 573 us after it (1.21 -> 1.47 ms, step then wait), so every timing taken after a
    kernel count measured the profiler. torch keeps CUPTI attached only to avoid a CUDA graph bug
    fixed in CUDA 12.6. The variable stays set for the process (kineto did not fully honour it
    when it was set for one profile only); an explicit TEARDOWN_CUPTI is left as it is.

    Opened as torch.autograd.profiler.profile, which torch.profiler.profile wraps: the wrapper
    imports torch._inductor, and dynamo with it, the first time it starts (to read one of its
    settings), which took 4.6 s of the benchmark lane's first profile on the H200 and 2.3 s on a
    CPU, in processes that compile nothing.
    """
    from torch.profiler import ProfilerActivity

    cuda = tuple(int(part) for part in (torch.version.cuda or "0").split(".")[:2])
    if cuda >= (12, 6):
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    return _Profile(use_cpu=ProfilerActivity.CPU in activities,
                    use_device="cuda" if ProfilerActivity.CUDA in activities else None, use_kineto=True)


def _count_cuda(fn) -> Submissions:
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    with profiler(ProfilerActivity.CPU) as prof:
        fn()
        torch.cuda.synchronize()
    calls, threads, copies = Counter(), set(), 0  # launches by API, the threads making them, memcpy calls
    for event in prof.events():
        if event.name in _LAUNCHES:
            calls[event.name] += 1
            threads.add(getattr(event, "thread", None))
        elif event.name.startswith(("cudaMemcpy", "cuMemcpy")):
            copies += 1
    kernels, graphs = (sum(calls[name] for name in names) for names in (_KERNEL_LAUNCHES, _GRAPH_LAUNCHES))
    return Submissions(kernels, graphs, copies, launch_calls={**calls, "threads": len(threads)})


def kernel_times_us(fn) -> dict[str, list[float]]:
    """The device time of each kernel and copy fn runs on the GPU, by name, in microseconds."""
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    with profiler(ProfilerActivity.CUDA) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            time_us = getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
            by_name.setdefault(event.name, []).append(time_us)
    return by_name


def kernel_time_us(fn, attempts: int = 3) -> float | None:
    """Summed device time of everything fn runs on the GPU (the floor a graph can approach), for an
    fn that runs kernels. Kineto now and then hands back a profile with no device activity in it
    (one of ~170 in a nightly on the H200, recorded as a floor of 0), so an empty profile is taken
    again, running fn again, up to `attempts` times; None where none saw the device."""
    for _ in range(attempts):
        times = kernel_times_us(fn)
        if times:
            return sum(sum(each) for each in times.values())
    return None
