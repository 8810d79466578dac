"""Step latency per graph mode (the benchmark lane; docs/spec.md sections 1 and 7, invariant 7).

A sweep of decode batches from 1 to 256, on capture sizes and between them, for eager, PIECEWISE
and FULL (FULL_AND_PIECEWISE routes uniform decode to FULL graphs), through pytest-benchmark.
Each result carries the padded size; the step's latency (step, then wait for the device) with
its median and spread (IQR, coefficient of variation); for graph modes, the step's cost in a
stream of steps (issued back to back, the host preparing a step while the device runs the last
one, as an engine that does not wait for each step's logits runs; timed on the device, after a
first step has filled the queue) and the device time of its graph replays in that stream (timed
by the harness on the GPU stream); the launches the harness counted; and the summed kernel time
of an eager step at the same shape, the floor a graph can approach. After the timed rounds, eager
and FULL at the sweep's smallest and largest batch also profile a few step calls on the host
(harness.reports.profile: where the host's time goes, a `host_profile` record; the report says
where it does not cover the host time the timed rounds measured). One thing is asserted about speed, because it is robust on
a noisy machine: a FULL step beats eager at batch 1 by a clear margin.

    pytest suites/ --benchmark-only -p no:xdist --graph-backend cuda --report-dir reports/latest
"""
import functools
import itertools
import os
import statistics
import time

import pytest
import torch

from harness.scenarios.batches import decode_requests, prefill
from harness.graphs import counting
from harness.graphs.log import timed_replays
from harness.reports.records import Batch1Speedup, Capture, HarnessCost, Latency
from harness.reports.profile import profile_host
from harness.reports.timing import host_reference_ms, in_a_stream_ms

INVARIANT = "launch overhead"
pytestmark = pytest.mark.requires("execution")
MODES = {"eager": "NONE", "piecewise": "PIECEWISE", "full": "FULL_AND_PIECEWISE"}
SWEEP = [1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 65, 128, 200, 256]


def batches(chosen: str | None) -> list[int]:
    """The sweep, or the part of it CUDAGRAPH_BENCH_BATCHES names (a device call with a deadline:
    scripts/engines_bench_gpu.sh)."""
    if not chosen:
        return SWEEP
    picked = [int(b) for b in chosen.replace(",", " ").split() if b.isdigit()]
    if not picked or any(b not in SWEEP for b in picked):
        raise ValueError(f"CUDAGRAPH_BENCH_BATCHES={chosen!r}: give batches of the sweep {SWEEP}, e.g. '1,8,64,256'")
    return picked


BATCHES = batches(os.environ.get("CUDAGRAPH_BENCH_BATCHES"))
# The observed step may cost at most this fraction of a bare FULL step at batch 1 on top of it:
# the H100 runs of reports/h100/engines/ measured the reference and vLLM, with headroom for noise.
HARNESS_COST_LIMIT = 0.25
CONTEXT = 128
ROUNDS = 30
WARMUP = 2  # the engine is warm: two steps ran before (one checked by the harness, one to read its mode)
HOST_EVERY = 3  # timed rounds per run of the host's reference loop (it costs about as much as a step)
STREAM_STEPS = 10  # a run of steps in a stream, timed on the device without its start and end (harness.reports.timing)
REPLAY_STEPS = 10  # a graph's device time barely moves between replays (reports/h200/probes/lane_costs.json)
PROFILED = ("eager", "full")  # the host's part of a step is the difference between these two
_contexts: dict = {}  # id(engine) -> (engine, its prefilled sequences)


@pytest.fixture(scope="module", autouse=True)
def released_contexts():
    """The shared bench engines are the serving suite's too: give back every request prefilled here,
    so that a stream of max_num_seqs requests finds none left live."""
    yield
    while _contexts:
        _, (engine, seqs) = _contexts.popitem()
        for s in seqs:
            engine.release(s.request_id)


def contexts(engines, engine, count=256):
    """256 requests with CONTEXT tokens each in the KV cache, prefilled once per engine."""
    if id(engine) not in _contexts:
        seqs = []
        for _ in range(0, count, 8):  # 1024 tokens a prefill step
            seqs += prefill(engine, [engines.new_id() for _ in range(8)], [CONTEXT] * 8)
        _contexts[id(engine)] = (engine, seqs)
    return _contexts[id(engine)][1]


def synced(engine, requests):
    """One step and a device sync, timed on the engine itself: the harness's per-step checks ran
    on the step before the timing and stay out of it. `step.host_s` collects the time until each
    step returned, before the wait: the host's own part of it."""
    engine.step(requests)
    raw = engine.engine

    def step():
        start = time.perf_counter()
        out = raw.step(requests)
        step.host_s.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        return out
    step.host_s = []
    return step


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: f"b={b}")
@pytest.mark.parametrize("mode", list(MODES))
def test_decode_step_latency(runtime, bench_engines, benchmark, record, mode, batch):
    engine = bench_engines.get(mode=MODES[mode], capture=mode != "eager")
    requests = decode_requests(contexts(bench_engines, engine)[:batch])
    step = synced(engine, requests)
    out = step()
    # How fast the host ran while the step was timed, for reading a host-paced figure against another
    # run's: a lent machine's host changes speed within seconds, and a test's rounds take a fraction
    # of one, so the reference loop runs (untimed) before every HOST_EVERY-th timed round and the
    # median of those runs is the figure's.
    rounds, host_samples = itertools.count(-WARMUP), []  # pedantic calls setup before the warm-up rounds too

    def sample_the_host():
        if (timed := next(rounds)) >= 0 and timed % HOST_EVERY == 0:
            host_samples.append(host_reference_ms(repeats=1))
    benchmark.pedantic(step, setup=sample_the_host, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    host_ms = statistics.median(host_samples)
    host_step_ms = statistics.median(step.host_s[-ROUNDS:]) * 1e3  # the timed rounds' own
    stats = benchmark.stats.stats
    replay_ms = pipelined_ms = None
    if out.runtime_mode != "NONE":  # an eager step launches every kernel from the host: no stream to gain
        pipelined_ms = in_a_stream_ms(lambda: engine.engine.step(requests), STREAM_STEPS)
        replay_ms = replays_in_a_stream(engine.engine, requests)
    counted = counting.count(step, "cuda")
    kernel_us = counting.kernel_time_us(lambda: engine.eager_step(requests, out.num_padded_tokens))
    latency = Latency(mode=mode, batch=batch, padded=out.num_padded_tokens, runtime_mode=out.runtime_mode,
                      step_ms_median=stats.median * 1e3, step_ms_min=stats.min * 1e3, step_ms_iqr=stats.iqr * 1e3,
                      step_ms_cv=stats.stddev / stats.mean if stats.mean else None, replay_ms_median=replay_ms,
                      pipelined_ms=pipelined_ms,
                      eager_kernel_ms=None if kernel_us is None else kernel_us / 1e3,
                      kernel_launches=counted.kernels, graph_launches=counted.graphs,
                      memcpy_calls=counted.copies, rounds=stats.rounds, host_ref_ms=host_ms,
                      host_step_ms=host_step_ms,
                      unavailable=unavailable(out.runtime_mode, replay_ms, kernel_us) or None)
    benchmark.extra_info.update(latency.as_dict())
    record(latency)
    if mode != "eager" and batch == BATCHES[0]:
        report = engine.captured
        record(Capture(mode=MODES[mode], preset=bench_engines.preset, graphs=dict(report.graphs),
                       seconds=report.seconds, memory_bytes=report.memory_bytes, graph_backend="cuda",
                       observed_captures=engine.seen_at_capture.captures,
                       unavailable=None if report.memory_bytes is not None else {
                           "memory_bytes": "the runtime's CaptureReport.memory_bytes is None: it cannot measure "
                                           f"its graph memory (the harness saw {engine.memory_seen} bytes)"}))
    # Last, after every timed figure. A diagnosis, not a requirement: where the profile does not
    # cover the step's unprofiled host time (harness.reports.profile.gap), the report says so.
    if mode in PROFILED and batch in (min(BATCHES), max(BATCHES)):
        record(host_profile(engine.engine, requests, mode, batch, host_step_ms, wait=torch.cuda.synchronize))


def host_profile(engine, requests, mode: str, batch: int, host_step_ms: float | None, wait=None):
    """The engine's own step call under the host profiler (after the timed rounds: their figures
    are unprofiled), a device wait after each call outside the profile."""
    return profile_host(functools.partial(engine.step, requests), mode=mode, batch=batch, wait=wait,
                        host_step_ms=host_step_ms)


def unavailable(runtime_mode: str, replay_ms, kernel_us) -> dict:
    """Each figure of a Latency record the runtime could not give, with why (the report says it)."""
    missing = {}
    if runtime_mode == "NONE":
        missing["replay_ms_median"] = missing["pipelined_ms"] = "an eager step replays no graph"
    elif replay_ms is None:
        missing["replay_ms_median"] = ("the harness timed no graph replay in a stream of steps: the engine's "
                                       "graphs do not replay through the torch.cuda.CUDAGraph the harness wraps")
    if kernel_us is None:
        missing["eager_kernel_ms"] = "the CUDA profiler saw no kernels of the engine's eager step"
    return missing


def replays_in_a_stream(engine, requests) -> float | None:
    """Median device time of one step's graph replays, the steps issued back to back behind a first
    one: a replay timed after a synchronised step would also time the host launching it onto an
    idle device."""
    torch.cuda.synchronize()
    engine.step(requests)
    with timed_replays() as times:
        for _ in range(REPLAY_STEPS):
            engine.step(requests)
    per_step = len(times) // REPLAY_STEPS
    if not per_step:
        return None
    return statistics.median(sum(times[i:i + per_step]) for i in range(0, per_step * REPLAY_STEPS, per_step))


def median_ms(fn, rounds=ROUNDS, warmup=WARMUP):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def test_graphs_beat_eager_at_batch_1(check, bench_engines, benchmark, record):
    eager = bench_engines.get(mode="NONE", capture=False)
    full = bench_engines.get(mode="FULL_AND_PIECEWISE")
    eager_ms = median_ms(synced(eager, decode_requests(contexts(bench_engines, eager)[:1])))
    step = synced(full, decode_requests(contexts(bench_engines, full)[:1]))
    benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    full_ms = benchmark.stats.stats.median * 1e3
    record(Batch1Speedup(eager_ms=eager_ms, full_ms=full_ms, speedup=eager_ms / full_ms))
    check.that(eager_ms >= 1.5 * full_ms, source="an eager step of the same runtime, timed",
               what="at batch 1 a FULL graph step must be clearly faster than eager (>= 1.5x)",
               eager_ms=round(eager_ms, 3), full_ms=round(full_ms, 3))


def test_harness_cost_at_batch_1(check, bench_engines, benchmark, record):
    """A FULL step at batch 1 as the suites observe it (ObservedEngine.step: launch log, protocol
    checks) against the engine's own step call, interleaved round by round in the same run."""
    full = bench_engines.get(mode="FULL_AND_PIECEWISE")
    requests = decode_requests(contexts(bench_engines, full)[:1])
    full.step(requests)
    bare_s = []

    def bare_step():  # pedantic's setup: untimed by pytest-benchmark, timed here
        start = time.perf_counter()
        full.engine.step(requests)
        torch.cuda.synchronize()
        bare_s.append(time.perf_counter() - start)

    def observed_step():
        full.step(requests)
        torch.cuda.synchronize()
    benchmark.pedantic(observed_step, setup=bare_step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    bare_ms = statistics.median(bare_s[-ROUNDS:]) * 1e3
    observed_ms = benchmark.stats.stats.median * 1e3
    cost = HarnessCost(batch=1, mode="FULL_AND_PIECEWISE", bare_ms=bare_ms, observed_ms=observed_ms,
                       harness_ms=observed_ms - bare_ms, fraction=(observed_ms - bare_ms) / bare_ms,
                       limit=HARNESS_COST_LIMIT)
    benchmark.extra_info.update(cost.as_dict())
    record(cost)
    check.that(cost.fraction <= HARNESS_COST_LIMIT, source="the engine's own step call, timed in the same run",
               what=f"the harness's observation may add at most {HARNESS_COST_LIMIT:.0%} of a bare FULL step at batch 1",
               bare_ms=round(bare_ms, 4), observed_ms=round(observed_ms, 4))
