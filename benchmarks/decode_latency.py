"""Decode-step latency of the reference runtime per graph mode, on a CUDA device.

For each mode (eager, PIECEWISE, FULL) and batch size: the wall time of a whole step (copy
inputs, dispatch, run, copy logits out), the time of the graph part alone (back-to-back
replays), the summed kernel time of one eager step from the profiler (the floor a graph can
approach), and the launches one step submits. Also the time and memory of capturing every
size of the default grid. Results go to a JSON file; nothing here is a unit test.

    python benchmarks/decode_latency.py --preset small --dtype bfloat16 --out decode.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from reference_runtime.engine.buffers import Request  # noqa: E402
from reference_runtime.engine.runner import ModelRunner, RunnerConfig  # noqa: E402
from reference_runtime.policy import PolicyConfig  # noqa: E402

MODES = {"eager": "NONE", "piecewise": "PIECEWISE", "full": "FULL_AND_PIECEWISE"}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_runner(args, mode: str) -> ModelRunner:
    cuda = args.device == "cuda"
    return ModelRunner(RunnerConfig(
        preset=args.preset, dtype=args.dtype, device=args.device, graph_backend="cuda" if cuda else "emulated",
        mode=mode,
        policy=PolicyConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=max(8192, args.max_num_seqs)),
        num_blocks=args.num_blocks, block_size=16, max_model_len=args.max_model_len,
    ))


def decode_batch(runner: ModelRunner, batch: int, context: int, first_id: int) -> list[Request]:
    requests = [Request(first_id + i, (1 + i % 100,), context) for i in range(batch)]
    for r in requests:
        runner.allocator.ensure(r.request_id, context + 1)
    return requests


def timed(fn, iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def throughput(fn, iters: int) -> float:
    """Mean seconds per call when calls are issued back to back (no sync in between)."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def profile_step(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    kernel_us, kernels, launches, graph_launches, copies = 0.0, 0, 0, 0, 0
    for event in prof.events():
        name = event.name
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernel_us += event.device_time if hasattr(event, "device_time") else event.cuda_time
            kernels += 1
        elif name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"):
            launches += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            graph_launches += 1
        elif name.startswith("cudaMemcpy") or name.startswith("cuMemcpy"):
            copies += 1
    return {"gpu_ops_us": kernel_us, "gpu_ops": kernels, "kernel_launches": launches,
            "graph_launches": graph_launches, "memcpy_calls": copies}


def bench_mode(args, label: str, results: dict) -> None:
    runner = make_runner(args, MODES[label])
    capture = runner.capture() if label != "eager" else None
    if capture:
        results["capture"][label] = {"graphs": capture.graphs, "seconds": capture.seconds,
                                     "memory_bytes": capture.memory_bytes, "pool": capture.pool_stats}
    next_id = 0
    for batch in args.batches:
        requests = decode_batch(runner, batch, args.context, next_id)
        next_id += batch
        step = lambda: runner.step(requests)  # noqa: E731
        out = runner.step(requests)
        row = {"mode": label, "batch": batch, "runtime_mode": out.runtime_mode,
               "padded": out.padded_num_tokens}
        samples = timed(step, args.iters, args.warmup)
        row["step_ms_median"] = statistics.median(samples) * 1e3
        row["step_ms_mean"] = statistics.mean(samples) * 1e3
        row["step_ms_back_to_back"] = throughput(step, args.iters) * 1e3
        graph_part = graph_only(runner, requests, out)
        if graph_part is not None:
            row["replay_ms_back_to_back"] = throughput(graph_part, args.iters) * 1e3
        row.update(profile_step(step))
        eager = lambda: runner.eager_step(requests, out.padded_num_tokens)  # noqa: E731
        row["eager_kernel_us_same_shape"] = profile_step(eager)["gpu_ops_us"]
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        for r in requests:
            runner.release(r.request_id)


def graph_only(runner, requests, out):
    """The graph part of a step with its inputs already in place: what replay alone costs."""
    from reference_runtime.engine.buffers import plan_layout, query_len_if_uniform

    n = out.num_tokens
    uniform = query_len_if_uniform(requests, runner.q) is not None
    mode, key = runner.dispatcher.dispatch(n, len(requests), uniform)
    if out.runtime_mode == "FULL":
        graph = runner.full_graphs[key]
        return graph.replay
    if out.runtime_mode == "PIECEWISE":
        layout = plan_layout(requests, runner.allocator, key.num_tokens, runner.q, runner.max_rows)
        runner.buffers.load(layout)
        meta = runner.buffers.metadata(layout)
        return lambda: runner._run_pieces(meta)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", default="1,8,64,256", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=128, help="tokens already in each request's KV cache")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--modes", default="eager,piecewise,full")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only dry-runs the script on the emulator")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {"preset": args.preset, "dtype": args.dtype, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (emulated graphs: not GPU timing)",
               "torch": torch.__version__, "args": vars(args), "capture": {}, "rows": []}
    for label in args.modes.split(","):
        bench_mode(args, label, results)
        Path(args.out).write_text(json.dumps(results, indent=1))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
