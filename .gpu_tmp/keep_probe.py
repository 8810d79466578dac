"""A/B: launch cost of the reference FULL graph, default torch.cuda.CUDAGraph vs keep_graph=True."""
import ctypes, json, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import step_breakdown as sb
import harness.graphs.cuda as cg
res = {}

def measure(label, r, requests, graph):
    for _ in range(20):
        r.step(requests)
    launch, host, total = [], [], []
    for _ in range(200):
        torch.cuda.synchronize(); t0 = time.perf_counter(); graph.replay(); launch.append(time.perf_counter() - t0)
    for _ in range(200):
        torch.cuda.synchronize(); t0 = time.perf_counter(); r.step(requests); t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter(); host.append(t1 - t0); total.append(t2 - t0)
    res[label] = {"launch_us": round(statistics.median(launch) * 1e6, 1), "step_host_us": round(statistics.median(host) * 1e6, 1),
                  "step_wait_us": round(statistics.median(total) * 1e6, 1)}
    print(label, res[label], flush=True)

def engine():
    factory, eng = sb.build("small")
    r = eng.engine.runner
    requests = sb.decode_batch(factory, eng, 1)
    r.step(requests)
    key = min(r.full_graphs, key=lambda k: k.num_tokens)
    return factory, eng, r, requests, r.full_graphs[key]._graph

fa, ea, ra, qa, ga = engine()
measure("A default CUDAGraph", ra, qa, ga)
Plain = torch.cuda.CUDAGraph
class Kept(Plain):
    def __new__(cls, *a, **k):
        return super().__new__(cls, keep_graph=True)
    def __init__(self, *a, **k):
        super().__init__(keep_graph=True)
cg.torch.cuda.CUDAGraph = Kept
fb, eb, rb, qb, gb = engine()
measure("B keep_graph=True", rb, qb, gb)
cg.torch.cuda.CUDAGraph = Plain
measure("A again", ra, qa, ga)
try:
    rt = None
    for line in open("/proc/self/maps"):
        if "libcudart.so" in line and "torch/lib" in line or "nvidia" in line and "libcudart" in line:
            rt = ctypes.CDLL(line.split()[-1]); res["cudart"] = line.split()[-1]; break
    if rt is None:
        for line in open("/proc/self/maps"):
            if "libcudart" in line:
                rt = ctypes.CDLL(line.split()[-1]); res["cudart"] = line.split()[-1]; break
    rc = rt.cudaGraphUpload(ctypes.c_void_p(ga.raw_cuda_graph_exec()), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    res["upload rc"] = rc
    measure("A after cudaGraphUpload", ra, qa, ga)
except Exception as e:
    res["upload error"] = repr(e); print(e)
fc, ec, rc_, qc, gc_ = engine()
measure("C default, built after", rc_, qc, gc_)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "keep_probe.json"), "w"), indent=1)
