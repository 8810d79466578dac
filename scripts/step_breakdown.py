"""Where one decode step of the reference engine spends its time on a GPU.

    python scripts/step_breakdown.py [--preset small] [--batch 1 64] [--out DIR]

For each batch, with the benchmark lane's engine (bf16, CUDA graphs, FULL_AND_PIECEWISE, vLLM's
default grid), it prints and writes (DIR/step_breakdown.json):

- host phases of a FULL step, timed on the host (medians of 200 steps): dispatch, layout,
  staging the inputs in pinned host memory (the FULL graph copies them in as its first nodes),
  the graph launch call, waiting for the device;
- the device timeline from the CUDA profiler: when the device starts after the step begins, how
  long it is busy, the summed kernel time inside the step, and the gaps between kernels;
- the device time of the graph alone (50 replays back to back, timed by events around all of them),
  of a step in a stream (50 steps back to back), and the summed kernel time of an eager step;
- the eager step's kernels by name (count and device time), the candidates for fusion;
- the host time of a step before the first profile and after the last, which agree when the
  profiles leave nothing behind (a profiler that stays attached slows every later launch).

It needs CUDA; it is a diagnosis, not a test (the benchmark lane measures what the report shows).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(preset: str):
    """(factory, engine): the benchmark lane's engine of the reference runtime, captured."""
    from harness.runtime.factory import BENCHMARK_ENGINE, EngineFactory
    from reference_runtime.adapter import ReferenceRuntime

    factory = EngineFactory(ReferenceRuntime(), "cuda", preset=preset, **BENCHMARK_ENGINE)
    return factory, factory.get(mode="FULL_AND_PIECEWISE")


def decode_batch(factory, engine, batch: int, context: int = 128):
    """`batch` requests with `context` tokens each in the KV cache, as one-token decode requests."""
    from harness.scenarios.batches import decode_requests, prefill

    seqs = []
    for start in range(0, batch, 8):  # 8 prompts a prefill step, as the benchmark lane does
        count = min(8, batch - start)
        seqs += prefill(engine, [factory.new_id() for _ in range(count)], [context] * count)
    return decode_requests(seqs)


def host_phases(runner, requests, steps=200) -> dict:
    """Medians, in microseconds, of the host's phases of a step (each wrapped with a timer)."""
    marks: dict[str, list[float]] = defaultdict(list)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            marks[name].append(time.perf_counter() - start)
            return result
        return wrapper

    planner, stager = runner.planner, runner.stager
    # A decode step of the last one's shape updates the plan it kept (the persistent batch) and
    # stages what changed; the first of a shape plans and stages it whole.
    planner.plan = timed("plan: dispatch (remembered per batch shape) and layout", planner.plan)
    stager.stage = timed("inputs into pinned host memory (stage)", stager.stage)
    graphs = list(runner.full_graphs.values())
    for graph in graphs:
        graph.replay = timed("graph launch call (replay)", graph.replay)
    try:
        times, out = synced_steps(runner, requests, steps)
        marks.update(times)
    finally:
        del planner.plan, stager.stage  # the classes' methods again
        for graph in graphs:
            del graph.replay
    assert out.runtime_mode == "FULL", out.runtime_mode
    return {name: statistics.median(values) * 1e6 for name, values in marks.items()}


HOST_STEP = "whole step on the host (until it returns)"


def synced_steps(runner, requests, steps) -> tuple[dict[str, list[float]], object]:
    """Seconds of each of `steps` steps, each followed by a device synchronisation (on the host
    until it returns, waiting for the device after it, and both), and the last step's output."""
    import torch

    times: dict[str, list[float]] = defaultdict(list)
    torch.cuda.synchronize()
    for _ in range(steps):
        start = time.perf_counter()
        out = runner.step(requests)
        issued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        times[HOST_STEP].append(issued - start)
        times["waiting for the device after the step returned"].append(done - issued)
        times["step, then wait (what the benchmark's FULL column times)"].append(done - start)
    return times, out


def host_step_us(runner, requests, steps=100) -> float:
    """Median host time of a step (until it returns), the device idle at its start."""
    return statistics.median(synced_steps(runner, requests, steps)[0][HOST_STEP]) * 1e6


def device_timeline(runner, requests, steps=20) -> dict:
    """From the CUDA profiler: per step, device start after the step begins, busy span, kernel sum, gaps."""
    import torch
    from torch.profiler import ProfilerActivity, record_function

    from harness.graphs.counting import profiler

    torch.cuda.synchronize()
    with profiler(ProfilerActivity.CPU, ProfilerActivity.CUDA) as prof:
        for index in range(steps):
            with record_function(f"step {index}"):
                runner.step(requests)
                torch.cuda.synchronize()
    events = list(prof.events())
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    # record_function also leaves a device-side annotation spanning each step's GPU work: a mark,
    # not an op (counted as one, it doubled the summed device time).
    marks = sorted((e for e in events if e.name.startswith("step ") and e.device_type == cpu),
                   key=lambda e: e.time_range.start)
    device = sorted((e for e in events if e.device_type == cuda and not e.name.startswith("step ")),
                    key=lambda e: e.time_range.start)
    rows = []
    for mark in marks:
        begin, end = mark.time_range.start, mark.time_range.end
        inside = [e for e in device if begin <= e.time_range.start <= end]
        if not inside:
            continue
        busy = inside[-1].time_range.end - inside[0].time_range.start
        summed = sum(e.time_range.end - e.time_range.start for e in inside)
        rows.append({"device starts after (us)": inside[0].time_range.start - begin, "device busy span (us)": busy,
                     "summed device time (us)": summed, "gaps inside the span (us)": busy - summed,
                     "device ops": len(inside), "host step with wait (us)": end - begin})
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]} if rows else {}


def stream_times(runner, requests, repeats=50) -> dict:
    import torch

    from harness.reports.timing import in_a_stream_ms

    graph = runner.full_graphs[runner.last_plan.key]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay = start.elapsed_time(end) / repeats * 1e3
    stream = in_a_stream_ms(lambda: runner.step(requests), repeats, repeats=1) * 1e3
    return {"graph replays back to back, device time per replay (us)": replay,
            "steps back to back, per step (us)": stream}


def eager_kernels(runner, requests, steps=5) -> tuple[float, list]:
    """(summed kernel time of an eager step, [(name, launches per step, us per step)], largest first)."""
    from harness.graphs import counting

    padded = runner.last_plan.num_padded_tokens
    runner.eager_step(requests, padded)
    by_name = counting.kernel_times_us(lambda: [runner.eager_step(requests, padded) for _ in range(steps)])
    table = sorted(((name, len(times) / steps, sum(times) / steps) for name, times in by_name.items()),
                   key=lambda row: -row[2])
    return sum(row[2] for row in table), table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("step_breakdown.py needs a CUDA device (it times the device)")
    factory, engine = build(args.preset)
    runner = engine.engine  # the reference engine (its model runner), timed without the harness around it
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": {}}
    for batch in args.batch:
        requests = decode_batch(factory, engine, batch)
        for _ in range(20):
            runner.step(requests)
        before = host_step_us(runner, requests)
        floor, kernels = eager_kernels(runner, requests)
        entry = {"host phases (us, median)": host_phases(runner, requests),
                 "device timeline of a step, then wait (us, median)": device_timeline(runner, requests),
                 "back to back": stream_times(runner, requests), "eager kernel floor (us)": floor,
                 "eager kernels per step": round(sum(count for _, count, _ in kernels)),
                 "eager kernels by name (name, per step, us per step)": kernels[:40]}
        # Whether the profiles left something behind (harness.graphs.counting.profiler): the
        # same step timed before any profile and after all of them.
        entry["host step around the profiles (us, median)"] = {
            "before the first profile": before, "after the last": host_step_us(runner, requests)}
        result["batches"][batch] = entry
        for request in requests:
            engine.release(request.request_id)
        print(f"\n== {args.preset}, batch {batch}: eager kernel floor {floor:.1f} us, "
              f"{entry['eager kernels per step']} kernels and copies per eager step")
        for section in ("host phases (us, median)", "device timeline of a step, then wait (us, median)", "back to back",
                        "host step around the profiles (us, median)"):
            print(f"-- {section}")
            for name, value in entry[section].items():
                print(f"  {value:9.1f}  {name}")
        print("-- eager kernels by name (per step, us per step)")
        for name, count, micros in kernels[:25]:
            print(f"  {micros:8.1f} us {count:6.1f}x  {name[:110]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "step_breakdown.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    from harness.reliability import pipes

    sys.exit(pipes.run(main))  # quiet when the reader closes the pipe
