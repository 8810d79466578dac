"""One report across engines from their benchmark lanes' JSON (issue 56): a table, three plots with
each engine's curve on one figure, where the host's time goes in one step (the lane's host
profiles), and a findings README skeleton that states only what the reports hold.

    python scripts/engines_report.py REFERENCE.json VLLM.json LMDEPLOY.json --out reports/h200/engines

Each JSON is a conformance report of `pytest suites/test_step_latency.py ... --benchmark-only`
(scripts/engines_bench_gpu.sh writes them). A figure an engine could not give is shown as "n/a" with
the reason its report recorded, or the reason its test was skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.reports.measurements import recorded, short_device  # noqa: E402
from harness.reports.profile import gap  # noqa: E402
from harness.reports.records import ReportFormatError, upgrade  # noqa: E402

FIGURES = ("speedup_eager_over_full.png", "full_over_kernel_floor.png", "capture_cost.png")
SHOWN = 8  # rows of a host profile in table.md
NAMED = 3  # functions named per profile in the findings' causes


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def engine_rows(run: dict) -> dict:
    """One engine's figures: latency by (mode, batch), capture by mode, harness cost, skips."""
    latency = {(e["mode"], e["batch"]): e for e in recorded(run, "latency")}
    captures = {e["mode"]: e for e in recorded(run, "capture")}
    skipped = {t["nodeid"].split("::")[-1]: t.get("reason") or t.get("longrepr") or "skipped"
               for t in run.get("tests", []) if t.get("outcome") == "skipped"}
    return {"runtime": run.get("runtime", "?"), "device": short_device(run.get("device")),
            "latency": latency, "captures": captures, "harness_cost": recorded(run, "harness_cost"),
            "serving": recorded(run, "serving"), "skipped": skipped,
            "profiles": {(e["mode"], e["batch"]): e for e in recorded(run, "host_profile")}}


def ratio(a, b):
    return None if a is None or not b else a / b


def curves(engine: dict) -> dict:
    """Per batch: eager/FULL step time, FULL step / eager kernel floor (the floor at FULL's shape)."""
    lat, out = engine["latency"], {"speedup": {}, "floor": {}}
    for (mode, batch), entry in lat.items():
        if mode != "full":
            continue
        eager = lat.get(("eager", batch))
        out["speedup"][batch] = ratio(eager and eager["step_ms_median"], entry["step_ms_median"])
        out["floor"][batch] = ratio(entry["step_ms_median"], entry.get("eager_kernel_ms"))
    return out


def table(engines: list[dict]) -> str:
    lines = ["| engine | mode | batch | padded | step ms | replay ms | kernel floor ms | eager/FULL | FULL/floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine in engines:
        shapes = curves(engine)
        for (mode, batch), e in sorted(engine["latency"].items(), key=lambda kv: (kv[0][1], kv[0][0])):
            full = mode == "full"
            lines.append(f"| {engine['runtime']} | {mode} | {batch} | {e['padded']} | {_ms(e['step_ms_median'])} "
                         f"| {_ms(e.get('replay_ms_median'))} | {_ms(e.get('eager_kernel_ms'))} "
                         f"| {_ms(shapes['speedup'].get(batch)) if full else ''} "
                         f"| {_ms(shapes['floor'].get(batch)) if full else ''} |")
    lines += ["", "| engine | capture mode | graphs | seconds | memory MiB |", "|---|---|---:|---:|---:|"]
    for engine in engines:
        for mode, c in sorted(engine["captures"].items()):
            memory = c.get("memory_bytes")
            lines.append(f"| {engine['runtime']} | {mode} | {sum(c['graphs'].values()) if c.get('graphs') else 0} "
                         f"| {c['seconds']:.2f} | {'n/a' if memory is None else f'{memory / 2**20:.1f}'} |")
    lines += ["", "| engine | bare FULL b=1 ms | observed ms | harness ms | fraction | limit |",
              "|---|---:|---:|---:|---:|---:|"]
    for engine in engines:
        for h in engine["harness_cost"]:
            lines.append(f"| {engine['runtime']} | {h['bare_ms']:.4f} | {h['observed_ms']:.4f} | {h['harness_ms']:.4f} "
                         f"| {h['fraction']:.3f} | {h['limit']} |")
    return "\n".join(lines)


def _site(row: dict) -> str:
    place = row["where"] if row["where"] == "~" or not row.get("line") else f"{row['where']}:{row['line']}"
    return f"`{row['function']}` ({place})" if place != "~" else f"`{row['function']}`"  # `<method ...>` is no tag


def host_time(engines: list[dict]) -> str:
    """Per engine and profiled step: the host profile's top functions by own and by cumulative time."""
    lines = ["## Where the host's time goes in one step", "",
             "The engine's own step call under cProfile after the timed rounds (suites/test_step_latency.py, "
             "`host_profile` records); ms and calls per step.", ""]
    for engine in engines:
        if not engine["profiles"]:
            lines += [f"- {engine['runtime']}: not measured (its report has no host_profile records)", ""]
            continue
        for (mode, batch), p in sorted(engine["profiles"].items(), key=lambda kv: (-kv[0][1], kv[0][0])):
            why = gap(p)
            lines += [f"### {engine['runtime']} {mode} b={batch}", "",
                      f"Host step {_ms(p.get('host_step_ms'))} ms unprofiled; the profile saw {p['own_ms']:.3f} ms of "
                      f"own time per step ({p['steps']} steps, {p['profiled_ms']:.3f} ms a step while profiled)"
                      + (f". Not a cause: {why}" if why else "") + ".", ""]
            for title, key in (("by own time", "by_own"), ("by cumulative time", "by_cumulative")):
                lines += [f"| {title} | own ms | cum ms | calls |", "|---|---:|---:|---:|"]
                lines += [f"| {_site(r)} | {r['own_ms']:.3f} | {r['cum_ms']:.3f} | {r['calls']:g} |"
                          for r in p[key][:SHOWN]] + [""]
    return "\n".join(lines)


def causes(engines: list[dict]) -> list[str]:
    """The findings' causes from the host profiles at each engine's largest profiled batch: measured
    facts only, each function cited by its file and line in the engine's code."""
    lines = []
    for engine in engines:
        name, profiles = engine["runtime"], engine["profiles"]
        if not profiles:
            lines.append(f"- {name}: not measured (its report has no host_profile records: a lane before issue 56's "
                         "host profile)")
            continue
        largest = max(batch for _, batch in profiles)
        for mode in ("full", "eager"):
            p = profiles.get((mode, largest))
            if p is None:
                continue
            head = f"- {name} {mode.upper() if mode == 'full' else mode} b={largest}"
            if why := gap(p):
                lines.append(f"{head}: the host profile does not stand for the step: {why}")
                continue
            named = "; ".join(f"{r['own_ms']:.3f} ms in {_site(r)} ({r['calls']:g} calls per step)"
                              for r in p["by_own"][:NAMED])
            half = [r for r in p["by_cumulative"] if r["cum_ms"] >= p["own_ms"] / 2]
            inside = f"; half the step or more is inside {_site(half[-1])} ({half[-1]['cum_ms']:.3f} ms)" if half else ""
            lines.append(f"{head}: of a {_ms(p.get('host_step_ms'))} ms host step ({p['own_ms']:.3f} ms profiled), "
                         f"by own time: {named}{inside}")
    return lines


def unavailable(engines: list[dict]) -> list[str]:
    """Every figure an engine could not give, with its reason, and every skipped test of the lane."""
    lines = []
    for engine in engines:
        for (mode, batch), e in sorted(engine["latency"].items()):
            for name, why in (e.get("unavailable") or {}).items():
                if mode != "eager":
                    lines.append(f"- {engine['runtime']} {mode} b={batch}: {name}: {why}")
        for mode, c in engine["captures"].items():
            for name, why in (c.get("unavailable") or {}).items():
                lines.append(f"- {engine['runtime']} capture {mode}: {name}: {why}")
        for test, why in sorted(engine["skipped"].items()):
            lines.append(f"- {engine['runtime']} {test}: skipped: {why}")
    return lines


def plot(engines: list[dict], out: Path) -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    for name, key, ylabel in (("speedup_eager_over_full.png", "speedup", "eager step / FULL step"),
                              ("full_over_kernel_floor.png", "floor", "FULL step / eager kernel time")):
        figure = Figure(figsize=(8, 4.8), dpi=120)
        FigureCanvasAgg(figure)
        axes = figure.subplots()
        for engine in engines:
            points = sorted((b, v) for b, v in curves(engine)[key].items() if v is not None)
            if points:
                axes.plot(*zip(*points), marker="o", label=f"{engine['runtime']} ({engine['device']})")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("decode batch")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.savefig(out / name)
        written.append(name)
    figure = Figure(figsize=(8, 4.8), dpi=120)
    FigureCanvasAgg(figure)
    seconds, memory = figure.subplots(1, 2)
    labels = [f"{e['runtime']} {m}" for e in engines for m in sorted(e["captures"])]
    caps = [e["captures"][m] for e in engines for m in sorted(e["captures"])]
    seconds.barh(labels, [c["seconds"] for c in caps])
    seconds.set_xlabel("capture seconds")
    memory.barh(labels, [(c.get("memory_bytes") or 0) / 2**20 for c in caps])
    memory.set_xlabel("graph memory MiB (0: n/a)")
    memory.set_yticklabels([])
    figure.tight_layout()
    figure.savefig(out / "capture_cost.png")
    return written + ["capture_cost.png"]


def findings(engines: list[dict]) -> str:
    """A skeleton: the measured facts, one line each; the causes from the host profiles where the
    reports hold them (the rest is for a person to measure and cite)."""
    lines = ["# Engines side by side: findings", "",
             "Rendered by scripts/engines_report.py from: " + ", ".join(e["runtime"] for e in engines) + ".",
             "Only measured facts below; a cause is added only with its measurement and the engine's code cited.", ""]
    for engine in engines:
        shapes = curves(engine)
        for batch in sorted(shapes["speedup"]):
            lines.append(f"- {engine['runtime']} b={batch}: eager/FULL {_ms(shapes['speedup'][batch])}, "
                         f"FULL/floor {_ms(shapes['floor'].get(batch))}")
        for h in engine["harness_cost"]:
            lines.append(f"- {engine['runtime']}: at batch 1 the harness adds [{h['harness_ms']:.4f} ms to a bare FULL "
                         f"step of {h['bare_ms']:.4f} ms, a fraction of {h['fraction']:.3f}](table.md)")
    lines += ["", "## Figures the engines could not give", ""] + (unavailable(engines) or ["- none"])
    lines += ["", "## Causes: where the host's time goes in one step (host profile; rows in table.md)", ""]
    lines += causes(engines) + ["", "Still to measure: launches outside the graph, copies."]
    return "\n".join(lines) + "\n"


def load(path: str) -> dict:
    try:
        return upgrade(json.loads(Path(path).read_text()), path)
    except (OSError, json.JSONDecodeError) as error:
        raise ReportFormatError(f"{path}: not a readable JSON report ({error}); give the conformance-*.json "
                                "a benchmark lane wrote") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="conformance-*.json of each engine's benchmark lane")
    parser.add_argument("--out", default="reports/h200/engines")
    args = parser.parse_args(argv)
    try:
        engines = [engine_rows(load(path)) for path in args.reports]
    except ReportFormatError as error:
        print(f"engines_report: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("# Engines side by side\n\n" + table(engines) + "\n\n" + host_time(engines) + "\n")
    plot(engines, out)
    readme = out / "README.md"
    if not readme.exists():  # a person's findings are never overwritten
        readme.write_text(findings(engines))
    else:
        (out / "findings.generated.md").write_text(findings(engines))
    print(f"engines_report: {len(engines)} engines -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
