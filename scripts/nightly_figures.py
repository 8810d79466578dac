"""The headline figures of each nightly GPU run, and their history over the committed nightlies
(`reports/h200/nightly/history.json`, used by scripts/figures.py).

A nightly is three reports under reports/h200/nightly/: the suites on CUDA graphs and the benchmark
lane for `small` and `medium`. Its figures are computed here from those JSON files with the same
functions the rendered summary uses (harness.reports.measurements), so a figure in the docs reads
as it does in the nightly's own summary.md. Each nightly in the history is identified by when it
started; `--history-from-git` reads every version of the reports git has (one per committed run).
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from harness.reports import measurements, records

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = Path("reports/h200/nightly")
HISTORY = NIGHTLY / "history.json"
PARTS = {"suites": "suites/conformance-reference.json", "small": "bench-small/conformance-reference.json",
         "medium": "bench-medium/conformance-reference.json"}
BATCHES = (1, 64, 256)


def _percent_change(new, old) -> float | None:
    return 100 * (new / old - 1) if new and old else None


def bench_figures(run: dict) -> dict:
    rows = {r["batch"]: r for r in measurements.latency_rows(run)}
    latency = {(e.get("mode"), e.get("batch")): e for e in measurements.recorded(run, "latency")}
    capture = next((c for c in measurements.recorded(run, "capture") if c.get("mode") == "FULL_AND_PIECEWISE"), {})
    serving = {s.get("mode"): s for s in measurements.recorded(run, "serving")}
    base, graphs = serving.get("piecewise", {}), serving.get("full_and_piecewise", {})
    first, noise = rows.get(1, {}), measurements.noise(run)
    return {
        "seconds": run.get("seconds"), "summary": run.get("summary"),
        "speedup": {str(b): rows[b]["speedup"] for b in BATCHES if b in rows},
        "eager_ms": {str(b): rows[b]["eager"] for b in BATCHES if b in rows},
        "replay_ms": {str(b): rows[b]["full_replay"] for b in BATCHES if b in rows},
        "eager_kernels_b1": latency.get(("eager", 1), {}).get("kernel_launches"),
        "full_over_kernel": first.get("full_over_kernel"), "pipelined_over_kernel": first.get("pipelined_over_kernel"),
        "replay_over_kernel": first.get("replay_over_kernel"),
        "capture": {"full": (capture.get("graphs") or {}).get("FULL"), "piecewise": (capture.get("graphs") or {}).get("PIECEWISE"),
                    "seconds": capture.get("seconds"), "bytes": capture.get("memory_bytes")},
        "serving": {"output_tok_s": _percent_change(graphs.get("output_tok_s"), base.get("output_tok_s")),
                    "mean_tpot": _percent_change(graphs.get("mean_tpot_ms"), base.get("mean_tpot_ms"))},
        "noise": {"median": noise.get("median_cv"), "largest": noise.get("largest_cv")},
    }


def figures(runs: dict[str, dict]) -> dict:
    """One nightly's figures from its three reports (part name -> report)."""
    suites = runs["suites"]
    return {"started": runs["small"]["started"],
            "date": time.strftime("%Y-%m-%d", time.gmtime(runs["small"]["started"])),
            "code": runs["small"].get("git_commit"),
            "suites": {"summary": suites.get("summary"), "seconds": suites.get("seconds")},
            "small": bench_figures(runs["small"]), "medium": bench_figures(runs["medium"])}


def from_tree(root: Path = ROOT) -> dict:
    return figures({part: records.upgrade(json.loads((root / NIGHTLY / path).read_text()))
                    for part, path in PARTS.items()})


def from_git(root: Path = ROOT) -> list[dict]:
    """Every committed nightly's figures, oldest first (one per distinct run)."""
    log = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--", str(NIGHTLY / PARTS["small"])],
                         capture_output=True, text=True, check=True).stdout.split()
    runs = {}
    for commit in reversed(log):
        reports = {part: records.upgrade(json.loads(subprocess.run(
            ["git", "-C", str(root), "show", f"{commit}:{NIGHTLY / path}"], capture_output=True, text=True,
            check=True).stdout)) for part, path in PARTS.items()}
        found = figures(reports)
        runs[found["started"]] = {**found, "committed_in": commit}
    return sorted(runs.values(), key=lambda r: r["started"])


def load_history(root: Path = ROOT) -> list[dict]:
    path = root / HISTORY
    return json.loads(path.read_text())["runs"] if path.is_file() else []


def save_history(runs: list[dict], root: Path = ROOT) -> None:
    text = json.dumps({"about": "the headline figures of every committed nightly (scripts/nightly_figures.py); "
                                "rebuilt by `python scripts/figures.py --history-from-git`, extended by "
                                "`python scripts/figures.py`", "runs": runs}, indent=1, sort_keys=True)
    (root / HISTORY).write_text(text + "\n")


def with_current(history: list[dict], current: dict) -> list[dict]:
    """The history with the tree's nightly in it (added, or its figures brought up to date)."""
    kept = [run for run in history if run["started"] != current["started"]]
    mine = next((run for run in history if run["started"] == current["started"]), {})
    entry = {**current, **({"committed_in": mine["committed_in"]} if mine.get("committed_in") else {})}
    return sorted([*kept, entry], key=lambda r: r["started"])


def without_provenance(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "committed_in"}
