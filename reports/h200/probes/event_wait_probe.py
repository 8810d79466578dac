"""Staging waits for the last copy out of the pinned buffer (an event) before it writes: what that
wait costs when the copy is long done, as a synchronize or as a query first, and the FULL step at
batch 1 then a wait with each (interleaved rounds, so that the host's speed phases land on both).

Run from the repository root on a CUDA machine: python reports/h200/probes/event_wait_probe.py
(writes event_wait_probe.json to $OUT, or /tmp)."""
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

factory, engine = build("small")
runner = engine.engine.runner
requests = decode_batch(factory, engine, 1)
for _ in range(50):
    runner.step(requests)
torch.cuda.synchronize()
event = runner.buffers._copy_done


def call_us(fn, n=2000):
    torch.cuda.synchronize()
    xs = []
    for _ in range(n):
        s = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1e6


def step_wait_us(n=300):
    torch.cuda.synchronize()
    xs = []
    for _ in range(n):
        s = time.perf_counter()
        runner.step(requests)
        torch.cuda.synchronize()
        xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1e6


synchronize = event.synchronize  # the bound method, kept: staging's call is replaced below


def query_first():
    if not event.query():
        synchronize()


rounds = []
for _ in range(4):
    row = {"host loop ms": host_reference_ms(),
           "completed event: synchronize (us)": call_us(synchronize),
           "completed event: query (us)": call_us(event.query)}
    event.synchronize = synchronize
    row["FULL b=1 step then wait, synchronize (us)"] = step_wait_us()
    event.synchronize = query_first  # staging calls event.synchronize(): a query first, then the wait
    row["FULL b=1 step then wait, query first (us)"] = step_wait_us()
    event.synchronize = synchronize
    rounds.append(row)
out = {"rounds": rounds, "eager kernel floor at b=1 (us)": counting.kernel_time_us(lambda: runner.eager_step(requests, 1))}
print(json.dumps(out, indent=1))
with open(os.path.join(os.environ.get("OUT", "/tmp"), "event_wait_probe.json"), "w") as f:
    json.dump(out, f, indent=1)
