"""Memory a graph uses but did not allocate, held as CUDA holds it: not at all.

A CUDA graph keeps raw addresses. Memory it did not allocate during its capture (weights, caches,
static buffers, a workspace) stays the program's: when the program frees it (drops its last
tensor, resizes it, points it elsewhere with `set_`), the caching allocator hands it to the next
allocation, and every replay reads and writes whatever lives there now. TensorRT-LLM shipped this:
a shared attention workspace resized during capture left the graphs captured before pointing at
the freed buffer.

The emulator cannot hand host memory on, so it keeps the memory and watches it instead: each
storage is recorded with the address it had, and a replay first checks that the program still
holds every one at that address, else raises FreedMemoryError naming the tensor (its dtype, shape
and memory) and the capture (the graph, the op, and the program's line that used it, quoted).
The CUDA backend does the same in its debug mode (`make_backend("cuda", watch_memory=True)`).
"""
from __future__ import annotations

import linecache
import os
import sys
import weakref

import torch

from .base import FreedMemoryError
from .modes import HarnessMode

# How many references a storage has (tensors and storage objects); private in torch, so optional.
_use_count = getattr(torch._C, "_storage_Use_Count", None)
# storage (its C++ object's address, which outlives a resize) -> [its storage, the references the
# harness's own objects hold to it, the graphs watching it], over every live graph: the program
# holds the storage while it has more references than the harness.
# One storage object per storage, since torch hands out one Python object per storage while it lives.
_HELD: dict[int, list] = {}
_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(__file__)
_EMULATOR = {os.path.join(_HERE, f"{name}.py") for name in ("held", "emulated", "emulator", "modes", "pool", "cuda", "base")}


class Outside:
    """The storages one capture used that it did not allocate, each with how the emulator's own
    tensors refer to it, and a description for the error."""

    def __init__(self, graph_name: str):
        self.graph_name = graph_name
        self.storages: dict[int, list] = {}  # storage key (_HELD) -> [data_ptr, nbytes, own references, description]
        weakref.finalize(self, _release, self.storages)

    def note(self, tensor: torch.Tensor, op, own_references: int = 1) -> None:
        """`tensor` (not pool memory) is used by `op`; `own_references`: tensors of the recorder's
        own that now refer to its storage too (an alias it records instead of the program's object)."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if not storage.nbytes():
            return
        entry = self.storages.get(key)
        if entry is None:
            self.storages[key] = [storage.data_ptr(), storage.nbytes(), own_references, _describe(tensor, op)]
        else:
            entry[2] += own_references
        held = _HELD.get(key)
        if held is None:
            held = _HELD[key] = [storage, 1, 0]  # the storage object is a reference too
        held[1] += own_references
        held[2] += entry is None

    def check(self) -> None:
        """Raise FreedMemoryError if the program freed or moved a storage since the capture."""
        for key, (address, nbytes, _, description) in self.storages.items():
            storage, own, _ = _HELD[key]
            if storage.data_ptr() != address or storage.nbytes() != nbytes:
                what = f"was resized or moved after the capture (now at {storage.data_ptr():#x}, {storage.nbytes()} bytes)"
            elif _use_count is not None and _use_count(storage._cdata) <= own:
                what = "was freed after the capture (the program holds no tensor of it)"
            else:
                continue
            raise FreedMemoryError(
                f"graph {self.graph_name or '(unnamed)'!r}: {description} {what}; a CUDA graph keeps the "
                f"address, so its replay would read and write memory the caching allocator has handed to "
                f"another tensor. Keep every tensor a graph uses alive, at its address, for the graph's "
                f"life (grow a shared workspace before capture, never during or after it)")


def _release(storages: dict[int, list]) -> None:
    """A graph is gone, and with it the references its recorded ops held."""
    for key, entry in storages.items():
        held = _HELD.get(key)
        if held is None:
            continue
        held[1] -= entry[2]
        held[2] -= 1
        if not held[2]:
            del _HELD[key]


def _describe(tensor: torch.Tensor, op) -> str:
    """The tensor (its shape, dtype and memory) and where the capture used it: the op, and the line of
    the program that ran it, quoted (its source names the tensor; the frame's locals are not read,
    which on older Pythons would keep them alive)."""
    what = f"a tensor ({str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}, memory at {tensor.untyped_storage().data_ptr():#x})"
    frame = _caller()
    if frame is None:
        return f"{what} used by {op}"
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return (f"{what} used by {op} at {os.path.relpath(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
            + (f" (`{line}`)" if line else ""))


def _caller():
    """The innermost frame of the program, outside torch and the harness's graph code."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH) or frame.f_code.co_filename in _EMULATOR):
        frame = frame.f_back
    return frame


class Watcher(HarnessMode):
    """A dispatch mode that notes, into `outside`, every tensor an op uses that the capture did not
    allocate (the CUDA backend's debug mode: it records nothing, it only watches)."""

    def __init__(self, outside: Outside):
        super().__init__()
        self.outside = outside
        self.allocated: set[int] = set()  # storages the capture's own ops made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors(args) + _tensors(kwargs)
        output = func(*args, **kwargs)
        used = {t.untyped_storage()._cdata for t in inputs}
        for tensor in inputs:
            if tensor.untyped_storage()._cdata not in self.allocated:
                self.outside.note(tensor, func, own_references=0)
        self.allocated |= {t.untyped_storage()._cdata for t in _tensors(output)} - used
        return output


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []
