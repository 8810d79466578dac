"""What a run measured, read from its JSON report: the records its tests made (harness.reports.records)
and the figures derived from them (padding waste, latency ratios, the crossover, regressions against a
baseline). Pure Python, no matplotlib and no Markdown, so each figure is testable on its own."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

from harness.vocabulary import padded, waste_percent

SPEC_WASTE_BATCH = 500  # spec section 4's example: on vLLM's grid for max_num_seqs=256, 500 -> 512, 2.34%


def recorded(run: dict, kind: str) -> list[dict]:
    """Every record of `kind` the run's tests made, without the kind field."""
    return [{k: v for k, v in record.items() if k != "kind"}
            for test in run.get("tests", []) for record in test.get("records") or () if record.get("kind") == kind]


def distinct(values: list) -> list:
    seen, kept = set(), []
    for value in values:
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            kept.append(value)
    return kept


def short_device(device: str | None) -> str:
    return (device or "unknown device").split(" (")[0].replace("NVIDIA ", "").strip() or "unknown device"


def bench_preset(run: dict) -> str | None:
    """The model preset a run's engines were captured with, where it is one (a benchmark run)."""
    presets = {e.get("preset") for e in recorded(run, "capture")} - {None}
    return presets.pop() if len(presets) == 1 else None


def run_labels(runs: list[dict]) -> list[str]:
    """'runtime @ device' (with the preset of a benchmark run), numbered where two runs would
    otherwise share a label."""
    labels = [f"{r['runtime']} @ {short_device(r.get('device'))}" + (f" ({p})" if (p := bench_preset(r)) else "")
              for r in runs]
    counts, seen = Counter(labels), Counter()
    for i, label in enumerate(labels):
        if counts[label] > 1:
            seen[label] += 1
            labels[i] = f"{label} #{seen[label]}"
    return labels


def padding_buckets(sizes: list[int]) -> list[dict]:
    """Per bucket (previous size + 1 .. size): the worst waste, at its smallest batch."""
    buckets, previous = [], 0
    for size in sorted(set(sizes)):
        waste = size - (previous + 1)
        buckets.append({"first": previous + 1, "size": size, "waste": waste, "percent": waste_percent(previous + 1, size)})
        previous = size
    return buckets


def waste_by_batch(sizes: list[int]) -> list[tuple[int, float]]:
    """(batch, waste percent of the padded step) for every batch from 1 to the largest size."""
    return [(n, waste_percent(n, padded(sizes, n))) for n in range(1, max(sizes) + 1)]


def waste_line(sizes: list[int], batch: int = SPEC_WASTE_BATCH) -> str:
    to = padded(sizes, batch)
    if to is None:
        return f"batch {batch} -> above the largest size {max(sizes)}: runs eager, unpadded"
    return f"batch {batch} -> padded {to}, waste {to - batch} tokens ({waste_percent(batch, to):.2f}%)"


def latency_rows(run: dict) -> list[dict]:
    """One row per batch: median step ms per mode, FULL's pipelined and replay-only figures, the
    eager kernel floor, and the ratios."""
    by_batch: dict[int, dict] = defaultdict(dict)
    for entry in recorded(run, "latency"):
        if "batch" in entry and "mode" in entry:
            by_batch[entry["batch"]][entry["mode"]] = entry
    rows = []
    for batch in sorted(by_batch):
        modes = by_batch[batch]
        step = {m: modes[m].get("step_ms_median") if m in modes else None for m in ("eager", "piecewise", "full")}
        # The floor is measured at the FULL step's padded shape, the shape FULL replays.
        source = modes.get("full") or next(iter(modes.values()))
        full = modes.get("full", {})
        floor = source.get("eager_kernel_ms")
        pipelined, replay = full.get("pipelined_ms"), full.get("replay_ms_median")
        rows.append({"batch": batch, "padded": source.get("padded"), **step, "floor": floor,
                     "full_pipelined": pipelined, "full_replay": replay, "full_cv": full.get("step_ms_cv"),
                     "speedup": _ratio(step["eager"], step["full"]), "full_over_kernel": _ratio(step["full"], floor),
                     "pipelined_over_kernel": _ratio(pipelined, floor), "replay_over_kernel": _ratio(replay, floor)})
    return rows


def _ratio(a, b) -> float | None:
    """a / b, or None where either was not measured."""
    return a / b if a and b else None


def noise(run: dict) -> dict:
    """The spread the run measured: median and largest coefficient of variation of its step timings."""
    cvs = sorted(e["step_ms_cv"] for e in recorded(run, "latency") if e.get("step_ms_cv") is not None)
    return {"median_cv": cvs[len(cvs) // 2], "largest_cv": cvs[-1], "figures": len(cvs)} if cvs else {}


SLOW_PHASE = 1.3  # a figure timed while the host's reference loop ran this much over the run's median


def host_phase(run: dict, mode: str, batch: int) -> float | None:
    """How much slower the host ran while one step figure was timed than over the whole run: its
    reference loop's time over the median of the run's (harness.reports.timing.host_reference_ms). A lent
    machine's host changes speed within seconds, and a figure taken in a slow phase says so."""
    entries = [e for e in recorded(run, "latency") if e.get("host_ref_ms")]
    mine = next((e for e in entries if e.get("mode") == mode and e.get("batch") == batch), None)
    if mine is None:
        return None
    times = sorted(e["host_ref_ms"] for e in entries)
    return mine["host_ref_ms"] / times[len(times) // 2]


def crossover(rows: list[dict], below: float) -> int | None:
    """The smallest batch at which eager/FULL falls below `below`; None when it never does."""
    return next((r["batch"] for r in rows if r["speedup"] is not None and r["speedup"] < below), None)


def batch_invariance_rows(run: dict) -> list[dict]:
    """Largest difference per (bucket, mode), with every batch measured in that bucket."""
    entries = recorded(run, "batch_invariance")
    buckets: dict[tuple, dict] = {}
    for e in (e for e in entries if {"padded", "mode", "batch", "difference"} <= set(e)):
        row = buckets.setdefault((e["padded"], e["mode"]), {"padded": e["padded"], "mode": e["mode"],
                                                            "batches": [], "difference": 0.0})
        row["batches"].append(e["batch"])
        row["difference"] = max(row["difference"], e["difference"])
    return [buckets[key] for key in sorted(buckets)]


HOST_PACED = 2.0  # a step taking over twice its kernels' device time is paced by the host, not the device


def _benchmarks(runs: list[dict]) -> dict[tuple, dict]:
    """(kind, preset, mode, batch or workload) -> the figure: metric, value, higher_is_worse, cv (its
    coefficient of variation, or 0); for a step, the host's reference time (host_ms), the host's own
    part of the step where measured (host_step_ms), and whether the step is paced by the host. Only
    like is compared with like: the same model, and for serving the same number of requests (the
    stream's other parameters are fixed by the harness)."""
    found = {}
    for run in runs:
        preset = bench_preset(run)
        for e in recorded(run, "latency"):
            if e.get("step_ms_median"):
                paced = bool(e.get("eager_kernel_ms")) and e["step_ms_median"] >= HOST_PACED * e["eager_kernel_ms"]
                found[("latency", preset, e.get("mode"), e.get("batch"))] = {
                    "metric": "step_ms_median", "value": e["step_ms_median"], "higher_is_worse": True,
                    "cv": e.get("step_ms_cv") or 0.0, "host_ms": e.get("host_ref_ms"),
                    "host_step_ms": e.get("host_step_ms"), "paced": paced}
        for e in recorded(run, "serving"):
            if e.get("output_tok_s"):
                found[("serving", preset, e.get("mode"), f"{e.get('requests')} requests")] = {
                    "metric": "output_tok_s", "value": e["output_tok_s"], "higher_is_worse": False,
                    "cv": 0.0, "host_ms": None}
    return found


def _host_expected(now: dict, before: dict) -> tuple[float, float] | None:
    """(how much slower the host ran, what the baseline step would take on it), where both runs
    timed the host. The host's own part of the baseline step (the time until it returned) slows with
    the host and the device's part does not; a baseline without that split is scaled whole, and only
    where both steps were paced by the host."""
    if not (now["host_ms"] and before["host_ms"]):
        return None
    ratio = now["host_ms"] / before["host_ms"]
    if before.get("host_step_ms") is not None:
        return ratio, before["value"] + before["host_step_ms"] * (ratio - 1)
    if now["paced"] and before["paced"]:
        return ratio, before["value"] * ratio
    return None


def compare(current_runs: list[dict], baseline_runs: list[dict], threshold: float = 0.10) -> list[dict]:
    """Entries where a current run is worse than the baseline by more than `threshold` (a fraction)
    and by more than the noise both runs measured (twice their coefficients of variation added):
    latency medians higher, serving throughput lower. Matched as _benchmarks keys them: the same
    model preset, mode, and batch (latency) or request count (serving).

    A step is also read beside the host's reference time of each run
    (harness.reports.timing.host_reference_ms): where the host ran slower by `host_ratio`, the baseline step
    is what it would take on that host (_host_expected), and `host_adjusted` the change beyond that;
    within the bar, the entry carries `host_explains=True`. It is reported, and `counted` leaves it
    out: the code did not get slower, the machine did."""
    regressions = []
    for run, label in zip(current_runs, run_labels(current_runs)):
        # A baseline of the same runtime is the one to beat; otherwise whatever baseline was given.
        same = [b for b in baseline_runs if b.get("runtime") == run.get("runtime")] or baseline_runs
        baseline = _benchmarks(same)
        for key, now in _benchmarks([run]).items():
            if key not in baseline:
                continue
            before = baseline[key]
            value, was = now["value"], before["value"]
            change = (value - was) / was if now["higher_is_worse"] else (was - value) / was
            bar = max(threshold, 2 * (now["cv"] + before["cv"]))
            if change > bar:
                kind, _preset, mode, where = key  # where: the batch, or "N requests" for serving
                entry = {"run": label, "kind": kind, "mode": mode, "batch": where, "metric": now["metric"],
                         "baseline": was, "current": value, "change": change, "bar": bar}
                host = _host_expected(now, before) if kind == "latency" else None
                if host is not None:
                    ratio, expected = host
                    adjusted = (value - expected) / was  # the change beyond what the slower host accounts for
                    entry.update(host_ratio=ratio, host_adjusted=adjusted, host_explains=adjusted <= bar)
                regressions.append(entry)
    return regressions


def counted(regressions: list[dict]) -> list[dict]:
    """The regressions that count against the code: all but those the host's own slowdown explains."""
    return [r for r in regressions if not r.get("host_explains")]


def describe_regression(r: dict) -> str:
    where = f"{r['kind']} {r['mode']}" + (f" batch {r['batch']}" if r["kind"] == "latency" else f", {r['batch']}")
    return (f"{r['run']}: {where}: {r['metric']} {r['baseline']:.3f} -> {r['current']:.3f} "
            f"({100 * r['change']:.1f}% worse, the bar {100 * r['bar']:.1f}%)" + _host_note(r))


def _host_note(r: dict) -> str:
    if "host_ratio" not in r:
        return ""
    adjusted = f"{100 * abs(r['host_adjusted']):.1f}% {'worse' if r['host_adjusted'] >= 0 else 'better'}"
    note = f"; the host's reference loop took {r['host_ratio']:.2f}x its baseline time, and beyond what that accounts for the step is {adjusted}"
    return note + (", within the bar: the host explains it" if r["host_explains"] else ", beyond the bar")
