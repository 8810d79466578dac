"""Serving benchmark (benchmark lane; docs/spec.md section 8's table): the same synthetic request stream through
continuous batching, per mode: eager, PIECEWISE and FULL_AND_PIECEWISE. Reported, not asserted,
beyond every request finishing."""
import pytest

from harness.scenarios import serving
from harness.reports.records import Serving

INVARIANT = "serving"
pytestmark = pytest.mark.requires("execution")
MODES = {"eager": "NONE", "piecewise": "PIECEWISE", "full_and_piecewise": "FULL_AND_PIECEWISE"}


@pytest.mark.parametrize("mode", list(MODES))
def test_serving_throughput_and_latency(check, bench_engines, benchmark, record, mode):
    engine = bench_engines.get(mode=MODES[mode], capture=mode != "eager")
    workload = serving.Workload(max_model_len=bench_engines.max_model_len)
    box = {}
    # The engine itself: the harness's per-step checks belong to the correctness suites, not to the timing.
    benchmark.pedantic(lambda: box.setdefault("m", serving.run(engine.engine, workload, 256, 8192)), rounds=1,
                       iterations=1)
    result = box["m"]
    benchmark.extra_info.update(result)
    record(Serving(mode=mode, **result))
    check.equal(result["requests"], workload.num_requests, what="requests of the stream that finished",
                source="the workload")
