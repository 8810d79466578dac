"""CUDA graphs and their CPU emulator, as a public tool for engines and for the harness.

Two ways in:

- `harness.graphs.emulator` has `torch.cuda`'s graph API (`CUDAGraph`, `graph`,
  `graph_pool_handle`) on the CPU, so an engine's own graph code switches with one line
  (`cg = torch.cuda if on_gpu else emulator`) and its capture bugs (a host sync, a
  data-dependent shape, a device copy) raise `CaptureError` in CI without a GPU.
- `make_backend("emulated" | "cuda", device)` captures callables over named static inputs,
  shares one memory pool, closes the capture phase, and checks input addresses on a graph's
  first replay (`StaleAddressError`): the reference runtime's graphs.

Whatever graphs run, the harness counts captures and replays itself (`log.LOG`), and
`counting.count()` measures what one call submits. docs/emulator.md is the emulator's manual and
says where it differs from a GPU; `fidelity` is its table of graph bugs, run on both.
"""
from __future__ import annotations

import torch

from .base import CapturedGraph, CaptureError, FreedMemoryError, GraphBackend, StaleAddressError
from .cuda import CudaGraphBackend
from .emulated import EmulatedGraphBackend
from ..vocabulary import GRAPH_BACKENDS as BACKEND_NAMES


def make_backend(name: str, device: torch.device | str = "cpu", *, debug: bool = False,
                 watch_memory: bool = False) -> GraphBackend:
    """The backend called `name`; device is where the cuda backend captures (the emulator
    runs on whatever device the captured tensors live on). `watch_memory` (cuda; the emulator
    always does): a replay of a graph whose memory the program freed raises FreedMemoryError."""
    if name == "emulated":
        return EmulatedGraphBackend(debug=debug)
    if name == "cuda":
        return CudaGraphBackend(device, debug=debug, watch_memory=watch_memory)
    raise ValueError(f"unknown graph backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")


def device_for(graph_backend: str) -> str:
    """Where tensors live for a graph backend: CUDA graphs need the GPU, the emulator the CPU."""
    return "cuda" if graph_backend == "cuda" else "cpu"


__all__ = [
    "BACKEND_NAMES", "CaptureError", "CapturedGraph", "CudaGraphBackend", "EmulatedGraphBackend",
    "FreedMemoryError", "GraphBackend", "StaleAddressError", "device_for", "make_backend",
]
