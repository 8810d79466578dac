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

import torch

from . import emulator, make_backend
from .fidelity_rows import ERROR, HELD, RIGHT, ROWS, WRONG, Row  # noqa: F401 (RIGHT, WRONG: re-exported)


def verdict(program, *args) -> dict:
    try:
        got, want = program(*args)
        same = torch.equal(got.cpu(), want.cpu())
    except Exception as error:  # the verdict is that it raised; the detail says what
        said = str(error.__context__ or error).strip().splitlines() or [""]
        return {"verdict": ERROR, "detail": f"{type(error).__name__}: {said[0][:200]}"}
    finally:
        HELD.clear()
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
