"""Docs whose code runs: every Python snippet in README.md and docs/ is executed here, or is an
excerpt that names its source and whose lines are in that source; every TOML snippet parses (a
known-failures one loads); every workflow snippet passes the workflow linter; and the outputs the
docs quote (a failure, the header, a capture error, the calculator's answers) are what the code
prints today."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harness.session import header, known_failures
from tests import broken_example_engines
from tests.test_workflows import problems as workflow_problems

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
EXCERPT = re.compile(r"# excerpt from (?P<path>\S+)")


def blocks(doc: Path, lang: str) -> list[tuple[int, str]]:
    text = doc.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group("body")) for m in FENCE.finditer(text) if m.group("lang") == lang]


def excerpt_problems(body: str) -> list[str]:
    """Why an excerpt is not its source's text ([] when every line of it is a line there)."""
    source = ROOT / EXCERPT.match(body).group("path")
    if not source.is_file():
        return [f"its source {source.relative_to(ROOT)} does not exist"]
    lines = {line.strip() for line in source.read_text().splitlines()}
    return [f"{line.strip()!r} is not a line of {source.relative_to(ROOT)}" for line in body.splitlines()[1:]
            if line.strip() and line.strip() != "..." and line.strip() not in lines]


def run_python_blocks(doc: Path, tmp_path) -> None:
    """The doc's Python snippets in order, in one namespace, as a reader would paste them."""
    namespace = {"__name__": f"snippets of {doc.name}"}
    for line, body in blocks(doc, "python"):
        if EXCERPT.match(body):
            assert excerpt_problems(body) == [], f"{doc.name}:{line}: the excerpt drifted from its source"
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(body, f"{doc.name}:{line}", "exec"), namespace)  # noqa: S102 - our own docs


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_snippet_runs_or_is_a_checked_excerpt(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_python_blocks(doc, tmp_path)


def test_a_snippet_that_fails_or_an_excerpt_that_drifted_is_caught(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```python\nx = 1\n```\n\n```python\nassert x == 2, 'the doc is wrong'\n```\n")
    with pytest.raises(AssertionError, match="the doc is wrong"):
        run_python_blocks(doc, tmp_path)
    drifted = "# excerpt from examples/bucket_engine/bucket_engine/runtime.py\nclass BucketRuntime:\n    name = 'other'\n"
    assert excerpt_problems(drifted) == ['"name = \'other\'" is not a line of examples/bucket_engine/bucket_engine/runtime.py']
    assert excerpt_problems("# excerpt from no/such/file.py\nx\n") == ["its source no/such/file.py does not exist"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_toml_and_workflow_snippet_is_valid(doc, tmp_path):
    for line, body in blocks(doc, "toml"):
        tomllib.loads(body)
        if "[[failure]]" in body or "harness_versions" in body:
            path = tmp_path / f"line{line}.toml"
            path.write_text(body)
            assert known_failures.read(path).entries, f"{doc.name}:{line}"
    for line, body in blocks(doc, "yaml"):
        data = yaml.safe_load(body)
        if isinstance(data, dict) and "jobs" in data:
            path = tmp_path / f"line{line}.yml"
            path.write_text(body)
            assert workflow_problems(path) == [], f"{doc.name}:{line}"


# -- outputs the docs quote --------------------------------------------------------------------------
OFF_BY_THREE = "suites/test_replay_equivalence.py::test_graph_equals_eager_for_verify_batches_of_q_tokens[bucket-off-by-three-FULL]"


def quoted_failure(doc: Path) -> str:
    return next(body for _, body in blocks(doc, "") if body.startswith("[replay equivalence] runtime 'bucket-off-by-three'"))


def run_off_by_three(pytester, *extra: str) -> dict:
    pytester.runpytest(str(ROOT / OFF_BY_THREE), "--runtime", "tests.broken_example_engines:BucketOffByThree",
                       "--rootdir", str(ROOT), "--report-dir", "out", "-p", "no:cacheprovider", "-p", "no:xdist", *extra)
    return json.loads((pytester.path / "out" / "conformance-bucket-off-by-three.json").read_text())


def test_the_failure_the_docs_quote_is_the_one_the_suites_print_and_the_known_failure_covers_it(pytester):
    [test] = run_off_by_three(pytester)["tests"]
    assert test["outcome"] == "failed"
    for doc in (ROOT / "README.md", ROOT / "docs" / "authoring.md"):
        assert quoted_failure(doc).strip() in test["reason"], doc.name

    entry = next(body for _, body in blocks(ROOT / "docs" / "authoring.md", "toml") if "bucket-off-by-three" in body)
    (pytester.path / "known_failures.toml").write_text(entry)
    [test] = run_off_by_three(pytester, "--known-failures", "known_failures.toml")["tests"]
    assert test["outcome"] == "xfailed", test


def test_the_header_the_guide_quotes_is_the_example_engines():
    from bucket_engine.runtime import BucketRuntime

    class Options:
        benchmark_skip = False

    class Config:
        option = Options()

    quoted = next(body for _, body in blocks(ROOT / "docs" / "authoring.md", "") if body.startswith("skipped: "))
    assert quoted.splitlines() == header.skip_lines(Config(), BucketRuntime(), "emulated", None)


def test_the_capture_error_the_guide_quotes_is_the_emulators():
    from harness.graphs import CaptureError, emulator

    quoted = next(body for _, body in blocks(ROOT / "docs" / "authoring.md", "") if body.startswith("CaptureError"))
    positions = torch.arange(4)
    graph = emulator.CUDAGraph()
    with pytest.raises(CaptureError) as raised:
        with emulator.graph(graph):
            int(positions.max())
    assert quoted.strip() == f"CaptureError: {raised.value}"


def in_words(n: int) -> str:
    ones = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
           "seventeen eighteen nineteen".split()
    tens = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty"}
    return ones[n] if n < 20 else tens[n // 10] + ("" if n % 10 == 0 else "-" + ones[n % 10])


def test_the_number_of_broken_variants_the_docs_give_is_the_number_there_are():
    from tests import broken_example_models

    count = in_words(len(broken_example_engines.MUTANTS) + len(broken_example_models.MUTANTS))
    for doc in (ROOT / "README.md", ROOT / "docs" / "authoring.md"):
        said = re.findall(r"\b([\w-]+) (?:broken )?variants of it", doc.read_text())
        assert said and set(said) == {count}, (doc.name, said)


@pytest.mark.parametrize("line", [line for _, body in blocks(ROOT / "README.md", "sh") for line in body.splitlines()
                                  if line.startswith("python -m reference_runtime") and "#" in line])
def test_the_calculator_answers_as_the_readme_says(line, capsys):
    from reference_runtime import cli

    command, comment = line.split("#", 1)
    assert cli.main(shlex.split(command)[3:]) == 0
    out = capsys.readouterr()
    answer, _, warned = comment.strip().partition(", with a warning")
    assert answer in out.out
    if _:
        assert "warning" in out.out + out.err
