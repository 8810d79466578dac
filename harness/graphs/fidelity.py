"""The emulator's fidelity table: small graph-bug programs, each run on real CUDA graphs and on the
CPU emulator, with the verdict CUDA gives and why.

Every program is written once against a graph API `cg` (`torch.cuda` or `harness.graphs.emulator`)
and a device. It warms up eagerly, captures a step, then copies new inputs into the static buffers
(or does its bug instead), replays, and returns (what the graph gave, the same step run eagerly on
the new inputs). Verdicts: "error" (capture or replay raised), "wrong" (differs from eager),
"right". Rows whose `checked` is set also run through `make_backend(...).capture(static_inputs=)`,
whose address check should turn the silent wrong answer into StaleAddressError on both backends.

    python -m harness.graphs.fidelity --backend emulated|cuda --json PATH
    python -m harness.graphs.fidelity --compare EMULATED.json CUDA.json --markdown PATH
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from . import emulator, make_backend

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
_held: list = []  # tensors a program is done with, alive until its verdict: freed, their memory could go to a successor
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
    _held.append(step())  # held: a freed warm-up result could lend its values to the capture's memory
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
        _held.append(inputs[name])
        inputs[name] = inputs[name] + 1  # a new tensor at a new address, not copied into the old
        graph.replay(inputs)
        return graph.output, step()
    return program


@row(WRONG, "the graph reads the address captured; the tensor built for this step is never read",
     checked=_replacing("positions"))
def per_step_tensor(cg, device):
    meta = {"positions": torch.arange(4, device=device)}

    def new_positions():  # the old tensor is held: freed, its block could go to its successor
        _held.append(meta["positions"])
        meta["positions"] = torch.arange(4, device=device) + 10
    return _step(cg, device, lambda x: x * meta["positions"], new_positions)


@row(WRONG, "replay reads the buffer captured, not the one now bound to the name", checked=_replacing("x"))
def replaced_input(cg, device):
    static = {"x": _data(0, device)}
    step = lambda: static["x"] * 2 + 1  # noqa: E731
    graph, out = _capture(cg, step)
    _held.append(static["x"])
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
     "graph overwrites the second's output", emulator=RIGHT,
     differs="the emulator has no memory pool: every graph keeps its own intermediates alive")
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


def verdict(program, *args) -> dict:
    try:
        got, want = program(*args)
        same = torch.equal(got.cpu(), want.cpu())
    except Exception as error:  # the verdict is that it raised; the detail says what
        said = str(error.__context__ or error).strip().splitlines() or [""]
        return {"verdict": ERROR, "detail": f"{type(error).__name__}: {said[0][:200]}"}
    finally:
        _held.clear()
    return {"verdict": RIGHT if same else WRONG, "detail": ""}


def run(backend: str) -> dict:
    """Every row on one backend ("emulated" or "cuda")."""
    cg, device = (torch.cuda, "cuda") if backend == "cuda" else (emulator, "cpu")
    rows = {}
    for r in ROWS:
        result = _isolated(backend, lambda: verdict(r.program, cg, device))
        if r.checked:
            result["checked"] = _isolated(backend, lambda: verdict(r.checked, make_backend(backend, device), device))
        rows[r.name] = result
    name = torch.cuda.get_device_name() if backend == "cuda" else f"cpu ({platform.machine()})"
    return {"backend": backend, "torch": torch.__version__, "device": name, "rows": rows}


def _isolated(backend: str, call):
    if backend != "cuda":
        return call()
    # A failed torch.cuda.graph leaves its side stream current: restore the stream after each program.
    with torch.cuda.stream(torch.cuda.current_stream()):
        result = call()
    torch.cuda.synchronize()
    return result


def render(emulated: dict, cuda: dict) -> str:
    """Both columns side by side, agreement per row, and the reason wherever they differ."""
    def cell(result, key="verdict"):
        if key == "verdict":
            return result["verdict"] if result else "(not run)"
        return (result or {}).get(key, "")

    def agreement(r: Row | None, emu: str, gpu: str) -> str:
        if emu == gpu:
            return "yes"
        if r and r.emulator and (emu, gpu) == (r.emulator, r.cuda):
            return "no (known)"
        return "**NO (unexpected)**"

    known = {r.name: r for r in ROWS}
    names = list(known) + [n for n in {**emulated["rows"], **cuda["rows"]} if n not in known]
    lines = ["# The CPU graph emulator against real CUDA graphs", "",
             f"CUDA: torch {cuda['torch']} on {cuda['device']}; emulator: torch {emulated['torch']} on "
             f"{emulated['device']}. Rendered by `python -m harness.graphs.fidelity --compare`; the programs are "
             "in `harness/graphs/fidelity.py`.", "",
             "| bug | CUDA | emulator | agree | why (CUDA) | where the emulator differs |", "|---|---|---|---|---|---|"]
    disagreements = []
    for name in names:
        r, emu, gpu = known.get(name), emulated["rows"].get(name), cuda["rows"].get(name)
        agree = agreement(r, cell(emu), cell(gpu))
        expected = "" if r is None or cell(gpu) in (r.cuda, "(not run)") else f" (expected {r.cuda})"
        why = r.why if r else "(no longer in the table)"
        lines.append(f"| `{name}` | {cell(gpu)}{expected} | {cell(emu)} | {agree} | {why} | {r.differs if r else ''} |")
        if agree != "yes":
            disagreements.append(f"- `{name}`: CUDA said {cell(gpu)} ({cell(gpu, 'detail') or 'no error'}); "
                                 f"the emulator said {cell(emu)} ({cell(emu, 'detail') or 'no error'}).")
    lines += ["", "## Through `make_backend(...).capture(fn, static_inputs=...)`", "",
              "The same bugs with the replaced tensor named as a static input: the first replay checks its "
              "address, so both backends should raise StaleAddressError.", "",
              "| bug | CUDA | emulator | agree | what was raised |", "|---|---|---|---|---|"]
    for name in names:
        emu, gpu = (emulated["rows"].get(name) or {}).get("checked"), (cuda["rows"].get(name) or {}).get("checked")
        if emu or gpu:
            agree = "yes" if cell(emu) == cell(gpu) else "**NO (unexpected)**"
            raised = cell(gpu, "detail") if gpu else cell(emu, "detail")
            lines.append(f"| `{name}` | {cell(gpu)} | {cell(emu)} | {agree} | {raised.split(':')[0]} |")
    if disagreements:
        lines += ["", "## What each side said where they differ", ""] + disagreements
    return "\n".join(lines) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _load(parser, path: str, backend: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read {path}: {error}")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, dict) or data.get("backend") != backend or not all(
            isinstance(v, dict) and "verdict" in v for v in rows.values()):
        parser.error(f"{path} is not the JSON of a --backend {backend} run")
    return data


def main(argv=None) -> int:
    parser = _Parser(prog="python -m harness.graphs.fidelity", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--backend", choices=("emulated", "cuda"), help="run every row on this backend")
    what.add_argument("--compare", nargs=2, metavar=("EMULATED.json", "CUDA.json"), help="render two runs side by side")
    parser.add_argument("--json", metavar="PATH", help="with --backend: where the verdicts go (default: stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="with --compare: where the table goes (default: stdout)")
    args = parser.parse_args(argv)
    if args.backend and args.markdown or args.compare and args.json:
        parser.error("--json goes with --backend, --markdown with --compare")
    if args.backend == "cuda" and not torch.cuda.is_available():
        parser.error("--backend cuda needs a CUDA device, and none is available here")
    if args.backend:
        text = json.dumps(run(args.backend), indent=2) + "\n"
    else:
        text = render(_load(parser, args.compare[0], "emulated"), _load(parser, args.compare[1], "cuda"))
    target = args.json or args.markdown
    if not target:
        sys.stdout.write(text)
        return 0
    try:
        with open(target, "w") as f:
            f.write(text)
    except OSError as error:
        parser.error(f"cannot write {target}: {error}")
    return 0


if __name__ == "__main__":
    from harness.reliability import pipes

    sys.exit(pipes.run(main))  # quiet when the reader closes the pipe
