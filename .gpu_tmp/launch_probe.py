"""What does cudaGraphLaunch cost per node, by node kind; and what is in the reference FULL graph."""
import ctypes, glob, json, os, re, statistics, sys, time
from collections import Counter
import torch
sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", "/tmp")
res = {}

def launch_cost(g, n=300):
    host, total = [], []
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); g.replay(); t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        host.append(t1 - t0); total.append(t2 - t0)
    return {"launch_us": round(statistics.median(host) * 1e6, 1), "launch_wait_us": round(statistics.median(total) * 1e6, 1)}

def chain(N, op):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): op()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        for _ in range(N): op()
    return g

x = torch.zeros(16, device="cuda"); y = torch.zeros(16, device="cuda")
a = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16); w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
o = torch.empty(1, 512, device="cuda", dtype=torch.bfloat16)
ops = {
    "add_ kernel": lambda: x.add_(1),
    "D2D copy_ (memcpy node)": lambda: y.copy_(x),
    "bf16 matmul (cuBLAS)": lambda: torch.mm(a, w, out=o),
}
# The reference FULL graph at batch 1, with its nodes dumped.
made = []
class DebugGraph(torch.cuda.CUDAGraph):
    def __new__(cls, *a, **k):
        return super().__new__(cls, keep_graph=True)
    def __init__(self, *a, **k):
        super().__init__(keep_graph=True)
        made.append(self)
import harness.graphs.cuda as cg
cg.torch.cuda.CUDAGraph = DebugGraph
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import step_breakdown as sb
factory, engine = sb.build("small")
r = engine.engine.runner
requests = sb.decode_batch(factory, engine, 1)
for _ in range(20):
    r.step(requests)
full = r.full_graphs
key = min(full, key=lambda k: k.num_tokens)
graph = full[key]._graph
def cudart():
    for line in open("/proc/self/maps"):
        if "libcudart" in line:
            return ctypes.CDLL(line.split()[-1])
rt = cudart()
def node_kinds(g):
    raw = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    print("getnodes", rt.cudaGraphGetNodes(raw, None, ctypes.byref(n)), n.value, flush=True)
    nodes = (ctypes.c_void_p * n.value)()
    rt.cudaGraphGetNodes(raw, nodes, ctypes.byref(n))
    kinds = Counter(); names = Counter()
    rt.cudaFuncGetName.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p]
    for node in nodes:
        t = ctypes.c_int(-1)
        rt.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        kinds[t.value] += 1
    return dict(kinds)
try:
    res["full_b1_node_kinds (0 kernel 1 memcpy 2 memset 3 host 5 empty 6 wait 7 record)"] = node_kinds(graph)
    print(res, flush=True)
except Exception as e:
    print("kinds error", repr(e), flush=True)
for k, cg_ in sorted(full.items(), key=lambda kv: kv[0].num_tokens)[:3]:
    res[f"launch {k}"] = launch_cost(cg_._graph)
    print(k, res[f"launch {k}"], flush=True)
res["full_b1"] = launch_cost(graph)
host = []
for _ in range(300):
    torch.cuda.synchronize(); t0 = time.perf_counter(); r.step(requests); t1 = time.perf_counter(); torch.cuda.synchronize()
    host.append(t1 - t0)
res["step_host_us"] = round(statistics.median(host) * 1e6, 1)
print("full b1", res["full_b1"], flush=True)
# raw launch through cudart, to see torch's share
try:
    lib = None
    for line in open("/proc/self/maps"):
        if "libcudart" in line:
            lib = line.split()[-1]; break
    cudart = ctypes.CDLL(lib)
    exec_ = graph.raw_cuda_graph_exec()
    stream = torch.cuda.current_stream().cuda_stream
    host = []
    for _ in range(300):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); rc = cudart.cudaGraphLaunch(ctypes.c_void_p(exec_), ctypes.c_void_p(stream)); t1 = time.perf_counter()
        host.append(t1 - t0)
    torch.cuda.synchronize()
    res["full_b1_raw_cudaGraphLaunch_us"] = round(statistics.median(host) * 1e6, 1)
    print("raw", res["full_b1_raw_cudaGraphLaunch_us"], rc, lib, flush=True)
except Exception as e:
    res["raw_error"] = repr(e); print("raw error", e)
json.dump(res, open(os.path.join(OUT, "launch_probe.json"), "w"), indent=1)
