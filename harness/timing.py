"""Wall-clock timing of steps on a GPU, shared by the benchmark lane and scripts/step_breakdown.py."""
from __future__ import annotations

import statistics
import time


def in_a_stream_ms(step, steps: int, repeats: int = 3) -> float:
    """Milliseconds per call of `steps` calls of step() issued back to back, the device synchronised
    only before and after them (the median over `repeats` runs): what a step costs when the host
    prepares the next one while the device runs the last, as a serving loop does."""
    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times) * 1e3


def host_reference_ms(repeats: int = 5) -> float:
    """Milliseconds this host takes for a fixed loop of pure Python (the median of `repeats`): how
    fast the interpreter runs now. A step paced by the host (an eager step launches every kernel
    from Python) slows with it, and a lent machine's host speed moves by up to 2x between runs, so
    the regression check (harness.measurements.compare) reads each figure beside this one."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(50_000):
            total += i & 7
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
