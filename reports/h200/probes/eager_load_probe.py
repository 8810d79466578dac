"""Is the eager step slower with the in-graph-copy change (stage+transfer), or is the host slower?
Interleaved blocks of eager steps at b=1, current load vs the previous commit's load, plus a pure
Python reference loop; before and after one profile of an eager step (CUPTI)."""
import os, statistics, sys, time
import numpy as np
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
from step_breakdown import build, decode_batch, eager_kernels
from reference_runtime.engine import buffers as B

def old_load(self, layout):
    n, rows = layout.num_tokens, layout.num_reqs
    width = self.max_blocks
    destinations = self._where(n, rows); m = len(destinations)
    self._copy_done.synchronize()
    tables = np.zeros((rows, width), dtype=np.int64)
    for row, table in enumerate(layout.block_tables):
        tables[row, : len(table)] = table
    self._host_np[:m] = np.concatenate([layout.input_ids, layout.positions, layout.slot_mapping, layout.token_req,
                                        layout.seq_lens, layout.query_start_loc, tables.ravel()])
    self._host_np[m: 2 * m] = destinations
    staging = self._device_staging[: 2 * m]
    staging.copy_(self._host[: 2 * m], non_blocking=True)
    self._copy_done.record()
    self.packed.index_copy_(0, staging[m:], staging[:m])

new_load = B.StaticBuffers.load
factory, engine = build("small")
runner = engine.engine.runner
requests = decode_batch(factory, engine, 1)

def ref_loop():
    a = time.perf_counter(); x = 0
    for i in range(200000): x += i
    return (time.perf_counter() - a) * 1e3

def eager_ms(k=20):
    s = []
    for _ in range(k):
        torch.cuda.synchronize(); a = time.perf_counter()
        runner.eager_step(requests, 1); torch.cuda.synchronize()
        s.append(time.perf_counter() - a)
    return statistics.median(s) * 1e3

def rounds(tag):
    res = {"new": [], "old": [], "ref": []}
    for _ in range(8):
        B.StaticBuffers.load = new_load; res["new"].append(eager_ms())
        B.StaticBuffers.load = old_load; res["old"].append(eager_ms())
        res["ref"].append(ref_loop())
    B.StaticBuffers.load = new_load
    print(tag, {k: [round(v, 2) for v in vs] for k, vs in res.items()})
    print(tag, "medians", {k: round(statistics.median(v), 3) for k, v in res.items()}, flush=True)

for _ in range(5): runner.eager_step(requests, 1)
rounds("before any profile")
floor, _ = eager_kernels(runner, requests)
print("floor", floor, "TEARDOWN_CUPTI", os.environ.get("TEARDOWN_CUPTI"))
rounds("after one profile")
print("threads", torch.get_num_threads(), "cpus", os.cpu_count(), "load", os.getloadavg())
