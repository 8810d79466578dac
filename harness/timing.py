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
