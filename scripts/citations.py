"""Measured figures in the docs and the reports they come from (used by scripts/figures.py and
tests/test_figures.py).

A figure is cited by making it a link to the committed file it comes from:
`[370 passed, 51 skipped in 18.8 s](reports/h200/nightly/summary.md)`. The check: every number in
the link's text is in that file, on one line of a text file (`.md`, `.log`, `.txt`: the numbers of
a figure are read together there), anywhere in a `.json` file (a number there matches at the
precision the doc writes it: 50.125 is "50.1"). A figure in a generated section is rendered from
its reports by scripts/figures.py and needs no link.

A measured figure that is neither is reported as uncited. What counts as one is a pattern (test
outcomes, timings, ratios, changes in percent, memory, measured differences): figures that only
look like measurements (a spec's example, a setting) are listed in NOT_MEASURED with the reason.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A unit written against its number ("1.24x", "62.45s", "3.1ms") ends it; any other letter makes
# the digits part of a word (a commit "2fa982b", "3rd").
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?(?:(?![\w])|(?=(?:x|s|ms|us|µs|min|GiB|MiB|KiB|GB|MB)\b))"
                    r"|(?<=[v#])\d+")
LINK = re.compile(r"(?<!!)\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target>[^)\s]+)\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
SECTION = re.compile(r"<!-- figures: [\w-]+ .*?-->.*?<!-- /figures -->", re.S)
TEXT_SUFFIXES = (".md", ".log", ".txt")

# What a measured figure looks like in prose.
MEASURED = re.compile("|".join([
    r"\b\d[\d,]* (?:passed|failed|skipped|xfailed|xpassed|errors?|known failures?|known)\b",
    r"\b\d[\d,]* (?:tests|benchmarks)\b(?! (?:each|a |per))",
    r"\b\d+(?:\.\d+)? ?(?:ms|us|µs)\b",
    r"\b\d+\.\d+ ?s\b",
    r"\b\d+ min(?: \d+ s)?\b",
    r"\bin \d+ s\b",
    r"\b\d+\.\d+x\b",
    r"[+-]\d+(?:\.\d+)?%",
    r"\b\d+\.\d+%",
    r"\b\d+(?:\.\d+)? ?(?:GiB|MiB|GB)\b",
    r"\b\d\.\d+e-\d+\b",
]))


@dataclass(frozen=True)
class Citation:
    doc: Path
    line: int
    text: str
    target: Path

    def __str__(self) -> str:
        return f"{shown(self.doc)}:{self.line}: [{self.text}]({shown(self.target)})"


def shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def prose(text: str) -> str:
    """The doc's text with code blocks and generated sections blanked, lines kept in place."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return SECTION.sub(blank, CODE_BLOCK.sub(blank, text))


def citations(doc: Path) -> list[Citation]:
    """Links from the doc's prose to committed files whose text holds a number."""
    text = prose(doc.read_text())
    found = []
    for match in LINK.finditer(text):
        target = match.group("target").split("#")[0]
        if not numbers(match.group("text")) or "://" in target or not target:
            continue
        path = (doc.parent / target).resolve()
        if path.is_file() and path.suffix in (*TEXT_SUFFIXES, ".json"):
            found.append(Citation(doc, text[:match.start()].count("\n") + 1, match.group("text"), path))
    return found


def _matches(figure: str, value: float) -> bool:
    decimals = len(figure.split(".")[1]) if "." in figure and "e" not in figure else 0
    wanted = float(figure)
    if "e" in figure:
        return math.isclose(value, wanted, rel_tol=0.05)
    return abs(value - wanted) <= 0.5 * 10 ** -decimals + 1e-9


def _json_numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _json_numbers(v)] + [n for k in value for n in _text_numbers(k)]
    if isinstance(value, list):
        return [n for v in value for n in _json_numbers(v)]
    return _text_numbers(str(value))


def _text_numbers(text: str) -> list[float]:
    return [float(n) for n in numbers(text)]


def missing(citation: Citation) -> list[str]:
    """The numbers of a cited figure its file does not hold ([] when it is backed)."""
    wanted = numbers(citation.text)
    body = citation.target.read_text(errors="replace")
    if citation.target.suffix == ".json":
        values = _json_numbers(json.loads(body))
        return [n for n in wanted if not any(_matches(n, v) for v in values)]
    lines = [[n for n in numbers(line)] for line in body.splitlines()]
    for line in lines:
        if all(any(_same(n, m) for m in line) for n in wanted):
            return []
    best = max(lines, key=lambda line: sum(any(_same(n, m) for m in line) for n in wanted), default=[])
    return [n for n in wanted if not any(_same(n, m) for m in best)] or wanted


COMMIT = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")


def report_commit(target: Path) -> str | None:
    """The commit a cited run ran (its `git_commit`, or the rendered summary's "commit ..."), where known."""
    body = target.read_text(errors="replace")
    if target.suffix == ".json":
        try:
            commit = json.loads(body).get("git_commit")
        except (ValueError, AttributeError):
            return None
    else:
        found = COMMIT.search(body)
        commit = found.group(1) if found else None
    return commit[:7] if commit and re.fullmatch(r"[0-9a-f]{7,40}", commit) else None


def unnamed_commit(citation: Citation) -> str | None:
    """The cited run's commit where the figure's paragraph neither names it nor says the run is
    older than the text: a figure must say how old it is. None where it does, or no commit is known."""
    commit = report_commit(citation.target)
    if commit is None:
        return None
    lines = prose(citation.doc.read_text()).splitlines()
    start = end = citation.line - 1
    while start > 0 and lines[start - 1].strip():
        start -= 1
    while end + 1 < len(lines) and lines[end + 1].strip():
        end += 1
    paragraph = "\n".join(lines[start:end + 1])
    return None if commit in paragraph or re.search(r"\bolder\b", paragraph) else commit


def _same(figure: str, token: str) -> bool:
    """The file's number, printed at the doc's precision, is the doc's figure: "1.23" is 1.2349 and
    1.23, not 1.24, nor 1.2 (a file less precise than the figure cannot back it); "62" is 62.45."""
    try:
        wanted, value = float(figure), float(token)
    except ValueError:
        return False
    if "e" in figure.lower() or "e" in token.lower():
        return math.isclose(value, wanted, rel_tol=0.05)
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    if decimals > (len(token.split(".")[1]) if "." in token else 0):
        return False
    return abs(value - wanted) <= 0.5 * 10 ** -decimals + 1e-9


# Figures that match MEASURED but are not measurements: (doc, text) -> why.
_SPEC_WASTE = "the spec's padding example, computed from vLLM's grid (checked by suites/test_padding.py)"
_PR_20059 = "vLLM PR #20059's published figure, quoted from the notes with its source (docs/spec.md section 8)"
NOT_MEASURED: dict[tuple[str, str], str] = {
    ("README.md", "37.50%"): _SPEC_WASTE, ("README.md", "2.34%"): _SPEC_WASTE,
    ("docs/spec.md", "37.50%"): _SPEC_WASTE, ("docs/spec.md", "2.34%"): _SPEC_WASTE,
    ("docs/spec.md", "37.5%"): _SPEC_WASTE, ("docs/spec.md", "2.3%"): _SPEC_WASTE,
    ("docs/spec.md", "43.75%"): "the worst waste of vLLM's grid, computed from the spec's table",
    ("docs/spec.md", "1.5x"): "the benchmark lane's assertion, a threshold (suites/test_step_latency.py)",
    ("docs/spec.md", "1 MiB"): "the floor of a memory estimate, a setting",
    ("docs/spec.md", "+4.9%"): _PR_20059, ("docs/spec.md", "+2.0%"): _PR_20059,
    ("docs/spec.md", "+3.0%"): _PR_20059, ("docs/spec.md", "+3.3%"): _PR_20059,
    ("docs/authoring.md", "9 known failures"): "section 9's title in the contents",
    ("docs/authoring.md", "2 MiB"): "the granule graph memory is compared within, a setting",
    ("docs/runners.md", "20 GiB"): "SGLang's memory tiers, read from its source",
    ("docs/runners.md", "35 GiB"): "SGLang's memory tiers, read from its source",
    ("docs/runners.md", "60 GiB"): "SGLang's memory tiers, read from its source",
    ("docs/runners.md", "160 GiB"): "SGLang's memory tiers, read from its source",
    ("plugins/sglang-policy/README.md", "141 GB"): "an H200's memory as SGLang is told it, a stand-in",
    ("plugins/sglang-policy/README.md", "179 GB"): "a B200's memory as SGLang is told it, a stand-in",
    ("docs/reliability.md", "40 MiB"): "the taint check's memory allowance, a setting (harness/reliability/isolation.py)",
    ("docs/reliability.md", "8 MiB"): "the taint check's memory tolerance, a setting (harness/reliability/isolation.py)",
    ("docs/reliability.md", "32 MiB"): "one cuBLAS workspace the taint check allows, a setting (harness/reliability/isolation.py)",
    ("docs/reliability.md", "0.1 s"): "the form of the supervisor's message, an example",
    ("docs/reliability.md", "64 MiB"): "the leak and the cache the self-tests plant, a setting of the tests",
}


def uncited(doc: Path) -> list[tuple[int, str]]:
    """(line, figure) for each measured-looking figure in the doc's prose that no link cites."""
    text = prose(doc.read_text())
    cited = [(m.start(), m.end()) for m in LINK.finditer(text)]
    rel = doc.relative_to(ROOT).as_posix()
    found = []
    for match in MEASURED.finditer(text):
        if any(start <= match.start() < end for start, end in cited):
            continue
        if (rel, match.group(0)) in NOT_MEASURED:
            continue
        found.append((text[:match.start()].count("\n") + 1, match.group(0)))
    return found
