"""What graphs did in this process, seen by the harness itself: captures, replays, and the ops
inside emulated replays.

The emulator writes here directly. Real CUDA graphs are seen by wrapping the Python methods of
`torch.cuda.CUDAGraph` that every user goes through (`torch.cuda.graph` calls `capture_end`,
and a replay is `replay()`): vLLM, torch.compile's graph trees and hand-written graphs alike.
The wrappers only count and call through.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class GraphLog:
    captures: int = 0
    replays: int = 0
    ops_in_replays: int = 0  # emulated replays only: CUDA graphs do not say how many nodes ran
    held_bytes: int = 0  # what emulated graphs hold (a CUDA graph's pool is measured on the device)

    def snapshot(self) -> "GraphLog":
        return GraphLog(self.captures, self.replays, self.ops_in_replays, self.held_bytes)

    def since(self, before: "GraphLog") -> "GraphLog":
        return GraphLog(self.captures - before.captures, self.replays - before.replays,
                        self.ops_in_replays - before.ops_in_replays, self.held_bytes - before.held_bytes)


LOG = GraphLog()
_timed: list | None = None  # (start, end) CUDA events of each replay while timed_replays() is open


@contextmanager
def timed_replays():
    """Time every CUDA graph replay on its stream while open: yields a list that fills with the
    milliseconds of each (read it after the block; the device is synchronised on exit)."""
    import torch

    global _timed
    outer, _timed, times = _timed, [], []
    try:
        yield times
    finally:
        events, _timed = _timed, outer
        torch.cuda.synchronize()
        times.extend(start.elapsed_time(end) for start, end in events)


def watch_cuda_graphs() -> None:
    """Count captures and replays of every torch.cuda.CUDAGraph from now on (idempotent)."""
    import torch

    graph_class = torch.cuda.CUDAGraph
    if getattr(graph_class, "_counted_by_the_harness", False):
        return
    capture_end, replay = graph_class.capture_end, graph_class.replay

    def counted_capture_end(self, *args, **kwargs):
        result = capture_end(self, *args, **kwargs)
        LOG.captures += 1
        return result

    def counted_replay(self, *args, **kwargs):
        if _timed is None:
            result = replay(self, *args, **kwargs)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = replay(self, *args, **kwargs)
            end.record()
            _timed.append((start, end))
        LOG.replays += 1
        return result

    graph_class.capture_end = counted_capture_end
    graph_class.replay = counted_replay
    graph_class._counted_by_the_harness = True
