"""The runtimes the docs show pass the suites they declare, as written: docs/authoring.md section 1
and the runnable example in harness/hookspecs.py (as a `--runtime module:factory`, as a conftest.py
above the suites of a checkout, and as a `-p` plugin under the installed command); and every rule
docs/authoring.md section 1a lists still gives the message it quotes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import hookspecs

ROOT = Path(__file__).resolve().parent.parent
AUTHORING = ROOT / "docs" / "authoring.md"
SUMMARY = re.compile(r"(\d+) passed")


def section(title: str) -> str:
    text = AUTHORING.read_text()
    start = text.index(f"\n## {title}")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def ten_line_runtime() -> str:
    body = section("1. A runtime in ten lines")
    return body.split("```python\n", 1)[1].split("```", 1)[0]


def hookspec_example() -> str:
    doc = hookspecs.pytest_cudagraph_runtimes.__doc__
    example = doc.split("::\n", 1)[1].split("\n    then ", 1)[0]
    return textwrap.dedent(example)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def assert_passes(result: subprocess.CompletedProcess) -> None:
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    passed = SUMMARY.search(result.stdout)
    assert passed and int(passed.group(1)) > 0 and " failed" not in result.stdout, tail


def test_the_ten_line_runtime_passes_every_suite_it_declares(tmp_path):
    (tmp_path / "mymodule.py").write_text(ten_line_runtime())
    assert_passes(run([sys.executable, "-m", "pytest", str(ROOT / "suites"), "--runtime", "mymodule:MyRuntime",
                       "-q", "-p", "no:cacheprovider", "--no-supervisor"], tmp_path))


def test_the_hookspec_example_passes_as_a_conftest_above_the_suites(tmp_path):
    (tmp_path / "suites").symlink_to(ROOT / "suites")
    (tmp_path / "conftest.py").write_text(hookspec_example())
    assert_passes(run([sys.executable, "-m", "pytest", "suites/", "--runtime", "constant", "--rootdir", str(tmp_path),
                       "-c", str(ROOT / "pyproject.toml"), "-q", "-p", "no:cacheprovider", "--no-supervisor"], tmp_path))


def test_the_hookspec_example_passes_as_a_plugin_under_the_installed_command(tmp_path):
    (tmp_path / "myruntimes.py").write_text(hookspec_example())
    assert_passes(run([sys.executable, "-m", "cudagraph_conformance", "-p", "myruntimes", "--runtime", "constant",
                       "-q", "-p", "no:cacheprovider", "--no-supervisor"], tmp_path))


RULE_ROW = re.compile(r"^\| .+ \| `(?P<message>[^`]+)`.* \| (?P<where>\S+\.py) \|$", re.M)


def test_every_rule_listed_gives_the_message_the_doc_quotes():
    rows = RULE_ROW.findall(section("1a. The rules your answers are checked against"))
    assert len(rows) >= 10
    missing = [(message, where) for message, where in rows if message not in (ROOT / where).read_text()]
    assert not missing, f"docs/authoring.md section 1a quotes messages the code no longer gives: {missing}"

