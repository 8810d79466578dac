"""Real CUDA graphs: one torch.cuda.CUDAGraph per capture, all sharing one memory pool.

Sharing the pool lets smaller graphs, captured after larger ones, reuse the larger's blocks
(SPEC 6). Capture runs on a side stream, as torch.cuda.graph requires. The caller warms up.
This module imports on CPU-only machines; the backend is only constructible where CUDA is.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from contextlib import nullcontext

from .base import CapturedGraph, CaptureError, GraphBackend, InputAddress
from .held import Outside, Watcher
from .log import watch_cuda_graphs


class CudaGraph(CapturedGraph):
    num_ops = None  # CUDAGraph exposes no cheap node count

    def __init__(self, backend, name, output, input_addresses, graph: torch.cuda.CUDAGraph,
                 outside: Outside | None = None):
        super().__init__(backend, name, output, input_addresses)
        self._graph = graph
        self._outside = outside  # watch_memory: the memory it uses that the program owns

    def _launch(self) -> None:
        if self._outside is not None:
            self._outside.check()  # FreedMemoryError rather than a replay over reused memory
        self._graph.replay()


@functools.cache
def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One capture stream per device for every engine of the process. cuBLAS keeps a workspace for
    each stream a matmul ran on, for as long as the process lives: a stream per engine left one
    workspace (32 MiB on the H200) behind for every engine ever built, seen by the taint check as a
    leak of each test that built a fresh engine."""
    return torch.cuda.Stream(device)


class CudaGraphBackend(GraphBackend):
    name = "cuda"

    def __init__(self, device: torch.device | str = "cuda", debug: bool = False, watch_memory: bool = False):
        if not torch.cuda.is_available():
            raise ValueError("graph backend 'cuda' needs a CUDA device, and none is available here; "
                             "use the 'emulated' backend on CPU-only machines")
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"graph backend 'cuda' captures on a CUDA device, not {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(debug)
        # A debug mode: each capture notes the memory its ops use that it did not allocate, keeps it
        # (so a replay never reads a successor's data) and checks before each replay that the
        # program still holds it (held.py). It costs a dispatch mode during capture.
        self.watch_memory = watch_memory
        watch_cuda_graphs()
        with torch.cuda.device(self.device):
            self._pools = [torch.cuda.graph_pool_handle()]  # the last is current; see below
            self._capture_stream = _capture_stream(self.device)
        self._failed_captures: list[torch.cuda.CUDAGraph] = []

    def _capture(self, fn: Callable[[], Any], name: str, input_addresses: dict[str, InputAddress]) -> CudaGraph:
        graph = torch.cuda.CUDAGraph()
        outside = Outside(name) if self.watch_memory else None
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=self._pools[-1], stream=self._capture_stream):
                with Watcher(outside) if outside is not None else nullcontext():
                    output = fn()
        except RuntimeError as error:
            self._recover_from_failed_capture(graph)
            # CUDA reports a sync or an unsafe call during capture as a generic RuntimeError
            # (or torch.AcceleratorError); give callers the same CaptureError the emulator raises.
            if "captur" not in str(error).lower():
                raise
            first_error = str(error.__context__ or error).splitlines()[0]
            raise CaptureError(
                f"graph {name!r}: CUDA rejected an operation during capture; CPU synchronisation "
                f"(.item(), .tolist()), data-dependent shapes and device-to-host copies are forbidden "
                f"during graph capture, and the callable must have been warmed up eagerly first. "
                f"CUDA said: {first_error}"
            ) from error
        return CudaGraph(self, name, output, input_addresses, graph, outside)

    def _recover_from_failed_capture(self, graph: torch.cuda.CUDAGraph) -> None:
        # A capture that fails leaves the allocator recording into its pool (torch ends the
        # recording only after a successful cudaStreamEndCapture), so that pool cannot be
        # captured into again: continue in a fresh pool. Earlier graphs keep theirs. The
        # allocator's stale entry still points at the failed graph, so keep that object alive.
        self._failed_captures.append(graph)
        with torch.cuda.device(self.device):
            self._pools.append(torch.cuda.graph_pool_handle())

    def pool_stats(self) -> dict:
        """bytes: reserved in this backend's graph pools; the device-wide counters beside it."""
        pool_ids = {tuple(pool) for pool in self._pools}
        pool_bytes = sum(
            segment["total_size"] for segment in torch.cuda.memory_snapshot()
            if segment.get("device") == self.device.index and tuple(segment.get("segment_pool_id", ())) in pool_ids
        )
        stats = torch.cuda.memory_stats(self.device)
        return {
            "bytes": pool_bytes,
            "allocated_bytes": stats.get("allocated_bytes.all.current", 0),
            "reserved_bytes": stats.get("reserved_bytes.all.current", 0),
        }
