"""The emulator's fidelity table (harness/graphs/fidelity.py): every graph-bug program gives, on the
CPU emulator, the verdict the row expects of real CUDA graphs (or, where a row says the emulator
cannot match, the verdict the row says it gives); the committed H200 results agree; the command
writes and renders both columns; a broken emulator is caught by the table.

Expected verdicts come from the rows (written from what CUDA does, each with its reason) and from
the committed GPU run, never from the emulator under test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.graphs import base, emulated, emulator, held, make_backend, pool
from harness.graphs.fidelity import ERROR, ROWS, main, render, run, verdict

GPU_RESULTS = Path(__file__).resolve().parents[1] / "reports" / "h200" / "emulator_fidelity.json"
CHECKED = [r for r in ROWS if r.checked]


def ids(rows):
    return [r.name for r in rows]


@pytest.mark.parametrize("row", ROWS, ids=ids(ROWS))
def test_emulator_gives_the_cuda_verdict(row):
    got = verdict(row.program, emulator, "cpu")
    if row.emulator:
        assert got["verdict"] == row.emulator, (
            f"{row.name}: the row says the emulator gives {row.emulator} ({row.differs}); it gave {got}")
    else:
        assert got["verdict"] == row.cuda, f"{row.name}: CUDA gives {row.cuda} ({row.why}); the emulator gave {got}"


@pytest.mark.parametrize("row", CHECKED, ids=ids(CHECKED))
def test_make_backend_turns_the_silent_bug_into_stale_address_error(row):
    got = verdict(row.checked, make_backend("emulated", "cpu"), "cpu")
    assert got["verdict"] == ERROR and got["detail"].startswith("StaleAddressError"), got


@pytest.fixture(scope="module")
def emulated_run():
    return run("emulated")


def mismatches(results: dict, expected: dict) -> list[str]:
    """Rows whose verdict (or make_backend verdict) differs from expected[name] = (verdict, checked)."""
    found = []
    for name, (want, want_checked) in expected.items():
        got = results["rows"].get(name)
        if got is None:
            found.append(f"{name}: not run")
            continue
        if got["verdict"] != want:
            found.append(f"{name}: {got['verdict']} ({got['detail']}), expected {want}")
        if want_checked and (got.get("checked") or {}).get("verdict") != want_checked:
            found.append(f"{name} through make_backend: {got.get('checked')}, expected {want_checked}")
    return found


def expected_on(backend: str) -> dict:
    return {r.name: (r.cuda if backend == "cuda" else r.expected_emulated, ERROR if r.checked else None) for r in ROWS}


def committed_gpu_run() -> dict:
    if not GPU_RESULTS.exists():
        pytest.skip(f"{GPU_RESULTS.relative_to(GPU_RESULTS.parents[2])} is not committed yet: "
                    "run `bash scripts/emulator_fidelity_gpu.sh reports/h200` on a GPU machine")
    gpu = json.loads(GPU_RESULTS.read_text())
    assert gpu["backend"] == "cuda"
    return gpu


def test_the_committed_gpu_results_agree(emulated_run):
    """On the rows the committed GPU run has (a row added since waits for the next run, below)."""
    gpu = committed_gpu_run()
    ran = {name: want for name, want in expected_on("cuda").items() if name in gpu["rows"]}
    # Every row's CUDA expectation held on the GPU, and the emulator agrees with what the GPU did
    # wherever the row does not say it differs.
    assert not mismatches(gpu, ran), "the GPU disagrees with the table's expectations"
    from_gpu = {r.name: (r.emulator or gpu["rows"][r.name]["verdict"], gpu["rows"][r.name].get("checked", {}).get("verdict"))
                for r in ROWS if r.name in gpu["rows"]}
    assert not mismatches(emulated_run, from_gpu), "the emulator disagrees with the committed GPU run"


def test_every_row_has_run_on_the_gpu():
    missing = [r.name for r in ROWS if r.name not in committed_gpu_run()["rows"]]
    if missing:
        pytest.skip(f"rows not yet run on a GPU: {', '.join(missing)} "
                    "(bash scripts/emulator_fidelity_gpu.sh reports/h200 on a GPU machine, then commit it)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA half runs on a GPU machine")
def test_cuda_gives_the_expected_verdicts():
    assert not mismatches(run("cuda"), expected_on("cuda"))


def exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


def test_the_command_writes_verdicts_and_renders_both_columns(tmp_path, capsys):
    emulated_json, cuda_json, table = tmp_path / "emulated.json", tmp_path / "cuda.json", tmp_path / "table.md"
    assert exit_code(["--backend", "emulated", "--json", str(emulated_json)]) == 0
    written = json.loads(emulated_json.read_text())
    assert written["backend"] == "emulated" and written["torch"] == torch.__version__ and written["device"]
    assert not mismatches(written, expected_on("emulated"))
    # A CUDA run as the table expects it, with one row flipped as if the GPU had disagreed.
    cuda = {"backend": "cuda", "torch": "2.11.0+cu130", "device": "NVIDIA H200", "rows": {
        r.name: {"verdict": r.cuda, "detail": "", **({"checked": {"verdict": ERROR, "detail": "StaleAddressError: x"}}
                                                      if r.checked else {})} for r in ROWS}}
    cuda["rows"]["correct-usage"] = {"verdict": "wrong", "detail": ""}
    cuda_json.write_text(json.dumps(cuda))
    assert exit_code(["--compare", str(emulated_json), str(cuda_json), "--markdown", str(table)]) == 0
    text = table.read_text()
    for r in ROWS:
        line = next(line for line in text.splitlines() if line.startswith(f"| `{r.name}` |"))
        if r.name == "correct-usage":
            assert "| wrong (expected right) | right | **NO (unexpected)** |" in line
        elif r.emulator:
            assert "| no (known) |" in line and r.differs in line, line
        else:
            assert f"| {r.cuda} | {r.cuda} | yes |" in line, line
    assert "- `correct-usage`: CUDA said wrong (no error); the emulator said right (no error)." in text
    assert all(f"| `{r.name}` | error | error | yes | StaleAddressError |" in text for r in CHECKED)
    assert "2.11.0+cu130 on NVIDIA H200" in text


def test_render_marks_rows_only_one_side_ran():
    empty = {"torch": "t", "device": "d", "rows": {}}
    text = render(empty, {**empty, "rows": {"gone-row": {"verdict": "right", "detail": ""}}})
    assert "| `gone-row` | right | (not run) | **NO (unexpected)** | (no longer in the table) |" in text
    assert "| `correct-usage` | (not run) | (not run) | yes |" in text


@pytest.mark.parametrize("argv", [
    pytest.param([], id="nothing"),
    pytest.param(["--backend", "tpu"], id="unknown-backend"),
    pytest.param(["--backend", "emulated", "--compare", "a", "b"], id="both"),
    pytest.param(["--backend", "emulated", "--markdown", "x.md"], id="markdown-with-backend"),
    pytest.param(["--compare", "missing.json", "missing-too.json"], id="missing-file"),
    pytest.param(["--compare", "WRONG_BACKEND", "WRONG_BACKEND"], id="wrong-backend-file"),
    pytest.param(["--compare", "NOT_A_RUN", "NOT_A_RUN"], id="not-a-run"),
    pytest.param(["--backend", "emulated", "--json", "/no-such-dir/x.json"], id="unwritable"),
    pytest.param(["--backend", "cuda"], id="cuda-without-gpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, tmp_path, capsys):
    files = {"WRONG_BACKEND": {"backend": "emulated", "rows": {}}, "NOT_A_RUN": [1, 2]}
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    argv = [str(tmp_path / a) if a in files else a for a in argv]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err, err


def _no_capture_checks(monkeypatch):
    monkeypatch.setattr(emulated, "_forbidden_reason", lambda *args: None)
    monkeypatch.setattr(emulated, "_HOST_READS", set())


MUTANTS = {  # emulators (and an address check) built to slip past the table
    "NoCaptureChecks": _no_capture_checks,
    "ReplayRunsNothing": lambda mp: mp.setattr(emulated.CUDAGraph, "replay", lambda self: None),
    "CaptureLeavesItsWork": lambda mp: mp.setattr(emulated._RecordingMode, "undo", lambda self: None),
    "NoAddressCheck": lambda mp: mp.setattr(base, "check_addresses", lambda *args: None),
    # A pool that never hands a freed block to a later capture (every graph keeps its own memory), and
    # one that hands out blocks the program still holds.
    "PoolNeverReuses": lambda mp: mp.setattr(pool.Block, "_gone", lambda self, _: None),
    "PoolIgnoresHeldTensors": lambda mp: (mp.setattr(pool.Block, "use", lambda self, tensor: self.pool().free.add(self)),
                                          mp.setattr(pool.Block, "free_now", lambda self: True)),
    # Graphs that keep alive what they use (the emulator before 0.4), and a watch that takes every
    # storage the program's for freed.
    "GraphsKeepFreedMemory": lambda mp: mp.setattr(held.Outside, "check", lambda self: None),
    "EverythingLooksFreed": lambda mp: mp.setattr(held, "_use_count", lambda cdata: 0),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_table_catches_a_broken_emulator(mutant, monkeypatch, record_property):
    MUTANTS[mutant](monkeypatch)
    caught = [line.split(":")[0] for line in mismatches(run("emulated"), expected_on("emulated"))]
    record_property("caught_by", caught)
    assert caught, f"{mutant} gives every verdict the table expects"
