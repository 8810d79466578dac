"""Where the benchmark lane's wall time goes, by helper: a pytest plugin that times each named helper
the lane's tests call and sums it over the run. cProfile did not say: on the H200 it counted none of
the lane's CUDA profiles (../../lane_profile_eea3bde/, 0 calls), of which every latency test takes two.

    PYTHONPATH=reports/h200/probes python -m pytest suites/test_step_latency.py suites/test_serving.py \
        --graph-backend cuda --bench-preset small --benchmark-only -p no:xdist -p lane_split

Prints one LANE-SPLIT line per helper at the end of the run (nested helpers count in both: the host
reference loops run inside the timed rounds' setup)."""
import time

import pytest_benchmark.fixture as bench_fixture

from harness.graphs import counting
from harness.reports import timing
from harness.scenarios import serving

TOTALS: dict = {}


def timed(name, fn):
    def inner(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds, calls = TOTALS.get(name, (0.0, 0))
            TOTALS[name] = (seconds + time.perf_counter() - start, calls + 1)
    return inner


# Patched before the suites import them by name.
counting._count_cuda = timed("CUDA profiles: launch counts (counting._count_cuda)", counting._count_cuda)
counting.kernel_times_us = timed("CUDA profiles: kernel floors (counting.kernel_times_us)", counting.kernel_times_us)
timing.in_a_stream_ms = timed("steps in a stream (timing.in_a_stream_ms)", timing.in_a_stream_ms)
timing.host_reference_ms = timed("host reference loops (timing.host_reference_ms)", timing.host_reference_ms)
serving.run = timed("serving runs (serving.run)", serving.run)
bench_fixture.BenchmarkFixture.pedantic = timed("timed rounds and their setup (benchmark.pedantic)",
                                                bench_fixture.BenchmarkFixture.pedantic)


def pytest_terminal_summary(terminalreporter):
    for name, (seconds, calls) in TOTALS.items():
        terminalreporter.write_line(f"LANE-SPLIT {seconds:7.2f} s in {calls:4d} calls  {name}")
