"""The benchmark lane's host profile (issue 56): made from the reference engine's step on the graph
emulator, checked to cover the step's host time (and failing where it does not), rendered by
scripts/engines_report.py into the table and the findings' causes."""
import importlib.util
import json
import statistics
import time
import warnings
from pathlib import Path

import pytest

from harness.reports.profile import COVERS, gap, profile_host, where
from harness.reports.records import SCHEMA_VERSION, HostProfile, Latency, check_record

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def full_engine():
    from harness.runtime.factory import EngineFactory
    from harness.scenarios.batches import decode_requests, prefill
    from reference_runtime.adapter import ReferenceRuntime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        factory = EngineFactory(ReferenceRuntime(), "emulated")
        engine = factory.get(mode="FULL_AND_PIECEWISE")
    requests = decode_requests(prefill(engine, [factory.new_id() for _ in range(4)], [8] * 4))
    engine.step(requests)
    yield engine, requests
    factory.close()


def test_the_lane_profiles_the_reference_step_on_the_emulator(full_engine):
    engine, requests = full_engine
    lane = load("step_latency", ROOT / "suites" / "test_step_latency.py")
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        engine.engine.step(requests)
        samples.append(time.perf_counter() - start)
    host_ms = statistics.median(samples) * 1e3
    profile = lane.host_profile(engine.engine, requests, "full", 4, host_ms)
    stored = check_record(profile)
    assert stored["kind"] == "host_profile" and json.loads(json.dumps(stored)) == stored
    assert profile.steps == 5 and 0 < len(profile.by_own) <= 15 and 0 < len(profile.by_cumulative) <= 15
    assert profile.own_ms <= profile.profiled_ms * 1.05  # the functions' own time fits in the profiled calls
    # The step call itself: once per step, the outermost frame, cited in the checkout as its code is.
    step = profile.by_cumulative[0]
    assert (step["function"], step["where"], step["calls"]) == ("step", "reference_runtime/engine/runner.py", 1)
    assert step["cum_ms"] >= max(r["cum_ms"] for r in profile.by_cumulative[1:])
    assert [r["own_ms"] for r in profile.by_own] == sorted((r["own_ms"] for r in profile.by_own), reverse=True)
    assert any(r["where"] == "harness/graphs/emulated.py" and r["function"] == "replay" for r in profile.by_cumulative)
    assert not any("_lsprof" in r["function"] for r in profile.by_own + profile.by_cumulative)


def fake(own_ms: float, host_step_ms: float | None, mode="full", batch=256, rows=None) -> dict:
    rows = rows or [{"function": "fill_buffers", "where": "lmdeploy/pytorch/engine/model_agent.py", "line": 120,
                     "own_ms": own_ms * 0.75, "cum_ms": own_ms * 0.8, "calls": 4.0},
                    {"function": "<method 'item' of 'torch._C.TensorBase' objects>", "where": "~", "line": 0,
                     "own_ms": own_ms * 0.1, "cum_ms": own_ms * 0.1, "calls": 2.0}]
    cumulative = [{"function": "step", "where": "cudagraph_lmdeploy_engine/runtime.py", "line": 300,
                   "own_ms": 0.01, "cum_ms": own_ms, "calls": 1.0}, *sorted(rows, key=lambda r: -r["cum_ms"])]
    return HostProfile(mode=mode, batch=batch, steps=5, own_ms=own_ms, profiled_ms=own_ms * 1.2, by_own=rows,
                       by_cumulative=cumulative, host_step_ms=host_step_ms).as_dict()


def test_a_profile_that_misses_the_host_time_or_swamps_it_is_caught():
    assert gap(fake(15.0, 16.0)) is None
    assert gap(fake(15.0, None)) is None  # nothing unprofiled to hold it to
    missed = gap(fake(1.0, 16.0))  # the step's host time is in calls the profiler did not time
    assert missed and f"under {COVERS[0]:g}x the 16.000 ms" in missed and "in no function of the profile" in missed
    swamped = gap(fake(80.0, 16.0))
    assert swamped and f"over {COVERS[1]:g}x" in swamped and "swamped" in swamped
    off = HostProfile(mode="full", batch=1, steps=0, own_ms=0.0, profiled_ms=0.0, by_own=[], by_cumulative=[],
                      unavailable={"by_own": "cProfile could not start: another profiler"})
    assert gap(off) == "cProfile could not start: another profiler"


def test_the_profiler_leaves_the_wait_out_and_survives_another_profiler(monkeypatch):
    waited = []

    def busy():
        sum(range(20_000))
    profile = profile_host(busy, mode="eager", batch=1, steps=3, wait=lambda: waited.append(time.sleep(0.01)))
    assert len(waited) == 3 and profile.profiled_ms < 10  # the sleeps were outside the profile
    assert any(r["function"] == "busy" and r["calls"] == 1 for r in profile.by_cumulative)

    class Busy:
        def enable(self):
            raise ValueError("Another profiling tool is already active")
    monkeypatch.setattr("cProfile.Profile", lambda: Busy())
    refused = profile_host(busy, mode="eager", batch=1)
    assert refused.steps == 0 and "could not start" in gap(refused)


def test_where_cites_site_packages_and_the_checkout():
    assert where("/tmp/site_l/lib/python3.11/site-packages/lmdeploy/pytorch/engine/x.py") == "lmdeploy/pytorch/engine/x.py"
    assert where(str(ROOT / "reference_runtime" / "engine" / "runner.py")) == "reference_runtime/engine/runner.py"
    assert where("~") == "~"


def engine_report(runtime: str, profiles: list[dict]) -> dict:
    tests = [{"nodeid": f"suites/test_step_latency.py::test_decode_step_latency[{runtime}-full-b=256]",
              "outcome": "passed",
              "records": [Latency(mode="full", batch=256, padded=256, runtime_mode="FULL", step_ms_median=16.0,
                                  step_ms_min=15.9, host_step_ms=15.97, eager_kernel_ms=0.4).as_dict(),
                          Latency(mode="eager", batch=256, padded=256, runtime_mode="NONE", step_ms_median=8.7,
                                  step_ms_min=8.6, host_step_ms=8.7).as_dict(), *profiles]}]
    return {"schema_version": SCHEMA_VERSION, "runtime": runtime, "device": "NVIDIA H200 (sm_90)", "tests": tests}


def test_the_report_names_where_the_host_time_goes_and_says_where_it_was_not_measured(tmp_path):
    report = load("engines_report", ROOT / "scripts" / "engines_report.py")
    runs = {"lmdeploy-engine": [fake(15.0, 15.97), fake(6.0, 8.7, mode="eager"), fake(0.2, 0.25, batch=1)],
            "vllm-engine": [fake(0.1, 3.0)], "reference": []}
    paths = []
    for runtime, profiles in runs.items():
        paths.append(tmp_path / f"{runtime}.json")
        paths[-1].write_text(json.dumps(engine_report(runtime, profiles)))
    out = tmp_path / "engines"
    assert report.main([str(p) for p in paths] + ["--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "### lmdeploy-engine full b=256" in table and "### lmdeploy-engine full b=1" in table
    assert "| `fill_buffers` (lmdeploy/pytorch/engine/model_agent.py:120) | 11.250 | 12.000 | 4 |" in table
    assert table.index("### lmdeploy-engine full b=256") < table.index("### lmdeploy-engine full b=1")
    assert "- reference: not measured (its report has no host_profile records)" in table
    readme = (out / "README.md").read_text()
    causes = readme.split("## Causes")[1]
    assert ("- lmdeploy-engine FULL b=256: of a 15.970 ms host step (15.000 ms profiled), by own time: 11.250 ms in "
            "`fill_buffers` (lmdeploy/pytorch/engine/model_agent.py:120) (4 calls per step)") in causes
    assert "half the step or more is inside `fill_buffers` (lmdeploy/pytorch/engine/model_agent.py:120) (12.000 ms)" in causes
    assert "- lmdeploy-engine eager b=256: of a 8.700 ms host step" in causes
    assert "- vllm-engine FULL b=256: the host profile does not stand for the step: the profile saw 0.100 ms" in causes
    assert "1.500 ms in `<method 'item' of 'torch._C.TensorBase' objects>` (2 calls per step)" in causes
    assert "- reference: not measured" in causes and "TODO" not in readme
