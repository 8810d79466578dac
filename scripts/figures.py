"""Measured figures in the docs, from the committed reports: rendered sections, and the check that no
figure disagrees with the report it comes from.

    python scripts/figures.py                     # re-render every generated section (after new reports)
    python scripts/figures.py --check             # what tests/test_figures.py checks; exit 1 naming each problem
    python scripts/figures.py --history-from-git  # rebuild reports/h200/nightly/history.json from git's log

After a new nightly is copied into reports/h200/nightly/ (or new CPU logs into reports/cpu/), one
run of the first command adds it to the history and re-renders every section that quotes it. A
generated section sits between two comments and is never edited by hand:

    <!-- figures: nightly (rendered by python scripts/figures.py from the committed reports) -->
    ...
    <!-- /figures -->

Figures elsewhere cite their report as a link (scripts/citations.py has the rule), and name the
commit the cited run ran (its `git_commit`) in their paragraph, or say it is older; figures that
move between runs are given as the newest with the range over every committed run beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]

import citations  # noqa: E402
import nightly_figures as nightly  # noqa: E402

MARKER = re.compile(r"(<!-- figures: (?P<name>[\w-]+) .*?-->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
CPU = Path("reports/cpu")
MATRIX = Path("reports/h200/matrix")
# Files others were rewriting when this check was written: their figures wait for the lead's re-render.
PENDING = ()
# Reports in their own right, each written whole by its script from its JSON (tests/test_figures.py re-renders it).
GENERATED_REPORTS = ("reports/policy-compare/README.md",)


def docs(root: Path = ROOT) -> list[Path]:
    found = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "plugins").glob("*/README.md")),
             *sorted((root / "reports").rglob("README.md"))]
    return [path for path in found if path.is_file()]


def link(doc: Path, target: Path, text: str) -> str:
    return f"[{text}]({os.path.relpath(target, doc.parent)})"


# -- ranges -----------------------------------------------------------------------------------
def spread(values, fmt: str, unit: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "not measured"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    if low == high:
        return f"{low}{unit}"
    return f"{low}{unit} to {high}{unit}" if low[0] in "+-" else f"{low}-{high}{unit}"


def ratio(value) -> str:
    return "not measured" if value is None else f"{value:.2f}x"


def pct(value) -> str:
    return "not measured" if value is None else f"{value:+.1f}%"


def gib(value) -> str:
    return "not measured" if value is None else f"{value / 2**30:.2f} GiB"


OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")


def counts(summary: dict | None) -> str:
    summary = summary or {}
    return ", ".join(f"{summary[o]} {o}" for o in (*OUTCOMES, *sorted(set(summary) - set(OUTCOMES))) if summary.get(o))


# -- sections ---------------------------------------------------------------------------------
def nightly_section(doc: Path, root: Path) -> str:
    runs = nightly.load_history(root)
    new = runs[-1]
    summary = root / nightly.NIGHTLY / "summary.md"

    def over(key, fmt, unit="", presets=("small", "medium")):
        return " / ".join(spread([key(run[p]) for run in runs], fmt, unit) for p in presets)

    def each(key, presets=("small", "medium")):
        return " / ".join(key(new[p]) for p in presets)

    speed = lambda b: lambda f: (f["speedup"] or {}).get(str(b))  # noqa: E731
    rows = [
        ["reference suites on CUDA graphs (`--benchmark-skip`)",
         f"{counts(new['suites']['summary'])} in {new['suites']['seconds']:.1f} s",
         spread([r["suites"]["seconds"] for r in runs], "{:.1f}", " s")],
        ["benchmark lane, `small` / `medium`", each(lambda f: f"{counts(f['summary'])} in {f['seconds']:.1f} s"),
         over(lambda f: f["seconds"], "{:.1f}", " s")],
        *[[f"eager / FULL step at batch {b}, `small` / `medium`", each(lambda f, b=b: ratio(speed(b)(f))),
           over(speed(b), "{:.2f}", "x")] for b in nightly.BATCHES],
        *[[f"FULL step at batch 1 / eager kernel floor: {what}, `small` / `medium`", each(lambda f, k=key: ratio(f[k])),
           over(lambda f, k=key: f[k], "{:.2f}", "x")]
          for what, key in (("step then wait", "full_over_kernel"), ("in a stream", "pipelined_over_kernel"),
                            ("its graph replay", "replay_over_kernel"))],
        ["serving, FULL_AND_PIECEWISE vs PIECEWISE: output tok/s, `small` / `medium`",
         each(lambda f: pct(f["serving"]["output_tok_s"])), over(lambda f: f["serving"]["output_tok_s"], "{:+.1f}", "%")],
        ["serving, FULL_AND_PIECEWISE vs PIECEWISE: mean TPOT, `small` / `medium`",
         each(lambda f: pct(f["serving"]["mean_tpot"])), over(lambda f: f["serving"]["mean_tpot"], "{:+.1f}", "%")],
        ["capture, FULL_AND_PIECEWISE: graphs (FULL + PIECEWISE), `small` / `medium`",
         each(lambda f: f"{f['capture']['full']} + {f['capture']['piecewise']}"), "the same in every nightly"
         if len({(r["small"]["capture"]["piecewise"], r["medium"]["capture"]["piecewise"]) for r in runs}) == 1 else "varies"],
        ["capture, FULL_AND_PIECEWISE: time, `small` / `medium`", each(lambda f: f"{f['capture']['seconds']:.2f} s"),
         over(lambda f: f["capture"]["seconds"], "{:.2f}", " s")],
        ["capture, FULL_AND_PIECEWISE: graph memory, `small` / `medium`", each(lambda f: gib(f["capture"]["bytes"])),
         over(lambda f: f["capture"]["bytes"] and f["capture"]["bytes"] / 2**30, "{:.2f}", " GiB")],
        ["noise: median coefficient of variation of the step timings, `small` / `medium`",
         each(lambda f: f"{100 * f['noise']['median']:.1f}%"),
         over(lambda f: f["noise"]["median"] and 100 * f["noise"]["median"], "{:.1f}", "%")],
    ]
    lines = [f"Newest nightly: {new['date']}, of the code at {new['code'][:7]} ({link(doc, summary, 'its summary')}; "
             "later commits are not in these figures); the range is over the "
             f"{len(runs)} committed nightlies since "
             f"{runs[0]['date']} ({link(doc, root / nightly.HISTORY, 'history')}). Timings on a lent H200 move with "
             "its host between runs.", "",
             "| figure | newest | range over the committed nightlies |", "|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in rows]) + "\n"


def spec_section(doc: Path, root: Path) -> str:
    """docs/spec.md 1.1: eager step against graph replay, `small`, from the newest nightly."""
    runs = nightly.load_history(root)
    new = runs[-1]["small"]
    rows = []
    for b in map(str, nightly.BATCHES):
        eager, replay = new["eager_ms"].get(b), new["replay_ms"].get(b)
        ratios = [r["small"]["eager_ms"].get(b) / r["small"]["replay_ms"][b] for r in runs
                  if r["small"]["replay_ms"].get(b) and r["small"]["eager_ms"].get(b)]
        rows.append(f"| {b} | {eager:.2f} ms | {replay:.2f} ms | {eager / replay:.1f}x | {spread(ratios, '{:.1f}', 'x')} |")
    source = link(doc, root / nightly.NIGHTLY / "bench-small" / "conformance-reference.md", "the newest nightly's `small` lane")
    return "\n".join([
        f"From {source} ({runs[-1]['date']}, of the code at {runs[-1]['code'][:7]}; an 8-layer decoder, d = 512, bf16): the eager step against the "
        f"device time of the FULL graph's replay, with the range of the ratio over the {len(runs)} committed "
        f"nightlies ({link(doc, root / nightly.HISTORY, 'history')}).", "",
        "| batch B | eager step | graph replay | eager / graph | range over the nightlies |", "|---|---|---|---|---|",
        *rows, "",
        f"- An eager step at B = 1 launches {new['eager_kernels_b1']} kernels.",
        f"- At B = 1 the replay took {ratio(new['replay_over_kernel'])} the summed kernel time of an eager step "
        f"(range {spread([r['small']['replay_over_kernel'] for r in runs], '{:.2f}', 'x')}), so the graph comes "
        "close to the floor set by the GPU work itself.", ""])


def matrix_section(doc: Path, root: Path) -> str:
    lines = ["| runtime | result | time |", "|---|---|---|"]
    for path in sorted((root / MATRIX).glob("*/conformance-*.json")):
        run = json.loads(path.read_text())
        lines.append(f"| {link(doc, path.with_suffix('.md'), run['runtime'])} | {counts(run['summary'])} | "
                     f"{run['seconds']:.1f} s |")
    return "\n".join(lines) + "\n"


PYTEST_LAST = re.compile(r"^=* ?(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s", re.M)


def in_order(folder: str) -> list:
    """A session folder's sort key: its numbers as numbers, so 2026-12-03-speed-10 comes after -speed-9."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", folder)]


def cpu_runs(root: Path) -> dict[str, list[tuple[str, str, float, Path]]]:
    """{kind: [(date, counts, seconds, log)]} from reports/cpu/<date>/<kind>.log, oldest first."""
    found: dict[str, list] = {}
    for log in sorted((root / CPU).glob("*/*.log"), key=lambda log: (in_order(log.parent.name), log.name)):
        last = PYTEST_LAST.findall(log.read_text())
        if last:
            found.setdefault(log.stem, []).append((log.parent.name, last[-1][0], float(last[-1][1]), log))
    return found


# A line of scripts/time_breakdown.py --targets (targets.txt): one run of one command, in loop-times.
TARGET_RUN = re.compile(r"^run \d+ (?P<kind>[\w-]+): .* (?P<loop_times>[\d.]+) loop-times \(target (?P<target>[\d.]+)\): "
                        r"(?P<verdict>.+)$", re.M)


def cpu_targets(folder: Path) -> dict[str, list[tuple[float, float, bool]]]:
    """{kind: [(loop-times, target, met?)]} of every run in folder/targets.txt, in order; {} without one."""
    found: dict[str, list] = {}
    text = (folder / "targets.txt").read_text() if (folder / "targets.txt").is_file() else ""
    for m in TARGET_RUN.finditer(text):
        found.setdefault(m["kind"], []).append((float(m["loop_times"]), float(m["target"]), m["verdict"] == "met"))
    return found


def cpu_section(doc: Path, root: Path) -> str:
    runs = cpu_runs(root)
    lines = ["| command | newest run | time | in loop-times (its runs that day) | range over the committed runs |",
             "|---|---|---|---|---|"]
    for kind, title in (("first-command", "the first command (reference suites, `-n 2`)"),
                        ("all-tests", "every test (`python -m pytest -n 2`; CI's profile where the loop-times are given)")):
        if kind in runs:
            date, tally, seconds, log = runs[kind][-1]
            tests = sum(int(n) for n in re.findall(r"(\d+) \w+", tally))
            measured = cpu_targets(log.parent).get(kind, [])
            if measured:
                target, met = measured[0][1], sum(ok for *_, ok in measured)
                in_loops = (f"{link(doc, log.parent / 'targets.txt', ', '.join(f'{lt:.1f}' for lt, *_ in measured))} "
                            f"(target {target:g}: met in {met} of {len(measured)})")
            else:
                in_loops = "not timed against the loop"
            lines.append(f"| {title} | {link(doc, log, f'{date}: {tally}')} ({tests} tests) | {seconds:.1f} s | {in_loops} | "
                         f"{spread([s for *_, s, _ in runs[kind]], '{:.1f}', ' s')} ({len(runs[kind])} run{'s' if len(runs[kind]) != 1 else ''}) |")
    host = root / CPU / runs["all-tests"][-1][0] / "host.txt" if "all-tests" in runs else None
    if host and host.is_file():
        lines += ["", f"The machine: {host.read_text().strip()} ({link(doc, host, 'host.txt')})."]
    return "\n".join(lines) + "\n"


def nightly_host_section(doc: Path, root: Path) -> str:
    """The newest nightly's host timing and its comparison with the nightly before it."""
    folder = root / nightly.NIGHTLY
    host = (folder / "host.txt").read_text()
    before, after = (re.search(rf"host reference ms{label} \[([^\]]*)\]", host) for label in ("", " after"))
    summary = (folder / "summary.md").read_text()
    counted = re.search(r"^(\d+) beyond (\d+)%:", summary, re.M)
    excused = re.search(r"^(\d+) more beyond it, paced by the host", summary, re.M)
    flagged = re.findall(r"^- (.*?): latency (\w+) batch (\d+): step_ms_median ([\d.]+) -> ([\d.]+).*beyond the bar$",
                         summary, re.M)
    lines = []
    if before and after:
        lines.append(f"The newest nightly's host timed its reference loop at {before.group(1)} ms before the job and "
                     f"{after.group(1)} ms after it ({link(doc, folder / 'host.txt', 'host.txt')}).")
    if counted:
        which = "; ".join(f"{what} {mode} batch {batch}, {old} -> {new} ms" for what, mode, batch, old, new in flagged)
        lines.append(f"Against the nightly before it ({link(doc, folder / 'summary.md', 'its summary')}), "
                     f"{counted.group(1)} figures were worse beyond their bar ({which}) and "
                     f"{excused.group(1) if excused else 0} more beyond it were explained by the host's slowdown "
                     "and not counted.")
    elif "Regressions against baseline" in summary:
        lines.append(f"Against the nightly before it ({link(doc, folder / 'summary.md', 'its summary')}), no "
                     "figure was worse beyond its bar.")
    return " ".join(lines) + "\n"


FIDELITY = Path("reports/h200")


def fidelity_section(doc: Path, root: Path) -> str:
    """How often the emulator gives CUDA's verdict, from the two committed runs of the fidelity table."""
    cuda, emulated = (json.loads((root / FIDELITY / name).read_text())["rows"]
                      for name in ("emulator_fidelity.json", "emulator_fidelity_emulated.json"))
    bugs = [name for name in cuda if name in emulated and not name.startswith("correct")]
    same = [name for name in bugs if cuda[name]["verdict"] == emulated[name]["verdict"]]
    table = link(doc, root / FIDELITY / "emulator_fidelity.md", "`reports/h200/emulator_fidelity.md`")
    return (f"It was checked against real CUDA graphs on an H200: the fidelity table ({table}) gives the same "
            f"verdict on {len(same)} of {len(bugs)} graph bugs, and says why for the {len(bugs) - len(same)} it "
            "cannot mirror (host tensors, memory pools).\n")


RENDERERS = {"fidelity": fidelity_section, "nightly": nightly_section, "nightly-host": nightly_host_section, "spec-h200": spec_section, "matrix": matrix_section, "cpu-runs": cpu_section}


def render(text: str, doc: Path, root: Path = ROOT) -> str:
    def body(match):
        name = match.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{doc}: unknown generated section {name!r}; known: {', '.join(RENDERERS)}")
        return match.group(1) + RENDERERS[name](doc, root) + match.group(4)

    return MARKER.sub(body, text)


# -- the check --------------------------------------------------------------------------------
def problems(root: Path = ROOT) -> list[str]:
    found = []
    history = nightly.load_history(root)
    current = json.loads(json.dumps(nightly.from_tree(root)))
    if not any(nightly.without_provenance(run) == current for run in history):
        found.append(f"{nightly.HISTORY} does not hold the nightly in {nightly.NIGHTLY} as it is now: "
                     "run `python scripts/figures.py`")
    for doc in docs(root):
        rel = doc.relative_to(root).as_posix()
        text = doc.read_text()
        if render(text, doc, root) != text:
            found.append(f"{rel}: a generated section is out of date: run `python scripts/figures.py`")
        for citation in citations.citations(doc):
            absent = citations.missing(citation)
            if absent:
                found.append(f"{citation}: {', '.join(absent)} not in {citations.shown(citation.target)}")
            commit = citations.unnamed_commit(citation)
            if commit:
                found.append(f"{citation}: the run is of commit {commit}; name it beside the figure "
                             f"(`(at {commit})`), or say the run is older than the text")
        if rel not in PENDING and rel not in GENERATED_REPORTS:
            found += [f"{rel}:{line}: {figure!r} is a measured figure with no report cited (link it to the report "
                      "it comes from, or render it in a generated section)" for line, figure in citations.uncited(doc)]
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report what disagrees; change nothing")
    parser.add_argument("--history-from-git", action="store_true", help="rebuild the nightly history from git's log")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        print("\n".join(found) or "every figure agrees with its report")
        return 1 if found else 0
    history = nightly.from_git() if args.history_from_git else nightly.load_history()
    nightly.save_history(nightly.with_current(history, json.loads(json.dumps(nightly.from_tree()))))
    for doc in docs():
        text = doc.read_text()
        new = render(text, doc)
        if new != text:
            doc.write_text(new)
            print(f"re-rendered {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
