"""A CPU emulation of CUDA graphs, shaped like `torch.cuda`'s API, so an engine's graph code runs
in CI without a GPU and its capture bugs show there:

    cg = torch.cuda if on_gpu else harness.graphs.emulator   # the one line that differs
    g = cg.CUDAGraph()
    with cg.graph(g):
        static_out = step(static_in)
    static_in.copy_(new_data)
    g.replay()                                               # static_out now holds the result

Capture runs the code once while recording every aten op it dispatches. Replay re-runs the
recorded ops in order on the SAME memory (aliases of the program's tensors) and copies each fresh
result into the tensor recorded at capture, so static buffers, intermediates and outputs keep their addresses. As with
a real graph, Python control flow and Python scalars are frozen at capture, a replaced input
buffer is never read, and metadata not copied into its buffer is stale.

What a capture allocates lives in a memory pool, the graph's own or one it shares with other
graphs (`pool=`), and a block the program drops is reused by later allocations of that pool, as
CUDA's caching allocator does (harness.graphs.pool): graphs sharing a pool replayed out of capture
order overwrite each other's outputs as on a GPU.

Memory the capture did not allocate stays the program's, as on CUDA: a replay after the program
freed or moved it raises FreedMemoryError naming the tensor and the capture (harness.graphs.held).

A CUDA capture records kernels without running them, so when the capture ends the emulator
undoes what running them did: tensors that existed before the capture get back the data they
had (a KV cache written by the captured step is as it was), and tensors the capture allocated
(its outputs included) are filled with NaN (zero for integers), standing for the uninitialised
memory a real capture leaves there until the first replay.

num_ops counts the ops a replay executes: aten ops after CompositeImplicitAutograd
decomposition (so inference_mode and no_grad count alike), excluding views and aliases,
metadata-only ops (detach_) and uninitialised allocations (empty*), none of which launches a
kernel in a CUDA graph.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from . import modes
from . import pool as pools
from .held import Outside
from .base import CapturedGraph, CaptureError, GraphBackend, InputAddress
from .log import LOG

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
# `.cpu()` of a CPU tensor dispatches nothing either; in code written for a GPU it is a device-to-host copy.
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.cpu}


def _same_device(a: torch.device, b: torch.device | None) -> bool:
    # None means "unchanged"; "cuda" and "cuda:0" name the same device.
    return b is None or (a.type == b.type and None in (a.index, b.index)) or a == b


def _map_leaves(tree, fn):
    """The same nesting of tuples, lists and dicts, each leaf replaced by fn(leaf)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind([_map_leaves(item, fn) for item in tree])
    if kind is dict:
        return {key: _map_leaves(item, fn) for key, item in tree.items()}
    return fn(tree)


def _leaves(tree) -> list:
    """The leaves of nested tuples, lists and dicts, in order: all an aten op's arguments and
    outputs hold (torch's pytree handles any container, at several times the cost per op)."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def _is_composite(func) -> bool:
    """Whether the op has a C++ CompositeImplicitAutograd kernel: the decomposition an eager run
    dispatches, and so a CUDA capture records."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)


@functools.lru_cache(maxsize=None)
def _reason_by_kind(func) -> str | None:
    """What makes an op uncapturable whatever its arguments (its tags), else None."""
    if torch.Tag.data_dependent_output in func.tags:
        return "reads a tensor's value on the CPU" + _FORBIDDEN
    if torch.Tag.dynamic_output_shape in func.tags:
        return "has a data-dependent output shape" + _FORBIDDEN
    if func is not aten.detach_.default and (torch.Tag.inplace_view in func.tags or func in _METADATA_MUTATIONS):
        # Earlier recorded ops hold this tensor; replaying them after its shape changed is wrong.
        return "changes a tensor's shape or storage in place, which the emulator cannot replay; use the out-of-place op"
    return None


# The ops _forbidden_reason decides by their arguments; any other op is decided by its kind alone.
_ARGUMENT_CHECKED = _INDEX_OPS | {aten.lift_fresh.default, aten._to_copy.default, aten.copy_.default}


def _forbidden_reason(func, args, kwargs) -> str | None:
    """Why CUDA capture would reject this op (or the emulator could not replay it), else None."""
    if func in _INDEX_OPS:
        masks = [i for i in args[1] if i is not None and i.dtype in (torch.bool, torch.uint8)]
        return "indexes with a boolean mask (data-dependent shape)" + _FORBIDDEN if masks else None
    if func is aten.lift_fresh.default:
        # torch.tensor(python_data, device=...) on a GPU is a host-to-device copy that syncs.
        return ("builds a tensor from Python data (torch.tensor): on a GPU that is a host-to-device copy"
                + _FORBIDDEN + "; build it before capture and copy it into a static buffer")
    if func is aten._to_copy.default and not _same_device(args[0].device, kwargs.get("device")):
        return f"copies a tensor from {args[0].device} to {kwargs['device']}; device copies are forbidden during capture"
    if func is aten.copy_.default and not _same_device(args[0].device, args[1].device):
        return f"copies a tensor from {args[1].device} to {args[0].device}; device copies are forbidden during capture"
    return _reason_by_kind(func)


class _Op:
    """What the recorder needs to know of an op, whatever its arguments: looked up once per op kind."""

    __slots__ = ("composite", "checked", "written", "mutable", "aliases_only", "replayed")

    def __init__(self, func):
        self.composite = _is_composite(func)
        self.checked = func in _ARGUMENT_CHECKED or _reason_by_kind(func) is not None  # may be refused
        self.written = _written_arguments(func)
        self.mutable = func._schema.is_mutable  # in-place and out= ops do work though they allocate nothing
        # A view's outputs share its input's memory: it allocates nothing.
        self.aliases_only = func.is_view
        # Whether a replay runs it: views, in-place views and uninitialised allocations launch nothing.
        self.replayed = not (func.is_view or torch.Tag.inplace_view in func.tags or func in _UNINITIALISED)


_OPS: dict[Any, _Op] = {}


def _op(func) -> _Op:
    op = _OPS.get(func)
    if op is None:
        op = _OPS[func] = _Op(func)
    return op


def _written_arguments(func) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument the op writes into (in-place and out=); none for a functional op."""
    if not func._schema.is_mutable:
        return ()
    return tuple((index, argument.name) for index, argument in enumerate(func._schema.arguments)
                 if argument.alias_info is not None and argument.alias_info.is_write)


def _written(arguments: tuple[tuple[int, str], ...], args, kwargs) -> list[torch.Tensor]:
    """The tensors an op writes into: its `arguments` (_written_arguments) as passed in this call."""
    written = []
    for index, name in arguments:
        value = args[index] if index < len(args) else kwargs.get(name)
        written += [t for t in _leaves(value) if isinstance(t, torch.Tensor)]
    return written


def _returns_its_input(func, args, kwargs) -> bool:
    """x.to(x's own dtype): the op's decomposition returns x itself and dispatches nothing (a no-op a
    model's code runs many times a step, which need not pay for entering the mode again)."""
    if func is not aten.to.dtype or len(args) < 2 or args[1] != args[0].dtype:
        return False
    copy = args[3] if len(args) > 3 else kwargs.get("copy", False)
    memory_format = args[4] if len(args) > 4 else kwargs.get("memory_format")
    return not copy and memory_format in (None, torch.preserve_format)


class _RecordingMode(modes.HarnessMode):
    """Executes every aten op normally and records (func, args, kwargs, output, fresh outputs).

    What an op allocates is moved into the capture's memory pool (harness.graphs.pool), and the
    op is recorded over aliases of pool memory, never over the program's own tensor objects, so
    that a tensor the program drops frees its block as it would on CUDA. Before an op writes into
    a storage that existed before the capture, a copy of that storage is kept, so the capture can
    be undone (see CUDAGraph.capture_end).
    """

    def __init__(self, graph_name: str, pool: pools.Pool):
        super().__init__()
        self.graph_name = graph_name
        self.pool = pool
        self.new_bytes = 0  # bytes of the blocks this capture added to its pool
        # What a replay runs, in order: (func, args, kwargs, copy_into), see _step.
        self.steps: list[tuple] = []
        self.fresh: list[torch.Tensor] = []  # what the capture allocated, as recorded (for undo)
        self.allocated: set[int] = set()  # storages this capture allocated, by data_ptr
        self.saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}  # data_ptr -> (storage, before)
        # id of a tensor the program passed -> (weakref to it, the alias recorded in its place)
        self._aliases: dict[int, tuple[Any, torch.Tensor]] = {}
        self.outside = Outside(graph_name)  # memory the graph uses that the program owns (held.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _op(func)
        # Under inference_mode composite ops reach us undecomposed; their C++ kernel decomposes them
        # with this mode active, so the recorded ops (and hidden syncs) are an eager run's, as under
        # no_grad. Not func.decompose(): it prefers a Python decomposition torch keeps for tracing,
        # whose ops can differ (a vector times a batch of matrices: clone and mv, not bmm).
        if op.composite:
            if _returns_its_input(func, args, kwargs):
                return args[0]
            with self:
                return func._op_dk(_COMPOSITE, *args, **kwargs)
        if op.checked and (reason := _forbidden_reason(func, args, kwargs)):
            raise CaptureError(f"graph {self.graph_name!r}: {func} {reason}")
        for tensor in _written(op.written, args, kwargs):
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in self.allocated and key not in self.saved and storage.nbytes():
                self.saved[key] = (storage, storage.clone())
        output = func(*args, **kwargs)
        outputs = [output] if type(output) is torch.Tensor else _leaves(output)
        fresh = [] if op.aliases_only else _fresh_outputs(args, kwargs, outputs)
        with torch._C._DisableTorchDispatch():
            self._place(fresh)
            self._watch(outputs, fresh)
            fresh = [(index, self._recorded(func, tensor)) for index, tensor in fresh]
            self.fresh += [tensor for _, tensor in fresh]
            if op.replayed and (fresh or op.mutable):
                self.steps.append(self._step(func, args, kwargs, output, fresh))
        return output

    def _step(self, func, args, kwargs, output, fresh) -> tuple:
        """(func, args, kwargs, copy_into) over recorded tensors, for an op a replay runs.

        copy_into is the recorded output tensor (single-output op), a tuple of (leaf index, recorded
        tensor) (multi-output op), or None when every output aliases an input (in-place, out=).
        """
        recorded = functools.partial(self._recorded, func)
        args, kwargs = _map_leaves(args, recorded), _map_leaves(kwargs, recorded) if kwargs else {}
        if not fresh:
            return func, args, kwargs, None
        if isinstance(output, torch.Tensor):
            return func, args, kwargs, self._recorded(func, output)
        return func, args, kwargs, tuple(fresh)

    def _place(self, fresh) -> None:
        """Move each storage the op allocated into a block of the pool (a freed one where one fits)."""
        moved: dict[int, pools.Block] = {}
        for _, tensor in fresh:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if not storage.nbytes():
                continue  # holds nothing: no block
            block = moved.get(key)
            if block is None:
                block, reused = self.pool.allocate(storage)
                moved[key] = block
                self.new_bytes += 0 if reused else block.nbytes
                self.allocated.add(block.address)
            if block.address != key:
                pools.move(tensor, block)
            block.use(tensor)  # in use from now: the op's other outputs take other blocks

    @staticmethod
    def _watch(outputs: list, fresh) -> None:
        """Each tensor the op hands the program that lies in pool memory keeps its block in use
        (those it allocated already do: _place)."""
        placed = {id(tensor) for _, tensor in fresh}
        for leaf in outputs:
            if isinstance(leaf, torch.Tensor) and id(leaf) not in placed and (block := pools.block_of(leaf)) is not None:
                block.use(leaf)

    def _recorded(self, func, leaf):
        """What an op (`func`) is recorded over: an alias of each of the program's tensors, which
        refers to its memory without keeping the program's object alive. Memory outside the pools
        is the program's to free, as on CUDA: the graph watches it (held.py) rather than owns it."""
        if not isinstance(leaf, torch.Tensor):
            return leaf
        known = self._aliases.get(id(leaf))
        if known is None or known[0]() is not leaf:
            block = pools.block_of(leaf)
            if block is not None:
                recorded = pools.alias(leaf, block)
            else:
                recorded = leaf.detach()
                self.outside.note(leaf, func)
            known = self._aliases[id(leaf)] = (weakref.ref(leaf), recorded)
        return known[1]

    def undo(self) -> None:
        """Leave memory as a CUDA capture, which runs nothing, would: storages that existed
        before get their old data back, and what the capture allocated holds no result."""
        for storage, before in self.saved.values():
            storage.copy_(before)
        for tensor in self.fresh:
            tensor.fill_(float("nan") if tensor.is_floating_point() or tensor.is_complex() else 0)


class _HostReadGuard(TorchFunctionMode):
    def __init__(self, graph_name: str):
        super().__init__()
        self.graph_name = graph_name

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            raise CaptureError(f"graph {self.graph_name!r}: Tensor.{func.__name__} reads tensor data on the CPU{_FORBIDDEN}")
        return func(*args, **(kwargs or {}))


def _fresh_outputs(args, kwargs, outputs: list) -> list[tuple[int, torch.Tensor]]:
    """(leaf index, tensor) for each output leaf (`outputs`: the output's leaves) that the op
    allocated rather than aliased."""
    tensors = [(i, t) for i, t in enumerate(outputs) if isinstance(t, torch.Tensor)]
    if not tensors:
        return []
    inputs = _leaves(args) + _leaves(kwargs) if kwargs else _leaves(args)
    input_storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    return [(i, t) for i, t in tensors if t.untyped_storage().data_ptr() not in input_storages]


class CUDAGraph:
    """An emulated `torch.cuda.CUDAGraph`: capture with `graph(g)`, then `replay()`.

    `name` (an extension) appears in capture errors; `num_ops` is what one replay runs and
    `held_bytes` what its intermediates hold (a real graph keeps them in its memory pool).
    """

    def __init__(self, keep_graph: bool = False, name: str = ""):
        self.name = name
        self.num_ops = 0
        self.held_bytes = 0  # bytes of pool memory this graph's capture added
        self._steps: list[tuple] | None = None
        self._outside: Outside | None = None  # the program's memory it uses, checked before each replay
        self._modes: tuple | None = None
        self._pool: pools.Pool | None = None  # kept while the graph lives, as CUDA keeps its pool

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self._modes is not None:
            raise CaptureError(f"graph {self.name!r}: capture_begin inside its own capture")
        if self._steps is not None:
            raise CaptureError(f"graph {self.name!r} is already captured; reset() it or make a new one")
        self._pool = pools.pool_for(pool)
        self._modes = (_HostReadGuard(self.name), modes.make(_RecordingMode, self.name, self._pool))
        for mode in self._modes:
            mode.__enter__()

    def capture_end(self, failed: bool = False) -> None:
        guard, recorder = self._modes
        self._modes = None
        recorder.__exit__(None, None, None)
        guard.__exit__(None, None, None)
        # The undo is the emulator's bookkeeping: no autograd history, and invisible to op counters.
        with torch.inference_mode(), torch._C._DisableTorchDispatch():
            recorder.undo()
        if failed:
            return
        self._steps, self.num_ops, self.held_bytes = recorder.steps, len(recorder.steps), recorder.new_bytes
        self._outside = recorder.outside
        LOG.captures += 1
        LOG.held_bytes += self.held_bytes

    def replay(self) -> None:
        if self._steps is None:
            raise RuntimeError(f"graph {self.name!r}: replay() before a capture")
        self._outside.check()  # FreedMemoryError where the program freed memory the graph uses
        # Replay never builds autograd state, whatever mode the caller is in. It is one opaque
        # submission, as a CUDA graph is to a profiler: dispatch modes outside (an op counter,
        # say) do not see the ops inside; the graph log counts them instead.
        with torch.inference_mode(), torch._C._DisableTorchDispatch():
            for func, args, kwargs, copy_into in self._steps:
                result = func(*args, **kwargs)
                if copy_into is None:
                    continue
                if type(copy_into) is tuple:
                    leaves = _leaves(result)
                    for index, recorded in copy_into:
                        recorded.copy_(leaves[index])
                else:
                    copy_into.copy_(result)
        LOG.replays += 1
        LOG.ops_in_replays += self.num_ops

    def reset(self) -> None:
        self._steps, self._outside, self.num_ops, self.held_bytes = None, None, 0, 0

    def pool(self) -> tuple[int, int]:
        """The handle of this graph's memory pool, to capture another graph into it (pool=)."""
        if self._pool is None:
            raise RuntimeError(f"graph {self.name!r}: pool() before a capture")
        return self._pool.handle


class graph:
    """The emulated `torch.cuda.graph` context manager: records the block into `cuda_graph`,
    allocating from `pool` (a graph_pool_handle() or another graph's pool()) or a private pool.

    `stream` and `capture_error_mode` are accepted for the same call to work on both; the
    emulator has no streams.
    """

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        self.cuda_graph = cuda_graph
        self.pool = pool

    def __enter__(self) -> None:
        self.cuda_graph.capture_begin(pool=self.pool)

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.cuda_graph.capture_end(failed=exc_type is not None)


def graph_pool_handle() -> tuple[int, int]:
    """A new memory pool for graphs to share (pass it as graph(..., pool=))."""
    return pools.new_handle()


class EmulatedGraph(CapturedGraph):
    def __init__(self, backend, name, output, input_addresses, graph: CUDAGraph):
        super().__init__(backend, name, output, input_addresses)
        self._graph = graph
        self.num_ops = graph.num_ops

    def _launch(self) -> None:
        self._graph.replay()


class EmulatedGraphBackend(GraphBackend):
    name = "emulated"

    def __init__(self, debug: bool = False):
        super().__init__(debug)
        self._graphs: list[CUDAGraph] = []
        self._pool = graph_pool_handle()  # one pool for every graph, as the CUDA backend shares one

    def _capture(self, fn: Callable[[], Any], name: str, input_addresses: dict[str, InputAddress]) -> EmulatedGraph:
        recorded = CUDAGraph(name=name)
        with graph(recorded, pool=self._pool):
            output = fn()
        self._graphs.append(recorded)
        return EmulatedGraph(self, name, output, input_addresses, recorded)

    def pool_stats(self) -> dict:
        return {"bytes": sum(g.held_bytes for g in self._graphs)}  # what each capture added to the shared pool
