"""Timing steps on a GPU and the host beside them, shared by the benchmark lane and scripts/step_breakdown.py."""
from __future__ import annotations

import statistics
import time


def in_a_stream_ms(step, steps: int, repeats: int = 3) -> float:
    """Milliseconds per call of step() when calls are issued back to back, the host preparing the
    next step while the device runs the last, as a serving loop does: the median over `repeats`
    runs of `steps` calls. Each run is timed on the device, from the end of a first, untimed call to
    the end of the last, so neither the queue filling up nor the host's final wait is in it (a
    wall-clock run needs three times the steps to amortise both). The events are on the current
    stream, where a step's logits are ready for its caller: an engine that works on a stream of its
    own must make the current stream wait for it, or its caller would read logits not yet written."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        step()
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def host_reference_ms(repeats: int = 5) -> float:
    """Milliseconds this host takes for a fixed loop of pure Python (the median of `repeats`): how
    fast the interpreter runs now. A step paced by the host (an eager step launches every kernel
    from Python) slows with it, and a lent machine's host speed moves by up to 2x between runs, so
    the regression check (harness.reports.measurements.compare) reads each figure beside this one."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        total = 0
        for i in range(50_000):
            total += i & 7
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
