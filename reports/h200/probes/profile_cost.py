"""What a profile costs in the lane: counting.count and counting.kernel_time_us, timed, and one
session with both activities that splits its events by record_function ranges.

Run from the repository root on a CUDA machine: python reports/h200/probes/profile_cost.py
(writes its JSON to $OUT, or /tmp)."""
import json, os, statistics, sys, time
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
import torch
from step_breakdown import build, decode_batch
from harness.graphs import counting
from torch.profiler import ProfilerActivity, record_function

factory, engine = build("small")
runner = engine.engine.runner
out = {}
for batch in (1, 64):
    requests = decode_batch(factory, engine, batch)
    def step():
        runner.step(requests); torch.cuda.synchronize()
    padded = runner.step(requests).padded_num_tokens
    eager = lambda: runner.eager_step(requests, padded)
    for _ in range(5): step(); eager()
    t = {}
    for name, fn in (("count", lambda: counting.count(step, "cuda")), ("floor", lambda: counting.kernel_time_us(eager))):
        xs, vals = [], []
        for _ in range(4):
            s = time.perf_counter(); v = fn(); xs.append(time.perf_counter() - s); vals.append(v if name == "floor" else v.as_dict())
        t[name + " s"] = xs; t[name + " values"] = vals
    # one session, both activities
    xs = []
    for _ in range(4):
        s = time.perf_counter()
        torch.cuda.synchronize()
        with counting.profiler(ProfilerActivity.CPU, ProfilerActivity.CUDA) as prof:
            with record_function("counted"):
                step()
            with record_function("floor"):
                eager(); torch.cuda.synchronize()
        events = list(prof.events())
        xs.append(time.perf_counter() - s)
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    ranges = {e.name: e.time_range for e in events if e.name in ("counted", "floor") and e.device_type == cpu}
    f = ranges["floor"]
    dev = [e for e in events if e.device_type == cuda and e.name not in ("counted", "floor")]
    in_floor = [e for e in dev if e.time_range.start >= f.start]
    launches = [e for e in events if e.device_type == cpu and e.name in counting._KERNEL_LAUNCHES + counting._GRAPH_LAUNCHES
                and ranges["counted"].start <= e.time_range.start <= ranges["counted"].end]
    t["merged s"] = xs
    t["merged floor us"] = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in in_floor)
    t["merged device ops in floor"] = len(in_floor)
    t["merged device ops before floor"] = len(dev) - len(in_floor)
    t["merged launches in counted"] = len(launches)
    t["gap floor start - last counted device end (us)"] = f.start - max((e.time_range.end for e in dev if e.time_range.start < f.start), default=0)
    out[f"b={batch}"] = t
print(json.dumps(out, indent=1))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "prof_probe.json"), "w"), indent=1)
