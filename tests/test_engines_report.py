"""scripts/engines_report.py on synthetic reports shaped like the benchmark lane's (issue 56)."""
import importlib.util
import json
from pathlib import Path

from harness.reports.records import SCHEMA_VERSION, Capture, HarnessCost, Latency

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("engines_report", ROOT / "scripts" / "engines_report.py")
engines_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engines_report)


def lane(runtime: str, full_ms: float, floor_ms: float | None, memory: int | None, skip_piecewise=False) -> dict:
    tests = []
    for batch in (1, 8, 64, 256):
        for mode, ms in (("eager", 4 * full_ms), ("full", full_ms)):
            record = Latency(mode=mode, batch=batch, padded=batch, runtime_mode="NONE" if mode == "eager" else "FULL",
                             step_ms_median=ms * (1 + batch / 256), step_ms_min=ms, eager_kernel_ms=floor_ms,
                             unavailable=None if floor_ms else {"eager_kernel_ms": "the CUDA profiler saw no kernels"})
            tests.append({"nodeid": f"suites/test_step_latency.py::test_decode_step_latency[{runtime}-{mode}-b={batch}]",
                          "outcome": "passed", "records": [record.as_dict()]})
    tests.append({"nodeid": "x::capture", "outcome": "passed", "records": [Capture(
        mode="FULL_AND_PIECEWISE", preset="small", graphs={"FULL": 67}, seconds=3.5, memory_bytes=memory,
        unavailable=None if memory else {"memory_bytes": "CaptureReport.memory_bytes is None"}).as_dict()]})
    tests.append({"nodeid": "x::cost", "outcome": "passed", "records": [HarnessCost(
        batch=1, mode="FULL_AND_PIECEWISE", bare_ms=full_ms, observed_ms=full_ms * 1.1, harness_ms=full_ms * 0.1,
        fraction=0.1, limit=1.0).as_dict()]})
    if skip_piecewise:
        tests.append({"nodeid": f"suites/test_step_latency.py::test_decode_step_latency[{runtime}-piecewise-b=1]",
                      "outcome": "skipped", "reason": "runtime rejects PIECEWISE at build"})
    return {"schema_version": SCHEMA_VERSION, "runtime": runtime, "device": "NVIDIA H200 (sm_90)", "tests": tests}


def test_three_engines_render_a_table_plots_and_findings(tmp_path):
    paths = []
    for run in (lane("reference", 0.2, 0.1, 2**24), lane("vllm-engine", 0.5, 0.3, 2**25),
                lane("lmdeploy-engine", 0.6, None, None, skip_piecewise=True)):
        paths.append(tmp_path / f"{run['runtime']}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "engines"
    assert engines_report.main([str(p) for p in paths] + ["--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| vllm-engine | full | 64 | 64 | 0.625 |" in table
    assert "| reference | full | 1 |" in table and "| 4.000 | 2.008 |" in table  # eager/FULL, FULL/floor at b=1
    assert "| lmdeploy-engine | FULL_AND_PIECEWISE | 67 | 3.50 | n/a |" in table
    for name in engines_report.FIGURES:
        assert (out / name).stat().st_size > 1000
    readme = (out / "README.md").read_text()
    assert "lmdeploy-engine capture FULL_AND_PIECEWISE: memory_bytes: CaptureReport.memory_bytes is None" in readme
    assert "lmdeploy-engine full b=1: eager_kernel_ms: the CUDA profiler saw no kernels" in readme
    assert "skipped: runtime rejects PIECEWISE at build" in readme
    assert "the harness adds [0.0500 ms to a bare FULL step of" in readme
    (out / "README.md").write_text("kept")
    assert engines_report.main([str(p) for p in paths] + ["--out", str(out)]) == 0
    assert (out / "README.md").read_text() == "kept" and (out / "findings.generated.md").exists()


def test_a_file_that_is_not_a_report_gets_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert engines_report.main([str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a readable JSON report" in err


def test_the_lane_runs_on_the_batches_named_and_refuses_others():
    spec = importlib.util.spec_from_file_location("step_latency", ROOT / "suites" / "test_step_latency.py")
    step_latency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_latency)
    assert step_latency.batches(None) == step_latency.SWEEP
    assert step_latency.batches("1,8,64,256") == [1, 8, 64, 256]
    try:
        step_latency.batches("1,300")
    except ValueError as error:
        assert "give batches of the sweep" in str(error) and "'1,8,64,256'" in str(error)
    else:
        raise AssertionError("a batch outside the sweep was accepted")
