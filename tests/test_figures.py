"""Figures that cannot go stale: every measured figure in README.md, docs/ and the READMEs under
plugins/ and reports/ is rendered from a committed report (a generated section) or links to the
file it comes from, and agrees with it (scripts/figures.py, scripts/citations.py)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts")]
import citations  # noqa: E402
import figures  # noqa: E402
import nightly_figures  # noqa: E402


def test_every_figure_in_the_docs_agrees_with_its_report():
    assert figures.problems() == []


def test_a_cited_figure_its_report_does_not_hold_is_caught(tmp_path):
    # Beside the doc, linked by its name: a link's target holds no space, and the checkout's path may.
    report = tmp_path / "conformance-vllm-policy.md"
    shutil.copy(ROOT / "reports" / "vllm-policy" / "conformance-vllm-policy.md", report)
    doc = tmp_path / "README.md"
    doc.write_text(f"Backed: [264 passed, 14 xfailed]({report.name}).\n\n"
                   f"Stale: [267 passed, 14 xfailed]({report.name}).\n")
    backed, stale = citations.citations(doc)
    assert citations.missing(backed) == []
    assert citations.missing(stale) == ["267"]
    # The numbers of one figure must sit on one line of a text file, not each somewhere.
    doc.write_text(f"[264 passed in 3.0 s, 260 skipped]({report.name})\n")
    assert citations.missing(citations.citations(doc)[0]) == ["260"]


def test_a_json_report_backs_a_figure_at_the_precision_the_doc_gives(tmp_path):
    report = tmp_path / "run.json"
    report.write_text(json.dumps({"seconds": 50.125, "summary": {"passed": 46}}))
    doc = tmp_path / "README.md"
    doc.write_text(f"[46 passed in 50.1 s]({report.name}), [46 passed in 50.2 s]({report.name})\n")
    backed, stale = citations.citations(doc)
    assert citations.missing(backed) == [] and citations.missing(stale) == ["50.2"]


@pytest.mark.parametrize("figure, line, missing", [
    ("1.23x", "speed-up 1.2349x", []), ("1.23x", "speed-up 1.24x", ["1.23"]), ("1.23x", "speed-up 1.2x", ["1.23"]),
    ("62.45 s", "in 62.45s", []), ("62.45 s", "in 62.4s", ["62.45"]), ("62.45 s", "in 62.46s", ["62.45"]),
    ("62 s", "in 62.45s", []), ("62 s", "in 63.1s", ["62"]), ("3.1 ms", "3.149ms", []), ("3.1 ms", "3.16ms", ["3.1"]),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_text_report_backs_a_figure_only_at_its_printed_precision(tmp_path, figure, line, missing):
    """A unit against its number ("1.24x", "62.45s") is no longer read as the integer before the dot."""
    (tmp_path / "run.log").write_text(f"header 7\n{line}\n")
    doc = tmp_path / "README.md"
    doc.write_text(f"[{figure}](run.log)\n")
    assert citations.missing(citations.citations(doc)[0]) == missing


@pytest.mark.parametrize("paragraph, unnamed", [
    ("[46 passed](run.json) on the CPU.", "0123456"),
    ("[46 passed](run.json) on the CPU\n(at 0123456).", None),
    ("[46 passed](run.json), a run older than this text.", None),
    ("[46 passed](run.json) at 7654321.\n\nAnother paragraph names 0123456.", "0123456"),
], ids=["unnamed", "named", "older", "named-elsewhere"])
def test_a_figure_names_the_commit_its_run_ran_or_says_it_is_older(tmp_path, paragraph, unnamed):
    (tmp_path / "run.json").write_text(json.dumps({"git_commit": "0123456789abcdef", "summary": {"passed": 46}}))
    doc = tmp_path / "README.md"
    doc.write_text(paragraph + "\n")
    [citation] = citations.citations(doc)
    assert citations.unnamed_commit(citation) == unnamed


def test_a_measured_figure_with_no_citation_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(citations, "ROOT", tmp_path)
    doc = tmp_path / "README.md"
    doc.write_text("The lane took 51.3 s; 370 passed, a FULL step 1.24x its floor, +14.2% tok/s, 1.54 GiB.\n\n"
                   "```sh\necho 'in a code block: 12.5 ms is not prose'\n```\n"
                   "[cited: 6.49x](x.json) and `a setting of 10%`\n")
    assert [figure for _, figure in citations.uncited(doc)] == ["51.3 s", "370 passed", "1.24x", "+14.2%", "1.54 GiB"]


def test_a_generated_section_edited_by_hand_or_behind_its_reports_is_caught():
    doc = ROOT / "README.md"
    text = doc.read_text()
    assert figures.render(text, doc) == text
    edited = text.replace("| 370 passed, 51 skipped in", "| 371 passed, 51 skipped in")
    assert edited != text and figures.render(edited, doc) == text


def test_a_nightly_missing_from_the_history_is_caught(monkeypatch):
    history = nightly_figures.load_history()
    monkeypatch.setattr(nightly_figures, "load_history", lambda root=ROOT: history[:-1])
    assert any("history.json does not hold the nightly" in p for p in figures.problems())


def test_ranges_give_the_newest_beside_the_spread():
    assert figures.spread([5.24, 12.79, 6.49], "{:.2f}", "x") == "5.24-12.79x"
    assert figures.spread([14.2, 42.5], "{:+.1f}", "%") == "+14.2% to +42.5%"
    assert figures.spread([None, 1.0], "{:.1f}", " s") == "1.0 s" and figures.spread([], "{}") == "not measured"


def test_the_newest_cpu_run_is_the_session_numbered_last(tmp_path):
    """A session's folders go -speed, -speed-2, ..., -speed-9, -speed-10: by their numbers, not as text."""
    for folder, seconds in (("2026-12-02-speed", 3.0), ("2026-12-03-speed-9", 2.0), ("2026-12-03-speed-10", 1.0),
                            ("2026-12-03-speed-2", 4.0)):
        (tmp_path / figures.CPU / folder).mkdir(parents=True)
        (tmp_path / figures.CPU / folder / "all-tests.log").write_text(f"1 passed in {seconds}s\n")
    order = [date for date, *_ in figures.cpu_runs(tmp_path)["all-tests"]]
    assert order == ["2026-12-02-speed", "2026-12-03-speed-2", "2026-12-03-speed-9", "2026-12-03-speed-10"]


def _history_available() -> bool:
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


@pytest.mark.skipif(not _history_available(), reason="needs the repository's git history (a full clone)")
def test_the_nightly_history_is_every_committed_nightly():
    """Each committed version of the nightly's reports, read back from git, gives the figures the
    history holds for that run; the history holds no run git does not."""
    from_git = {run["started"]: nightly_figures.without_provenance(run)
                for run in json.loads(json.dumps(nightly_figures.from_git()))}
    history = {run["started"]: nightly_figures.without_provenance(run) for run in nightly_figures.load_history()}
    current = json.loads(json.dumps(nightly_figures.from_tree()))
    assert history == {**from_git, current["started"]: current}


def test_the_policy_comparison_readme_is_rendered_from_its_json():
    import policy_compare
    folder = ROOT / "reports" / "policy-compare"
    data = json.loads((folder / "policy-compare.json").read_text())
    engines = [SimpleNamespace(name=name, source=source) for name, source in data["engines"].items()]
    table = {(r["engine"], r["max_num_seqs"], r["q"]): r for r in data["results"]}
    seqs = sorted({s for _, s, _ in table})
    qs = sorted({q for *_, q in table})
    plots = {(s, q): f"padding-seqs{s}-q{q}.png" for s in seqs for q in qs}
    rendered = policy_compare.render(engines, data["missing"], table, plots, seqs, qs) + "\n"
    assert rendered == (folder / "README.md").read_text()
