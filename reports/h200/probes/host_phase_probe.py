"""The FULL step at batch 1 against its kernel floor, across the host's speed phases: a lent
H200's host runs the same Python at ~1.7 ms and ~3.5 ms a loop within minutes, and a step's host
part moves with it. Each round times the host's reference loop, 30 steps each followed by a
device synchronisation (what the lane's FULL column times), and 30 graph replays each followed by
one (no host work before the launch); the kernel floor of an eager step is taken before and
after. Rounds run for `--seconds`; the JSON lists every round and the ratios by host speed.

Run from the repository root on a CUDA machine:
    python reports/h200/probes/host_phase_probe.py [--seconds 120]
(writes host_phase_probe.json to $OUT, or /tmp)."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import torch  # noqa: E402
from step_breakdown import build, decode_batch  # noqa: E402

from harness.graphs import counting  # noqa: E402
from harness.reports.timing import host_reference_ms  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=120)
args = parser.parse_args()

factory, engine = build("small")
runner = engine.engine.runner
requests = decode_batch(factory, engine, 1)
for _ in range(50):
    runner.step(requests)
out = runner.step(requests)
assert out.runtime_mode == "FULL", out.runtime_mode
_, key = runner._dispatch(1, 1, True)
graph = runner.full_graphs[key]


def median_us(fn, n=30):
    torch.cuda.synchronize()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def floor_us():
    return counting.kernel_time_us(lambda: runner.eager_step(requests, out.padded_num_tokens))


floor_before = floor_us()
rounds, deadline = [], time.perf_counter() + args.seconds
while time.perf_counter() < deadline:
    host = host_reference_ms(repeats=1)
    step = median_us(lambda: runner.step(requests))
    replay = median_us(graph._launch)
    rounds.append({"host_ref_ms": round(host, 3), "step_then_wait_us": round(step, 1),
                   "replay_then_wait_us": round(replay, 1)})
floor_after = floor_us()
floor = (floor_before + floor_after) / 2
for r in rounds:
    r["step_ratio"] = round(r["step_then_wait_us"] / floor, 4)
    r["replay_ratio"] = round(r["replay_then_wait_us"] / floor, 4)
fast = [r for r in rounds if r["host_ref_ms"] < 2.4]
slow = [r for r in rounds if r["host_ref_ms"] >= 2.4]


def summary(rs):
    if not rs:
        return None
    return {"rounds": len(rs), "host_ref_ms_median": statistics.median(r["host_ref_ms"] for r in rs),
            "step_ratio_median": statistics.median(r["step_ratio"] for r in rs),
            "step_ratio_max": max(r["step_ratio"] for r in rs),
            "replay_ratio_median": statistics.median(r["replay_ratio"] for r in rs)}


result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "kernel_floor_us": {"before": floor_before, "after": floor_after},
          "host loop under 2.4 ms": summary(fast), "host loop 2.4 ms or more": summary(slow),
          "all": summary(rounds), "rounds": rounds}
path = os.path.join(os.environ.get("OUT", "/tmp"), "host_phase_probe.json")
with open(path, "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
