"""Render run reports (the JSON files RunReport writes) as Markdown for people, with PNG plots.

    python -m harness.reports.render RUN.json [RUN.json ...] --out DIR [--baseline BASELINE.json ...]
        [--threshold 0.10] [--fail-on-regression] [--title TEXT]

writes DIR/summary.md (and plots beside it) and prints its path. Several runs, of one runtime or
of many, share one conformance matrix. The JSON is the source of truth: everything here is
derived from it, and a property a run did not record is named as missing, never invented.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

# compare, counted and describe_regression are part of this module's interface: the plugin and the CLI use them.
from harness.reports.measurements import (SLOW_PHASE, batch_invariance_rows, compare, counted, crossover, describe_regression, distinct,
                           host_phase, latency_rows, noise, padding_buckets, recorded, run_labels, waste_by_batch,
                           waste_line)
from harness.reports.records import ReportFormatError, upgrade
from harness.reliability.safe import describe_exception
from harness.vocabulary import CONFIG_MODES as REQUESTED
from harness.vocabulary import SUPPORT_LEVELS as SUPPORTS

# How a cell lists them ("interrupted" and "running": tests a stopped or crashed run never finished;
# "not run": tests no process ran, the one that would have run them having died).
OUTCOME_ORDER = ["failed", "error", "interrupted", "running", "not run", "xpassed", "passed", "xfailed", "skipped"]
# Each measurement, and the suite that records it.
MEASUREMENTS = {"grid": "test_padding.py", "resolution": "test_mode_resolution.py",
                "capture": "test_capture_accounting.py", "launches": "test_launch_overhead.py",
                "anchor": "test_numerical_anchor.py", "latency": "test_step_latency.py",
                "batch1_speedup": "test_step_latency.py", "serving": "test_serving.py",
                "batch_invariance": "test_batch_invariance.py"}
SERVING_COLUMNS = [  # vLLM's benchmark_serving figures, in the order PR #20059 printed them
    ("requests", "requests", 0), ("seconds", "duration (s)", 2), ("steps", "steps", 0),
    ("requests_s", "req/s", 2), ("output_tok_s", "output tok/s", 2), ("total_tok_s", "total tok/s", 2),
    ("mean_ttft_ms", "mean TTFT (ms)", 2), ("mean_tpot_ms", "mean TPOT (ms)", 2),
    ("p99_tpot_ms", "P99 TPOT (ms)", 2), ("mean_itl_ms", "mean ITL (ms)", 2),
]
CROSSOVERS = (1.5, 1.1)


class RunFileError(Exception):
    """A run file that is missing or is not a run report; the message says which and why."""


class Rendered(NamedTuple):
    markdown: Path
    plots: list[Path]
    regressions: list[dict]


def load_run(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RunFileError(f"cannot read run report {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunFileError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list) or "runtime" not in data \
            or not all(isinstance(t, dict) and isinstance(t.get("nodeid"), str) for t in data["tests"]):
        raise RunFileError(f"{path} is not a conformance run report (it needs 'runtime' and a 'tests' list of "
                           "objects with a 'nodeid')")
    try:
        return upgrade(data, str(path))
    except ReportFormatError as exc:
        raise RunFileError(str(exc)) from None


# -- Markdown helpers ---------------------------------------------------------------------------
def file_stem(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-")


def _table(header: list[str], rows: list[list]) -> list[str]:
    def cell(value) -> str:
        return "—" if value is None else str(value).replace("|", "\\|").replace("\n", " ")
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows), ""]


def _num(value, digits: int = 2) -> str | None:
    return None if value is None else f"{value:,.{digits}f}"


def _ratio(value) -> str | None:
    return None if value is None else f"{value:.2f}x"


# -- conformance --------------------------------------------------------------------------------
def matrix_cell(tests: list[dict]) -> str:
    counts = Counter(t["outcome"] for t in tests)
    if counts and set(counts) == {"skipped"}:
        reason = (tests[0].get("reason") or "").removeprefix("Skipped: ").strip()
        return f"skipped ({reason[:60] + '…' if len(reason) > 60 else reason})"
    return ", ".join(f"{counts[o]} {o}" for o in OUTCOME_ORDER if counts[o])


def reproduction(test: dict, runtime: str) -> str:
    for line in (test.get("reason") or "").splitlines():
        if line.strip().startswith("reproduce:"):
            return line.strip().removeprefix("reproduce:").strip()
    return f"pytest '{test['nodeid']}' --runtime {runtime}"


def _run_header(run: dict, label: str) -> list[str]:
    seconds = run.get("seconds") or 0
    duration = f"{seconds:.1f} s" if seconds < 120 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    capabilities = [k for k, v in (run.get("capabilities") or {}).items() if v is True]
    commit = run.get("git_commit")
    return [
        f"### {label}", "",
        f"- runtime: {run['runtime']} {run.get('version', '')}",
        f"- device: {run.get('device')}",
        f"- torch: {run.get('torch')}{' (' + run['torch_build'] + ')' if run.get('torch_build') else ''}, python {run.get('python')}, commit {commit[:12] if commit else 'unknown'}"
        + (" with uncommitted changes to tracked files (the suites' digest below says which code ran)"
           if run.get("git_tree_changed") else ""),
        *([f"- harness: {run['harness_version']}, suites {run.get('suites_digest', '')[:12]} "
           f"({len(run.get('suite_files') or {})} files)"] if run.get("harness_version") else []),
        f"- capabilities: {', '.join(capabilities) or 'none'}",
        *([f"- precision: {(run.get('capabilities') or {}).get('precision', 'not recorded (a report older than the declaration)')} "
             "(declared; the numerical anchor's tolerance follows it, docs/spec.md section 10)"]
          if (run.get("capabilities") or {}).get("execution") else []),
        f"- {'complete' if run.get('complete') else 'INCOMPLETE (the run stopped early)'}; {duration}; "
        + (", ".join(f"{n} {k}" for k, n in sorted((run.get("summary") or {}).items())) or "no tests"),
        *([f"- ran {ran_of_collected(run)}"] if run.get("collected") else []),
        *([f"- not applicable, deselected (--only-declared): {n} tests: {why}"
           for why, n in sorted(run["not_applicable"].items(), key=lambda x: -x[1])] if run.get("not_applicable") else []),
        *([f"- command: `pytest {' '.join(run['args'])}`"] if run.get("args") else []), "",
    ]


def ran_of_collected(run: dict) -> str:
    """How many of the collected tests ran (not skipped, and reached before the run ended)."""
    ran = sum(n for outcome, n in (run.get("summary") or {}).items() if outcome not in ("skipped", "not run"))
    collected = run["collected"]
    return f"{ran} of the {collected} collected tests ({100 * ran / collected:.0f}%; the rest skipped or not reached)"


def _matrix(runs: list[dict], labels: list[str]) -> list[str]:
    by_suite: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for index, run in enumerate(runs):
        for test in run["tests"]:
            by_suite[test["nodeid"].split("::")[0]][index].append(test)
    rows = [[suite, *(matrix_cell(by_suite[suite][i]) if by_suite[suite][i] else "not run"
                      for i in range(len(runs)))] for suite in sorted(by_suite)]
    return ["## Conformance matrix", "", *_table(["suite", *labels], rows)]


def _failures(runs: list[dict], labels: list[str]) -> list[str]:
    lines = []
    for run, label in zip(runs, labels):
        for test in run["tests"]:
            if test["outcome"] not in ("failed", "error"):
                continue
            reason = "\n".join((test.get("reason") or "(no reason recorded)").splitlines()[-25:])
            suffix = f" ({label})" if len(runs) > 1 else ""
            lines += [f"### {test['nodeid']}{suffix}", "", f"{test['outcome']}; reproduce:", "",
                      "```sh", reproduction(test, run["runtime"]), "```", "", "```", reason, "```", ""]
    return ["## Failures", "", *lines] if lines else []


def _known_failures(runs: list[dict], labels: list[str]) -> list[str]:
    rows = [[f"`{t['nodeid']}`", *( [label] if len(runs) > 1 else []), (t.get("reason") or "").replace("\n", " ")[:300]]
            for run, label in zip(runs, labels) for t in run["tests"] if t["outcome"] == "xfailed"]
    if not rows:
        return []
    return ["## Known failures", "", *_table(["test", *(["run"] if len(runs) > 1 else []), "reason"], rows)]


# -- measurements -------------------------------------------------------------------------------
def _padding(grid: dict) -> list[str]:
    sizes = sorted(grid["sizes"])
    buckets = padding_buckets(sizes)
    worst = max(buckets, key=lambda b: b["percent"])
    rows = [[f"{b['first']}..{b['size']}" if b["first"] < b["size"] else str(b["size"]), b["size"], b["waste"],
             f"{b['percent']:.2f}%"] for b in buckets]
    # The bucket table is long (51 rows for vLLM's default grid), so it folds away on GitHub.
    return [f"Grid `{grid.get('config', '?')}`: {len(sizes)} sizes, largest {sizes[-1]}; worst waste "
            f"{worst['percent']:.2f}% (batch {worst['first']} -> {worst['size']}).", "",
            f"SPEC check: {waste_line(sizes)}", "",
            f"<details><summary>worst waste in each of the {len(buckets)} buckets</summary>", "",
            *_table(["batches", "padded to", "worst waste (tokens)", "worst waste (%)"], rows), "</details>", ""]


def _resolution(entries: list[dict]) -> list[str]:
    lines, variants = [], defaultdict(dict)
    for e in (e for e in entries if "requested" in e and "support" in e):
        variants[e.get("variant", "default")][(e["requested"], e["support"])] = e.get("resolved")
    for variant in sorted(variants, key=lambda v: (v != "default", v)):
        table = variants[variant]
        supports = list(SUPPORTS) if variant == "default" else [s for s in SUPPORTS if any(k[1] == s for k in table)]
        supports += sorted({k[1] for k in table} - set(supports))
        requested = [m for m in REQUESTED if any(k[0] == m for k in table)]  # a list: extended below
        requested += sorted({k[0] for k in table} - set(requested))
        lines += [f"Variant `{variant}` (requested mode x backend support):", "",
                  *_table(["requested \\ support", *supports], [[m, *(table.get((m, s)) for s in supports)]
                                                              for m in requested])]
    return lines


def _memory(e: dict) -> str:
    memory = e.get("memory_bytes")
    if memory is None:
        return "not measured"
    if e.get("graph_backend") == "emulated":
        return f"{memory / 2**20:.2f} MiB held by emulated graphs (not GPU memory)"
    return f"{memory / 2**30:.2f} GiB" if memory > 0 else f"{memory} bytes (not a plausible measurement)"


def _capture(entries: list[dict]) -> list[str]:
    kinds = sorted({k for e in entries for k in (e.get("graphs") or {})})
    rows = [[e.get("mode"), e.get("preset"), e.get("graph_backend", "cuda"),
             *((e.get("graphs") or {}).get(k) for k in kinds), e.get("observed_captures"),
             _num(e.get("seconds"), 2) + (" (emulator)" if e.get("graph_backend") == "emulated" else ""),
             _memory(e)] for e in entries]
    return _table(["mode", "preset", "graph backend", *(f"{k} graphs" for k in kinds), "graphs seen captured",
                   "capture (s)", "graph memory"], rows)


def _launches(entries: list[dict]) -> list[str]:
    rows = []
    for e in entries:
        emulated = e.get("graph_backend") == "emulated"
        for mode, counts in (e.get("counts") or {}).items():
            rows.append([e.get("batch"), mode, counts.get("kernels"), counts.get("graphs"),
                         counts.get("ops_in_graphs") if emulated else "n/a (CUDA)", counts.get("copies"),
                         "emulator: aten ops" if emulated else "CUDA profiler"])
    return _table(["batch", "mode", "kernels / ops outside graphs", "graph launches", "ops inside graphs", "copies",
                   "counted by"], rows)


def latency_headline(rows: list[dict], run: dict | None = None) -> list[str]:
    by_batch = {r["batch"]: r for r in rows}
    speedups = [f"{by_batch[b]['speedup']:.2f}x at batch {b}" for b in (1, 64, 256)
                if b in by_batch and by_batch[b]["speedup"] is not None]
    lines = [f"- eager / FULL speed-up: {', '.join(speedups)}" if speedups else "- eager / FULL speed-up: not measured"]
    first = by_batch.get(1)
    if first and first["full_over_kernel"] is not None:
        parts = [f"step (then wait) {first['full_over_kernel']:.2f}x"]
        if first["pipelined_over_kernel"] is not None:
            parts.append(f"step in a stream {first['pipelined_over_kernel']:.2f}x")
        if first["replay_over_kernel"] is not None:
            parts.append(f"its graph replay (device time, in a stream) {first['replay_over_kernel']:.2f}x")
        phase = host_phase(run, "full", 1) if run else None
        slow = (f" (timed while the host ran {phase:.1f}x slower than over the run: the step, not its replay, "
                "moves with the host)") if phase and phase >= SLOW_PHASE else ""
        lines.append(f"- FULL at batch 1, against the summed GPU kernel time of an eager step: {', '.join(parts)}{slow}")
    for threshold in CROSSOVERS:
        batch = crossover(rows, threshold)
        lines.append(f"- crossover: eager / FULL below {threshold}x " + (f"from batch {batch}" if batch else "not reached"))
    spread = noise(run) if run else {}
    if spread:
        lines.append(f"- noise: coefficient of variation of the step timings, median {100 * spread['median_cv']:.1f}%, "
                     f"largest {100 * spread['largest_cv']:.1f}% ({spread['figures']} figures); a regression must "
                     "exceed the threshold and twice the noise")
    return lines


def _latency(run: dict, rows: list[dict]) -> list[str]:
    table = [[r["batch"], r["padded"], _num(r["eager"], 3), _num(r["piecewise"], 3), _num(r["full"], 3),
              _num(r["full_pipelined"], 3), _num(r["full_replay"], 3), _num(r["floor"], 3), _ratio(r["speedup"]),
              _ratio(r["full_over_kernel"]), _ratio(r["pipelined_over_kernel"])] for r in rows]
    lines = [*latency_headline(rows, run), ""] if rows else []
    for check in recorded(run, "batch1_speedup"):
        lines += [f"Batch-1 check: eager {check['eager_ms']:.3f} ms, FULL {check['full_ms']:.3f} ms, "
                  f"{check['speedup']:.2f}x.", ""]
    if rows:
        lines += _table(["batch", "padded", "eager (ms)", "PIECEWISE (ms)", "FULL (ms)", "FULL in a stream (ms)",
                         "FULL graph replay (ms)", "eager kernel floor (ms)", "eager / FULL", "FULL / kernel",
                         "FULL in a stream / kernel"], table)
    return lines


def _serving(entries: list[dict]) -> list[str]:
    rows = [[e.get("mode"), *(_num(e.get(key), digits) for key, _, digits in SERVING_COLUMNS)] for e in entries]
    lines = _table(["mode", *(title for _, title, _ in SERVING_COLUMNS)], rows)
    by_mode = {e.get("mode"): e for e in entries}
    base, graph = by_mode.get("piecewise"), by_mode.get("full_and_piecewise")
    if base and graph and base.get("output_tok_s") and base.get("mean_tpot_ms") and graph.get("mean_tpot_ms"):
        gain = 100 * (graph["output_tok_s"] / base["output_tok_s"] - 1)
        tpot = 100 * (graph["mean_tpot_ms"] / base["mean_tpot_ms"] - 1)
        lines += [f"FULL_AND_PIECEWISE vs PIECEWISE: output tok/s {gain:+.1f}%, mean TPOT {tpot:+.1f}% "
                  "(vLLM PR #20059 measured +4.9% and -3.0% with FA2).", ""]
    return lines


def _batch_invariance(rows: list[dict]) -> list[str]:
    return _table(["padded", "mode", "batches", "largest difference"],
                  [[r["padded"], r["mode"], ", ".join(map(str, r["batches"])), f"{r['difference']:.3g}"] for r in rows])


def _data_parallel(run: dict) -> list[str]:
    """Each recorded data-parallel step, per test: every rank's batch, what the ranks ran, and the
    padding the consensus cost (tokens beyond what each rank would have run alone)."""
    lines = []
    for test in run.get("tests", []):
        steps = [r for r in test.get("records") or () if r.get("kind") == "data_parallel_step"]
        if steps:
            lines += [f"`{test['nodeid'].split('::')[-1]}`", ""]
            header = ["step", "each rank's batch", "agreed mode", "padded size per rank", "padding waste (tokens)"]
            lines += _table(header, [[s["step"], "; ".join(f"rank {i}: {b}" for i, b in enumerate(s["batches"])),
                                      s["agreed_mode"], ", ".join(map(str, s["padded"])), s["waste_tokens"]]
                                     for s in steps])
    return lines


def _measurements(run: dict, label: str, plots: list[tuple[str, str]]) -> list[str]:
    latency, invariance = latency_rows(run), batch_invariance_rows(run)
    capture, launches, serving = (distinct(recorded(run, name)) for name in ("capture", "launches", "serving"))
    sections = [
        ("Padding", [line for grid in distinct(recorded(run, "grid")) for line in _padding(grid)]),
        ("Mode resolution", _resolution(distinct(recorded(run, "resolution")))),
        ("Capture", _capture(capture) if capture else []),
        ("Launch counts per step", _launches(launches) if launches else []),
        ("Step latency", _latency(run, latency)),
        ("Serving", _serving(serving) if serving else []),
        ("Batch invariance (padded graph vs unpadded eager, largest |difference|)",
         _batch_invariance(invariance) if invariance else []),
        ("Data parallel", _data_parallel(run)),
        ("Plots", [line for caption, name in plots for line in (f"![{caption}]({name})", "")]),
    ]
    lines = [f"## Measurements: {label}", ""]
    for title, body in sections:
        if body:
            lines += [f"### {title}", "", *body]
    recorded_kinds = {r.get("kind") for t in run["tests"] for r in t.get("records") or ()}
    missing = [f"{kind} ({why})" for kind, suite in MEASUREMENTS.items() if kind not in recorded_kinds
               for why in [_why_not_recorded(run, suite)]]
    if missing:
        lines += [f"Not recorded in this run: {'; '.join(missing)}.", ""]
    return lines


def _why_not_recorded(run: dict, suite: str) -> str:
    outcomes = Counter(t["outcome"] for t in run["tests"] if t["nodeid"].split("::")[0].endswith(suite))
    if not outcomes:
        return f"{suite} did not run"
    if set(outcomes) == {"skipped"}:
        return f"{suite} was skipped"
    return f"{suite} ran ({', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))}) but recorded nothing"


def _regressions(regressions: list[dict], threshold: float, runs: list[dict]) -> list[str]:
    lines = ["## Regressions against baseline", ""]
    if not regressions:
        # Say so when there was nothing to compare, so "none" is not read as "all held".
        figures = any(recorded(run, "latency") or recorded(run, "serving") for run in runs)
        return lines + [f"none beyond {100 * threshold:.0f}%" + ("." if figures else
                        " (no latency or serving figures in this run to compare)."), ""]
    code = counted(regressions)
    host = [r for r in regressions if r not in code]
    lines += [f"{len(code) or 'none'} beyond {100 * threshold:.0f}%" + (":" if code else "."), ""]
    lines += [f"- {describe_regression(r)}" for r in code] + ([""] if code else [])
    if host:
        lines += [f"{len(host)} more beyond it, paced by the host, whose reference loop ran as much slower "
                  "(not counted as regressions):", "", *(f"- {describe_regression(r)}" for r in host), ""]
    return lines


# -- the document -------------------------------------------------------------------------------
def render_markdown(runs, *, title: str | None = None, plots: dict | None = None,
                    regressions: list[dict] | None = None, threshold: float = 0.10) -> str:
    """The whole summary. `plots` maps a run label to (caption, relative file name) pairs;
    `regressions` None means no baseline was given, so no comparison section."""
    runs = [runs] if isinstance(runs, dict) else list(runs)
    labels = run_labels(runs)
    title = title or "Conformance report: " + ", ".join(dict.fromkeys(f"{r['runtime']} {r.get('version', '')}".strip()
                                                                       for r in runs))
    lines = [f"# {title}", ""]
    lines += [f"> INCOMPLETE: {label} stopped early; it covers only the tests that ran.\n"
              for run, label in zip(runs, labels) if not run.get("complete")]
    lines += ["## Runs", ""]
    for run, label in zip(runs, labels):
        lines += _run_header(run, label)
    lines += _matrix(runs, labels) + _failures(runs, labels) + _known_failures(runs, labels)
    if regressions is not None:
        lines += _regressions(regressions, threshold, runs)
    for run, label in zip(runs, labels):
        lines += _measurements(run, label, (plots or {}).get(label, []))
    return "\n".join(lines).rstrip("\n") + "\n"


def draw_plots(run: dict, label: str, directory: Path) -> list[tuple[str, str]]:
    """PNG plots for one run into `directory`: (caption, file name) pairs, none without data."""
    rows, grids = latency_rows(run), distinct(recorded(run, "grid"))
    if not rows and not grids:
        return []
    from harness.reports import plots  # matplotlib is imported only when there is something to draw

    stem, drawn = file_stem(label), []
    if rows:
        drawn.append(("step latency vs batch", plots.latency(rows, label, directory / f"latency-{stem}.png").name))
        drawn.append(("speed-up over eager vs batch", plots.speedup(rows, label, directory / f"speedup-{stem}.png").name))
    if grids:
        waste = {grid.get("config", "?"): waste_by_batch(grid["sizes"]) for grid in grids}
        drawn.append(("padding waste vs batch", plots.padding_waste(waste, label, directory / f"padding-waste-{stem}.png").name))
    return drawn


def write_report(runs: list[dict], directory, name: str = "summary.md", *, regressions: list[dict] | None = None,
                 threshold: float = 0.10, title: str | None = None, plots: bool = True) -> Rendered:
    """The Markdown file and its plots (none where `plots` is false) in `directory`; `regressions` as
    from compare(), None for no baseline."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    drawn = {label: draw_plots(run, label, directory) for run, label in zip(runs, run_labels(runs))} if plots else {}
    path = directory / name
    path.write_text(render_markdown(runs, title=title, plots=drawn, regressions=regressions, threshold=threshold))
    return Rendered(path, [directory / n for pairs in drawn.values() for _, n in pairs], regressions or [])


# pytest's exit status for a usage error, so a CI step reads the tools and the suites alike.
USAGE_ERROR = 4


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(USAGE_ERROR, f"error: {message} (see {self.prog} --help)\n")


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    """0: rendered; 1: a regression under --fail-on-regression; 4: bad arguments or a bad run file."""
    parser = _Parser(prog="python -m harness.reports.render", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN.json", help="run reports written by --report-dir")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for summary.md and the plots")
    parser.add_argument("--baseline", nargs="+", action="extend", default=[], metavar="BASELINE.json",
                        help="run reports to compare latency and serving figures against")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="a regression is worse than baseline by more than this fraction (default 0.10)")
    parser.add_argument("--fail-on-regression", action="store_true", help="exit 1 when there is a regression")
    parser.add_argument("--title", help="the document's title")
    args = parser.parse_args(argv)
    if not (args.threshold >= 0 and args.threshold != float("inf")):
        return _usage_error(f"--threshold must be a fraction >= 0 (0.10 is 10%), got {args.threshold}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        return _usage_error(f"--out {args.out}: that is a file; name a directory (it is created if missing)")
    try:
        runs = [load_run(p) for p in args.runs]
        baseline = [load_run(p) for p in args.baseline]
    except RunFileError as exc:
        return _usage_error(f"{exc}; name a JSON report written by pytest --report-dir")
    try:
        regressions = compare(runs, baseline, args.threshold) if baseline else None
        rendered = write_report(runs, args.out, regressions=regressions, threshold=args.threshold, title=args.title)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return _usage_error(f"a run report is malformed ({describe_exception(exc)}); write it again with pytest "
                            "--report-dir")
    except OSError as exc:
        return _usage_error(f"--out {args.out}: cannot write there ({exc.strerror or exc}); name a directory you can write")
    print(rendered.markdown)
    code = counted(rendered.regressions)
    for regression in rendered.regressions:
        prefix = "regression" if regression in code else "host-paced, not counted"
        print(f"{prefix}: {describe_regression(regression)}", file=sys.stderr)
    return 1 if args.fail_on_regression and code else 0


if __name__ == "__main__":
    from harness.reliability import pipes

    sys.exit(pipes.run(main))  # quiet when the reader closes the pipe
