"""What the benchmark lane's one-time and per-test costs are, and three questions behind its timings.

1. The first latency test of a lane carries the process's one-time work. Each part timed in the
   order the lane meets it: CUDA start, the eager engine's build, its prefill of 256 contexts, the
   first kernel-time profile and launch count, the PIECEWISE and FULL_AND_PIECEWISE engines' build
   and capture.
2. How the host waits for a step: an empty device synchronize against a stream synchronize and an
   event synchronize, and a FULL step at batch 1 then each wait.
3. How much a graph's device time moves between replays in a stream (the lane times 10), and the
   lane's "in a stream" figure timed on the device behind a first step against the wall clock.

Run from the repository root on a CUDA machine: python reports/h200/probes/lane_costs.py
(writes lane_costs.json to $OUT, or /tmp)."""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
t0 = time.perf_counter()
import torch  # noqa: E402

from harness.scenarios.batches import decode_requests, prefill  # noqa: E402
from harness.graphs import counting  # noqa: E402
from harness.graphs.log import timed_replays  # noqa: E402
from harness.runtime.observe import BENCHMARK_ENGINE, EngineFactory  # noqa: E402
from harness.reports.timing import in_a_stream_ms  # noqa: E402
from reference_runtime.adapter import ReferenceRuntime  # noqa: E402

out, marks = {}, {}


def contexts(engine):
    """256 contexts of 128 tokens in the engine's KV cache, 8 prompts a prefill step, as the lane does."""
    seqs = []
    for _ in range(0, 256, 8):
        seqs += prefill(engine, [factory.new_id() for _ in range(8)], [128] * 8)
    torch.cuda.synchronize()
    return seqs


def mark(name, since):
    marks[name] = round(time.perf_counter() - since, 3)
    return time.perf_counter()


t = mark("import torch and the harness", t0)
torch.ones(1, device="cuda").add_(1)
torch.cuda.synchronize()
t = mark("CUDA start (context, first kernel)", t)
factory = EngineFactory(ReferenceRuntime(), "cuda", preset="small", **BENCHMARK_ENGINE)
eager = factory.get(mode="NONE", capture=False)
t = mark("eager engine build", t)
seqs = contexts(eager)
t = mark("prefill of 256 contexts of 128 tokens (32 steps of 1024)", t)
requests = decode_requests(seqs[:1])
for _ in range(3):
    eager.engine.step(requests)
torch.cuda.synchronize()
t = mark("first eager decode steps (3)", t)
counting.kernel_time_us(lambda: eager.eager_step(requests, 1))
t = mark("first kernel-time profile", t)
counting.kernel_time_us(lambda: eager.eager_step(requests, 1))
t = mark("second kernel-time profile", t)
counting.count(lambda: eager.engine.step(requests), "cuda")
t = mark("first launch count", t)
piecewise = factory.get(mode="PIECEWISE")
t = mark("PIECEWISE engine build and capture", t)
full = factory.get(mode="FULL_AND_PIECEWISE")
t = mark("FULL_AND_PIECEWISE engine build and capture", t)
full_seqs = contexts(full)
t = mark("FULL_AND_PIECEWISE prefill of 256 contexts", t)
out["one-time costs (s)"] = marks

# 2. Waiting for a step.
runner = full.engine.runner
one = decode_requests(full_seqs[:1])
for _ in range(30):
    runner.step(one)
torch.cuda.synchronize()
stream = torch.cuda.current_stream()
event = torch.cuda.Event()


def event_wait():
    event.record()
    event.synchronize()


waits = {"device synchronize": torch.cuda.synchronize, "stream synchronize": stream.synchronize,
         "event record and synchronize": event_wait}


def median_us(fn, n=300):
    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1e6


def step_then(wait, n=300):
    xs = []
    torch.cuda.synchronize()
    for _ in range(n):
        s = time.perf_counter()
        runner.step(one)
        wait()
        xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1e6


rounds = []
for _ in range(3):  # interleaved, so that a drift of the host's speed lands on every variant
    rounds.append({**{f"empty {name}": median_us(w) for name, w in waits.items()},
                   **{f"FULL b=1 step then {name}": step_then(w) for name, w in waits.items()}})
out["waiting (us, median of 300; three interleaved rounds)"] = rounds
out["eager kernel floor at b=1 (us)"] = counting.kernel_time_us(lambda: full.eager_step(one, 1))

# 3. A graph's device time between replays in a stream.
def wall_clock_stream_ms(step, steps, repeats=3):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times) * 1e3


spread = {}
pw_seqs = prefill(piecewise, [factory.new_id() for _ in range(8)], [128] * 8)
for name, engine, reqs in (("FULL", full, one), ("PIECEWISE", piecewise, decode_requests(pw_seqs[:1]))):
    for _ in range(5):
        engine.engine.step(reqs)
    torch.cuda.synchronize()
    engine.engine.step(reqs)
    with timed_replays() as times:
        for _ in range(60):
            engine.engine.step(reqs)
    per_step = len(times) // 60
    steps = [sum(times[i:i + per_step]) * 1e3 for i in range(0, per_step * 60, per_step)]
    first10, all60 = statistics.median(steps[:10]), statistics.median(steps)
    spread[name] = {"replays a step": per_step, "median of 60 (us)": round(all60, 2),
                    "median of the first 10 (us)": round(first10, 2),
                    "min (us)": round(min(steps), 2), "max (us)": round(max(steps), 2),
                    "cv": round(statistics.pstdev(steps) / statistics.mean(steps), 5)}
    # The lane's "in a stream" figure: timed on the device behind a first step (10 steps, median of 3)
    # against the wall clock over 30 steps between two synchronisations (median of 3), as it was.
    figures = {"device-timed, 10 steps": [], "wall clock, 30 steps": []}
    for _ in range(3):
        figures["device-timed, 10 steps"].append(in_a_stream_ms(lambda: engine.engine.step(reqs), 10) * 1e3)
        figures["wall clock, 30 steps"].append(wall_clock_stream_ms(lambda: engine.engine.step(reqs), 30) * 1e3)
    spread[name]["in a stream (us, three interleaved rounds)"] = figures
out["graph device time per step in a stream, b=1"] = spread
print(json.dumps(out, indent=1))
folder = os.environ.get("OUT", "/tmp")
with open(os.path.join(folder, "lane_costs.json"), "w") as f:
    json.dump(out, f, indent=1)
factory.close()
