"""Does the torch profiler leave the host slower afterwards, and does TEARDOWN_CUPTI=1 undo it?"""
import json, os, statistics, sys, time
import torch
if os.environ.get("PROBE_SET_AFTER_IMPORT"): os.environ["TEARDOWN_CUPTI"] = "1"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import step_breakdown as sb
from harness.graphs import counting

factory, engine = sb.build("small")
r = engine.engine.runner
requests = sb.decode_batch(factory, engine, 1)
res = {"env TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}

def timing(label):
    host, total = [], []
    for _ in range(20):
        r.step(requests)
    for _ in range(200):
        torch.cuda.synchronize(); t0 = time.perf_counter(); out = r.step(requests); t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        host.append(t1 - t0); total.append(t2 - t0)
    res[label] = {"host_us": round(statistics.median(host) * 1e6, 1), "step_wait_us": round(statistics.median(total) * 1e6, 1)}
    print(label, res[label], flush=True)

first = r.step(requests).logits.clone() if hasattr(r.step(requests), "logits") else None
timing("clean")
c = counting.count(lambda: r.step(requests), "cuda"); print("count", c, flush=True)
timing("after a CPU-activity profile (counting.count)")
floor = counting.kernel_time_us(lambda: r.eager_step(requests, 1)); print("floor", floor, flush=True)
res["floor_us"] = round(floor, 1)
timing("after a CUDA-activity profile (kernel_time_us)")
floor2 = counting.kernel_time_us(lambda: r.eager_step(requests, 1)); res["floor_again_us"] = round(floor2, 1)
graph_kernels = counting.kernel_time_us(lambda: r.step(requests)); res["step_profiled_device_us"] = round(graph_kernels, 1)
timing("after two more CUDA profiles")
if first is not None:
    res["same logits after"] = bool(torch.equal(first, r.step(requests).logits))
print(json.dumps(res), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"cupti_{os.environ.get("TEARDOWN_CUPTI", "unset") + os.environ.get("PROBE_SET_AFTER_IMPORT", "")}.json"), "w"), indent=1)
