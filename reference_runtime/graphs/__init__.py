"""Graph backends behind one interface: real CUDA graphs, and a CPU emulator for CI (SPEC 6)."""
from __future__ import annotations

import torch

from .base import CapturedGraph, CaptureError, GraphBackend, StaleAddressError
from .cuda import CudaGraphBackend
from .emulated import EmulatedGraphBackend

BACKEND_NAMES = ("cuda", "emulated")


def make_backend(name: str, device: torch.device | str = "cpu", *, debug: bool = False) -> GraphBackend:
    """The backend called `name`; device is where the cuda backend captures (the emulator
    runs on whatever device the captured tensors live on)."""
    if name == "emulated":
        return EmulatedGraphBackend(debug=debug)
    if name == "cuda":
        return CudaGraphBackend(device, debug=debug)
    raise ValueError(f"unknown graph backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")


__all__ = [
    "BACKEND_NAMES", "CaptureError", "CapturedGraph", "CudaGraphBackend", "EmulatedGraphBackend",
    "GraphBackend", "StaleAddressError", "make_backend",
]
