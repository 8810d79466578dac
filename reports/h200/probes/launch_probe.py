"""Where the FULL step's launch call goes: torch's CUDAGraph.replay vs the driver's cuGraphLaunch,
the kernels a replay puts on the device, an empty synchronize, and the step then wait with each.

Run from the repository root on a CUDA machine: python reports/h200/probes/launch_probe.py
(writes its JSON to $OUT, or /tmp)."""
import ctypes, json, statistics, sys, time
sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import torch
from step_breakdown import build, decode_batch

factory, engine = build("small")
runner = engine.engine.runner
requests = decode_batch(factory, engine, 1)
for _ in range(30):
    runner.step(requests)
key = next(k for k in runner.full_graphs if k.num_tokens == 1 and k.uniform)
wrapper = runner.full_graphs[key]
graph = wrapper._graph
out = {}

def host_call_us(fn, n=300):
    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter(); fn(); xs.append(time.perf_counter() - s)
    torch.cuda.synchronize()
    return statistics.median(xs) * 1e6

def step_wait_us(fn, n=300):
    xs = []
    torch.cuda.synchronize()
    for _ in range(n):
        s = time.perf_counter(); fn(); torch.cuda.synchronize(); xs.append(time.perf_counter() - s)
    return statistics.median(xs) * 1e6

libcuda = ctypes.CDLL("libcuda.so.1")
libcuda.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
libcuda.cuGraphLaunch.restype = ctypes.c_int
exec_handle = graph.raw_cuda_graph_exec()
stream = torch.cuda.current_stream().cuda_stream
def driver_launch():
    rc = libcuda.cuGraphLaunch(exec_handle, stream)
    assert rc == 0, rc

for rnd in range(2):
    out[f"round{rnd}"] = {
        "torch replay call": host_call_us(graph.replay),
        "wrapper replay call": host_call_us(lambda: wrapper.replay(runner.graph_inputs())),
        "cuGraphLaunch call": host_call_us(driver_launch),
        "empty synchronize": host_call_us(torch.cuda.synchronize),
        "torch replay then wait": step_wait_us(graph.replay),
        "cuGraphLaunch then wait": step_wait_us(driver_launch),
        "step then wait": step_wait_us(lambda: runner.step(requests)),
        "step host only": host_call_us(lambda: runner.step(requests)),
    }
    launch = wrapper._launch
    wrapper._launch = driver_launch
    out[f"round{rnd}"]["step then wait, cuGraphLaunch"] = step_wait_us(lambda: runner.step(requests))
    wrapper._launch = launch

from torch.profiler import ProfilerActivity, profile
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
names = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        names[e.name[:80]] = names.get(e.name[:80], 0) + 1
cpu_ops = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU})
out["device ops over 3 replays"] = sum(names.values())
out["fill-like ops"] = {k: v for k, v in names.items() if "fill" in k.lower()}
out["cpu ops during replay"] = cpu_ops[:40]
print(json.dumps(out, indent=1))
import os
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "launch_probe.json"), "w"), indent=1)
