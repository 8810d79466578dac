"""A CPU emulation of CUDA graphs, so CI without a GPU runs every correctness suite.

Capture runs the callable once while recording every aten op it dispatches. Replay re-runs the
recorded ops in order on the SAME tensor objects and copies each fresh result into the tensor
recorded at capture, so static buffers, intermediates and outputs keep their addresses. As with
a real graph, Python control flow and Python scalars are frozen at capture, a replaced input
buffer is never read, and metadata not copied into its buffer is stale.

num_ops counts the ops a replay executes: aten ops after CompositeImplicitAutograd
decomposition (so inference_mode and no_grad count alike), excluding views and aliases,
metadata-only ops (detach_) and uninitialised allocations (empty*), none of which launches a
kernel in a CUDA graph.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .base import CapturedGraph, CaptureError, GraphBackend, InputAddress

aten = torch.ops.aten

_FORBIDDEN = "; CPU synchronisation and data-dependent shapes are forbidden during graph capture"
# Allocations with no kernel behind them: a real graph leaves their memory as it was.
_UNINITIALISED = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                  aten.new_empty.default, aten.new_empty_strided.default}
# Tagged dynamic_output_shape for boolean masks only; integer indices have static shapes.
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_METADATA_MUTATIONS = {aten.resize_.default, aten.resize_as_.default, aten.set_.source_Tensor,
                       aten.set_.source_Storage, aten.set_.source_Storage_storage_offset, aten.set_.default}
# Reach the CPU without dispatching an aten op on CPU tensors, so only a function mode sees them.
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}


def _same_device(a: torch.device, b: torch.device | None) -> bool:
    # None means "unchanged"; "cuda" and "cuda:0" name the same device.
    return b is None or (a.type == b.type and None in (a.index, b.index)) or a == b


def _forbidden_reason(func, args, kwargs) -> str | None:
    """Why CUDA capture would reject this op (or the emulator could not replay it), else None."""
    if func in _INDEX_OPS:
        masks = [i for i in args[1] if i is not None and i.dtype in (torch.bool, torch.uint8)]
        return "indexes with a boolean mask (data-dependent shape)" + _FORBIDDEN if masks else None
    if torch.Tag.data_dependent_output in func.tags:
        return "reads a tensor's value on the CPU" + _FORBIDDEN
    if torch.Tag.dynamic_output_shape in func.tags:
        return "has a data-dependent output shape" + _FORBIDDEN
    if func is aten._to_copy.default and not _same_device(args[0].device, kwargs.get("device")):
        return f"copies a tensor from {args[0].device} to {kwargs['device']}; device copies are forbidden during capture"
    if func is aten.copy_.default and not _same_device(args[0].device, args[1].device):
        return f"copies a tensor from {args[1].device} to {args[0].device}; device copies are forbidden during capture"
    if func is not aten.detach_.default and (torch.Tag.inplace_view in func.tags or func in _METADATA_MUTATIONS):
        # Earlier recorded ops hold this tensor; replaying them after its shape changed is wrong.
        return "changes a tensor's shape or storage in place, which the emulator cannot replay; use the out-of-place op"
    return None


class _RecordingMode(TorchDispatchMode):
    """Executes every aten op normally and records (func, args, kwargs, output)."""

    def __init__(self, graph_name: str):
        super().__init__()
        self.graph_name = graph_name
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Under inference_mode composite ops reach us undecomposed; decompose them with this
        # mode active so the recorded ops (and hidden syncs) are the same as under no_grad.
        with self:
            decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            return decomposed
        reason = _forbidden_reason(func, args, kwargs)
        if reason:
            raise CaptureError(f"graph {self.graph_name!r}: {func} {reason}")
        output = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, output))
        return output


class _HostReadGuard(TorchFunctionMode):
    def __init__(self, graph_name: str):
        super().__init__()
        self.graph_name = graph_name

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            raise CaptureError(f"graph {self.graph_name!r}: Tensor.{func.__name__} reads tensor data on the CPU{_FORBIDDEN}")
        return func(*args, **(kwargs or {}))


def _fresh_outputs(args, kwargs, output) -> list[tuple[int, torch.Tensor]]:
    """(leaf index, tensor) for each output leaf that the op allocated rather than aliased."""
    input_storages = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    return [(i, t) for i, t in enumerate(tree_leaves(output))
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in input_storages]


def _replay_step(func, args, kwargs, output, fresh) -> tuple | None:
    """(func, args, kwargs, copy_into) for an op that does work at replay, else None.

    copy_into is the recorded output tensor (single-output op), a tuple of (leaf index, recorded
    tensor) (multi-output op), or None when every output aliases an input (in-place, out=).
    """
    if func.is_view or torch.Tag.inplace_view in func.tags or func in _UNINITIALISED:
        return None
    if not fresh:
        # In-place and out= ops still do work; a pure alias (_unsafe_view) already sees the data.
        return (func, args, kwargs, None) if func._schema.is_mutable else None
    if isinstance(output, torch.Tensor):
        return (func, args, kwargs, output)
    return (func, args, kwargs, tuple(fresh))


class EmulatedGraph(CapturedGraph):
    def __init__(self, backend, name, output, input_addresses, steps: list[tuple]):
        super().__init__(backend, name, output, input_addresses)
        self._steps = steps
        self.num_ops = len(steps)

    def _launch(self) -> None:
        # Replay never builds autograd state, whatever mode the caller is in. It is one opaque
        # submission, as a CUDA graph is to a profiler: dispatch modes outside (an op counter
        # in the harness, say) do not see the ops inside.
        with torch.inference_mode(), torch._C._DisableTorchDispatch():
            for func, args, kwargs, copy_into in self._steps:
                result = func(*args, **kwargs)
                if copy_into is None:
                    continue
                if type(copy_into) is tuple:
                    leaves = tree_leaves(result)
                    for index, recorded in copy_into:
                        recorded.copy_(leaves[index])
                else:
                    copy_into.copy_(result)


class EmulatedGraphBackend(GraphBackend):
    name = "emulated"

    def __init__(self, debug: bool = False):
        super().__init__(debug)
        self._allocated_bytes = 0

    def _capture(self, fn: Callable[[], Any], name: str, input_addresses: dict[str, InputAddress]) -> EmulatedGraph:
        recorder = _RecordingMode(name)
        with _HostReadGuard(name), recorder:
            output = fn()
        steps = []
        for func, args, kwargs, op_output in recorder.ops:
            fresh = _fresh_outputs(args, kwargs, op_output)
            self._allocated_bytes += sum(t.untyped_storage().nbytes() for _, t in fresh)
            if (step := _replay_step(func, args, kwargs, op_output, fresh)) is not None:
                steps.append(step)
        return EmulatedGraph(self, name, output, input_addresses, steps)

    def pool_stats(self) -> dict:
        # Every graph keeps its own intermediates alive; unlike the CUDA pool, nothing is shared.
        return {"bytes": self._allocated_bytes}
