"""The rows of the emulator's fidelity table (harness.graphs.fidelity): small graph-bug programs,
each with the verdict CUDA gives and why.

Every program is written once against a graph API `cg` (`torch.cuda` or `harness.graphs.emulator`)
and a device. It warms up eagerly, captures a step, then copies new inputs into the static buffers
(or does its bug instead), replays, and returns (what the graph gave, the same step run eagerly on
the new inputs). Rows whose `checked` is set also run through `make_backend(...).capture(static_inputs=)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

ERROR, WRONG, RIGHT = "error", "wrong", "right"


@dataclass(frozen=True)
class Row:
    name: str
    program: Callable  # (cg, device) -> (graph's result, eager result)
    cuda: str  # the verdict on real CUDA graphs
    why: str  # why CUDA gives it
    emulator: str | None = None  # the emulator's verdict, only where it cannot match CUDA
    differs: str = ""  # why it cannot
    checked: Callable | None = None  # (backend, device) -> ...: the bug through make_backend's address check

    @property
    def expected_emulated(self) -> str:
        return self.emulator or self.cuda


ROWS: list[Row] = []
HELD: list = []  # tensors a program is done with, alive until its verdict: freed, their memory could go to a successor
# Every graph, for the life of the process: a failed CUDA capture leaves the caching allocator
# holding a pointer to its graph object (torch ends the pool recording only on success).
_graphs: list = []


def row(cuda: str, why: str, *, emulator: str | None = None, differs: str = "", checked: Callable | None = None):
    def add(program):
        ROWS.append(Row(program.__name__.replace("_", "-"), program, cuda, why, emulator, differs, checked))
        return program
    return add


def _data(seed: int, device: str) -> torch.Tensor:
    return torch.randn(4, generator=torch.Generator().manual_seed(seed)).to(device)


def _capture(cg, step, pool=None):
    """Warm up eagerly, capture one call of step; the graph and the captured output."""
    HELD.append(step())  # held: a freed warm-up result could lend its values to the capture's memory
    graph = cg.CUDAGraph()
    _graphs.append(graph)
    with cg.graph(graph, pool=pool):
        out = step()
    return graph, out


def _step(cg, device, fn, between=lambda: None):
    """Capture fn(x), change what `between` changes, copy new data into x, replay; (graph output, eager)."""
    x = _data(0, device)
    graph, out = _capture(cg, lambda: fn(x))
    between()
    x.copy_(_data(1, device))
    graph.replay()
    return out, fn(x)


@row(RIGHT, "the step reads and writes its captured addresses; data copied into them is what replay sees")
def correct_usage(cg, device):
    return _step(cg, device, lambda x: torch.relu(x) * 2 + 1)


@row(ERROR, "`.item()` copies to the host and waits for the device: a sync, forbidden during capture")
def host_sync_item(cg, device):
    return _step(cg, device, lambda x: x * x.sum().item())


@row(ERROR, "`.tolist()` copies to the host and waits: a sync")
def host_sync_tolist(cg, device):
    return _step(cg, device, lambda x: x * sum(x.tolist()))


@row(ERROR, "`int(tensor)` is `.item()`: a sync")
def host_sync_int(cg, device):
    return _step(cg, device, lambda x: x * int(x.argmax()))


@row(ERROR, "`if tensor:` calls bool(), which reads the value on the host: a sync")
def branch_on_device_tensor(cg, device):
    return _step(cg, device, lambda x: x * 2 if x.sum() > 0 else x - 1)


@row(ERROR, "a boolean-mask index has a data-dependent shape: nonzero syncs to size its output")
def boolean_mask_index(cg, device):
    return _step(cg, device, lambda x: x[x > 0] * 2)


@row(ERROR, "nonzero syncs to size its output")
def nonzero(cg, device):
    return _step(cg, device, lambda x: torch.nonzero(x > 0))


@row(ERROR, "`.cpu()` copies device memory to the host and waits: a sync")
def copy_to_host(cg, device):
    return _step(cg, device, lambda x: (x * 2).cpu())


@row(ERROR, "torch.tensor(list, device=...) copies pageable host memory to the device with a sync")
def tensor_from_python_data(cg, device):
    batch = {"positions": [0, 1, 2, 3]}
    return _step(cg, device, lambda x: x * torch.tensor(batch["positions"], device=device),
                 lambda: batch.update(positions=[4, 5, 6, 7]))


@row(WRONG, "capture records the branch Python took then; replay cannot take the other")
def branch_on_python_value(cg, device):
    batch = {"greedy": True}
    return _step(cg, device, lambda x: x * 2 if batch["greedy"] else x - 1, lambda: batch.update(greedy=False))


@row(WRONG, "a Python int is baked into the kernel's arguments at capture; replay adds the old step number")
def python_step_counter(cg, device):
    state = {"step": 1}
    return _step(cg, device, lambda x: x + state["step"], lambda: state.update(step=2))


@row(WRONG, "a Python float is baked in at capture: replay scales by the old temperature")
def python_float_scale(cg, device):
    sampling = {"temperature": 0.7}
    return _step(cg, device, lambda x: x / sampling["temperature"], lambda: sampling.update(temperature=1.3))


def _replacing(name: str):
    """The bug through make_backend: `name` is a named static input, so the first replay checks it."""
    def program(backend, device):
        inputs = {"x": _data(0, device), "positions": torch.arange(4, device=device)}
        step = lambda: inputs["x"] * inputs["positions"]  # noqa: E731
        step()
        graph = backend.capture(step, static_inputs=dict(inputs), name=f"replacing-{name}")
        HELD.append(inputs[name])
        inputs[name] = inputs[name] + 1  # a new tensor at a new address, not copied into the old
        graph.replay(inputs)
        return graph.output, step()
    return program


@row(WRONG, "the graph reads the address captured; the tensor built for this step is never read",
     checked=_replacing("positions"))
def per_step_tensor(cg, device):
    meta = {"positions": torch.arange(4, device=device)}

    def new_positions():  # the old tensor is held: freed, its block could go to its successor
        HELD.append(meta["positions"])
        meta["positions"] = torch.arange(4, device=device) + 10
    return _step(cg, device, lambda x: x * meta["positions"], new_positions)


@row(WRONG, "replay reads the buffer captured, not the one now bound to the name", checked=_replacing("x"))
def replaced_input(cg, device):
    static = {"x": _data(0, device)}
    step = lambda: static["x"] * 2 + 1  # noqa: E731
    graph, out = _capture(cg, step)
    HELD.append(static["x"])
    static["x"] = _data(1, device)  # rebound, not copied into
    graph.replay()
    return out, step()


@row(WRONG, "replay writes its output in place: an output held from one step holds the next step's")
def output_held_across_replays(cg, device):
    x = _data(0, device)
    step = lambda: x * 2 + 1  # noqa: E731
    graph, out = _capture(cg, step)
    x.copy_(_data(1, device))
    graph.replay()
    held, want = out, step()  # the first step's result, kept without a clone
    x.copy_(_data(2, device))
    graph.replay()
    return held, want


@row(WRONG, "replay repeats the in-place write into the caller's buffer, clobbering what it left there")
def inplace_write_to_input(cg, device):
    scale_in_place = lambda t: t.mul_(2).add(1)  # noqa: E731
    x = _data(0, device)  # persistent: each step the caller rewrites only what changed
    graph, out = _capture(cg, lambda: scale_in_place(x))
    intended = _data(0, device)
    intended[0] = 5.0  # the step's input as the caller means it
    x[0] = 5.0  # only the changed element is written
    graph.replay()
    return out, scale_in_place(intended)


@row(RIGHT, "graph-safe RNG: every replay advances the philox offset, so it draws new numbers, as eager does")
def random_numbers(cg, device):
    x = torch.zeros(4, device=device)
    step = lambda: x + torch.rand_like(x)  # noqa: E731
    graph, out = _capture(cg, step)
    graph.replay()
    first = out.clone()
    graph.replay()
    return torch.tensor(torch.equal(first, out)), torch.tensor(torch.equal(step(), step()))


@row(WRONG, "`.item()` of a host tensor needs no device sync, so capture allows it and bakes the value in",
     emulator=ERROR, differs="on the CPU every tensor is a host tensor: the emulator takes any `.item()` for a sync")
def host_tensor_item(cg, device):
    scale = torch.tensor(2.0)  # kept on the host, e.g. a sampling setting
    return _step(cg, device, lambda x: x * scale.item(), lambda: scale.fill_(3.0))


@row(WRONG, "a 0-dim host tensor operand is read on the host at launch, like a Python number: baked in",
     emulator=RIGHT, differs="on the CPU the operand is an ordinary tensor, which the replayed op reads again")
def host_scalar_operand(cg, device):
    scale = torch.tensor(2.0)
    return _step(cg, device, lambda x: x * scale, lambda: scale.fill_(3.0))


@row(ERROR, "`.to(device)` of pageable host memory synchronises the stream",
     emulator=RIGHT, differs="on the CPU `.to('cpu')` copies nothing, and the replayed op reads the tensor again")
def host_tensor_to_device(cg, device):
    offsets = torch.zeros(4)
    return _step(cg, device, lambda x: x + offsets.to(device), lambda: offsets.fill_(1.0))


@row(RIGHT, "a non-blocking copy from pinned host memory is a memcpy node: each replay copies what the host "
     "buffer holds then (how the reference engine's FULL graphs take their inputs)")
def pinned_host_copy(cg, device):
    host = torch.zeros(4, pin_memory=torch.cuda.is_available())
    staging = torch.zeros(4, device=device)
    graph, out = _capture(cg, lambda: staging.copy_(host, non_blocking=True) * 2)
    host.copy_(_data(1, "cpu"))
    graph.replay()
    return out, host.to(device) * 2


@row(WRONG, "capture records kernels without running them: the output holds whatever its memory held")
def output_read_after_capture(cg, device):
    x = _data(7, device)
    step = lambda: x * 3 - 7  # noqa: E731
    _, out = _capture(cg, step)
    return out, step()  # the capture's output taken as the first step's result


@row(WRONG, "capture runs nothing, so state the step writes (a KV cache) is written only by a replay")
def state_written_during_capture(cg, device):
    x, cache = torch.zeros(4, device=device), torch.zeros(4, device=device)
    step = lambda: cache.add_(x * 2)  # noqa: E731
    step()  # warm-up on a dummy batch (zeros) writes nothing that matters
    x.copy_(_data(3, device))
    _graphs.append(cg.CUDAGraph())
    with cg.graph(_graphs[-1]):
        step()  # taken for the first live step
    return cache, torch.zeros(4, device=device).add_(x * 2)


@row(WRONG, "graphs sharing a pool reuse blocks the earlier capture freed: replayed out of order, the first "
     "graph overwrites the second's output")
def shared_pool_out_of_order(cg, device):
    x = _data(0, device)
    first, second = (lambda: (x * 2) + 1), (lambda: x * 3)  # first's x * 2 is freed after capture
    pool = cg.graph_pool_handle()
    graph_a, _ = _capture(cg, first, pool)
    graph_b, out_b = _capture(cg, second, pool)
    x.copy_(_data(1, device))
    graph_b.replay()
    graph_a.replay()  # captured first, replayed last
    return out_b, second()


@row(RIGHT, "replayed in the order they were captured, graphs sharing a pool each write their blocks before "
     "the next reads them: the output read last is the last graph's")
def shared_pool_in_capture_order(cg, device):
    x = _data(0, device)
    first, second = (lambda: (x * 2) + 1), (lambda: x * 3)
    pool = cg.graph_pool_handle()
    graph_a, _ = _capture(cg, first, pool)
    graph_b, out_b = _capture(cg, second, pool)
    x.copy_(_data(1, device))
    graph_a.replay()
    graph_b.replay()
    return out_b, second()


@row(RIGHT, "a block the program still holds is never handed to a later capture: the first graph's output, "
     "kept, survives the second graph's replays")
def shared_pool_output_kept(cg, device):
    x = _data(0, device)
    pool = cg.graph_pool_handle()
    graph_a, out_a = _capture(cg, lambda: x * 2, pool)  # out_a is held: its block stays the first graph's
    graph_b, _ = _capture(cg, lambda: (x * 3) * 5, pool)
    x.copy_(_data(1, device))
    graph_a.replay()
    graph_b.replay()
    return out_a, x * 2


@row(RIGHT, "a view the program made after the capture holds the output's memory as the output did: the next "
     "capture into the pool does not take it")
def shared_pool_view_kept(cg, device):
    x = _data(0, device)
    pool = cg.graph_pool_handle()
    graph_a, out_a = _capture(cg, lambda: x * 2, pool)
    view = out_a[1:]  # made outside the capture; the output itself is dropped
    del out_a
    graph_b, _ = _capture(cg, lambda: (x * 3) * 5, pool)
    x.copy_(_data(1, device))
    graph_a.replay()
    graph_b.replay()
    return view, (x * 2)[1:]


@row(RIGHT, "graphs in pools of their own share no memory: replayed in any order, no output is overwritten")
def private_pools_out_of_order(cg, device):
    x = _data(0, device)
    first, second = (lambda: (x * 2) + 1), (lambda: x * 3)
    graph_a, _ = _capture(cg, first)
    graph_b, out_b = _capture(cg, second)
    x.copy_(_data(1, device))
    graph_b.replay()
    graph_a.replay()
    return out_b, second()




_FREED = ("a CUDA graph keeps the addresses it captured, not the tensors: memory the program frees after the capture "
          "goes back to the caching allocator, the next allocation of its size gets it, and a replay reads what "
          "that tensor holds (TensorRT-LLM's shared attention workspace, reallocated after earlier graphs captured it)")
_RAISES = ("the emulator cannot hand host memory on: it keeps the memory and raises FreedMemoryError at the replay, "
           "naming the tensor and the capture")


def _scaled_by_a_table(cg, device, change):
    """A graph reads a table the program owns (x * table); after the capture `change` frees the table's
    memory (and returns what the step reads now), and a tensor of the same size, allocated next, fills it."""
    x, owner = _data(0, device), {"table": torch.full((4,), 3.0, device=device)}
    graph, out = _capture(cg, lambda: x * owner["table"])
    address = owner["table"].data_ptr()
    change(owner)
    for _ in range(256):  # allocate until a new tensor gets the freed memory (the allocator's choice)
        HELD.append(torch.full((4,), -1.0, device=device))
        if HELD[-1].data_ptr() == address:
            break
    x.copy_(_data(1, device))
    graph.replay()
    return out, x * owner["table"][:4]


def _grow(owner):
    owner["table"] = torch.cat([owner["table"], torch.full((4,), 3.0, device=owner["table"].device)])


@row(WRONG, _FREED, emulator=ERROR, differs=_RAISES)
def freed_after_capture(cg, device):
    return _scaled_by_a_table(cg, device, _grow)  # a bigger table replaces it: the old one is freed


@row(WRONG, "resizing a tensor in place past its storage reallocates it and frees the old memory, whose address the "
     "graph kept: " + _FREED.split(": ")[1], emulator=ERROR, differs=_RAISES)
def resized_after_capture(cg, device):
    def resize(owner):
        owner["table"].resize_(64 * 1024)  # past what its block holds: new memory; the old is freed
        owner["table"][4:] = 3.0
    return _scaled_by_a_table(cg, device, resize)


@row(RIGHT, "memory is freed only when the program holds no tensor of it: a view it kept holds the table alive "
     "at its address, so no later allocation takes it")
def freed_tensor_view_kept(cg, device):
    kept = []

    def keep_a_view(owner):
        kept.append(owner["table"][1:])  # a view of the table's memory
        owner["table"] = owner["table"].clone()  # the name now holds a copy; the view keeps the old memory
    return _scaled_by_a_table(cg, device, keep_a_view)
