"""Every option of the plugin with a bad value: exit 4 (pytest's usage error), one line saying what
was wrong and what would be right, no traceback, and no word blaming the runtime. The table has a
row for every option the plugin registers (read from the parser), so a new option needs one."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.session import options

ROOT = Path(__file__).resolve().parent.parent

# dest -> bad command-line arguments; None: a flag, nothing to get wrong.
BAD = {
    "runtime": ["--runtime", "no-such-runtime"],
    "known_failures": ["--known-failures", "no-such-file.toml"],
    "report_dir": ["--report-dir", "{file}/under-a-file"],
    "no_plots": None,
    "baseline": ["--baseline", "no-such-run.json"],
    "regression_threshold": ["--regression-threshold=-1"],
    "fail_on_regression": None,
    "graph_backend": ["--graph-backend", "opengl"],
    "preset": ["--preset", "huge"],
    "bench_preset": ["--bench-preset", "huge"],
    "only_declared": None,
    "anchor_process": ["--anchor-process", "maybe"],
    "no_supervisor": None,
    "test_timeout": ["--test-timeout=-5"],
    "hypothesis_profile": ["--hypothesis-profile", "xyz"],
    "hypothesis_seed": ["--hypothesis-seed", "abc"],
}
MORE = [["--test-timeout=nan"], ["--regression-threshold=inf"], ["--report-dir", "{file}"],
        ["--report-dir", "/proc/no-such/dir"]]


def registered(pytestconfig) -> set[str]:
    group = pytestconfig._parser.getgroup("cudagraph-conformance")
    return {option.dest for option in group.options}


def test_every_registered_option_has_a_bad_value_row(pytestconfig):
    missing = registered(pytestconfig) - BAD.keys()
    assert not missing, f"options without a row in tests/test_options.py's BAD table: {sorted(missing)}"
    unchecked = {dest for dest, args in BAD.items() if args and dest not in options.CHECKS and dest not in options.FREE}
    assert not unchecked, f"options neither checked in harness/session/options.py nor said free there: {unchecked}"


def run_pytest(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    file = tmp_path / "a-file"
    file.write_text("")
    args = [arg.replace("{file}", str(file)) for arg in args]
    return subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "suites" / "test_padding.py"), "-q",
                           "-p", "no:cacheprovider", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("args", [args for args in BAD.values() if args] + MORE, ids=" ".join)
def test_a_bad_value_is_one_line_and_exit_4(args, tmp_path):
    result = run_pytest(args, tmp_path)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 4, output[-2000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-2000:]
    assert "by the runtime" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[0].startswith("ERROR: "), output
    bad_value = args[-1].split("=")[-1].replace("{file}", "")
    assert bad_value in "\n".join(lines[:2]), output  # the first line (argparse's second) names it
    # one line; argparse's own errors add pytest's usage and ini lines; an unknown runtime lists them
    assert len(lines) <= (30 if args[0] == "--runtime" else 4), output
    assert not list(tmp_path.glob("*.json")), "a run refused at configure time writes no report"


# -- the render/compare tool: every option with a bad value, exit 4, one line ---------------------
# Placeholders: {run} a good run report, {file} an empty file (not JSON, not a directory).
RENDER_BAD = {
    "RUN.json": [["--out", "out"], ["no-such-run.json", "--out", "out"], ["{file}", "--out", "out"]],
    "--out": [["{run}"], ["{run}", "--out", "{file}"]],
    "--baseline": [["{run}", "--out", "out", "--baseline", "no-such-base.json"],
                   ["{run}", "--out", "out", "--baseline", "{file}"]],
    "--threshold": [["{run}", "--out", "out", "--threshold", "-1"], ["{run}", "--out", "out", "--threshold", "abc"],
                    ["{run}", "--out", "out", "--threshold", "inf"]],
    "unknown": [["{run}", "--out", "out", "--no-such-option"]],
}
RENDER_FREE = {"--fail-on-regression": "a flag", "--title": "any text", "--help": "a flag"}


def _render(args: list[str], tmp_path: Path, capsys) -> tuple[int, str]:
    import json

    from harness.reports import render
    from tests.test_render import make_run

    (tmp_path / "run.json").write_text(json.dumps(make_run([])))
    (tmp_path / "a-file").write_text("")
    places = {"{run}": str(tmp_path / "run.json"), "{file}": str(tmp_path / "a-file"), "out": str(tmp_path / "out")}
    capsys.readouterr()
    try:
        code = render.main([places.get(arg, arg) for arg in args])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip()


def test_every_render_option_has_a_bad_value_row(tmp_path, capsys):
    code, usage = _render(["--help"], tmp_path, capsys)
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", usage.split("\n\n")[0]))  # the usage lines
    missing = named - RENDER_BAD.keys() - RENDER_FREE.keys()
    assert code == 0 and not missing, f"render options without a row in RENDER_BAD: {sorted(missing)}"


@pytest.mark.parametrize("args", [args for rows in RENDER_BAD.values() for args in rows], ids=" ".join)
def test_a_bad_render_argument_is_one_line_and_exit_4(args, tmp_path, capsys):
    code, output = _render(args, tmp_path, capsys)
    assert code == 4, output
    assert "Traceback" not in output and len(output.splitlines()) == 1 and output.startswith("error: "), output
    assert not (tmp_path / "out").exists(), "a refused render writes nothing"


# -- the console command: pytest's arguments, read as the installed command reads them ------------
CONSOLE_BAD = [["suites/test_no_such_suite.py"], ["suites/test_padding.py::test_no_such_test"],
               ["--no-such-option"], ["--runtime"], ["--preset", "huge"], ["--known-failures", "no-such-file.toml"]]


@pytest.mark.parametrize("args", CONSOLE_BAD, ids=" ".join)
def test_a_bad_console_argument_is_one_error_line_and_exit_4(args, tmp_path):
    result = subprocess.run([sys.executable, "-m", "cudagraph_conformance", "-q", "-p", "no:cacheprovider", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 4, output[-2000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-2000:]
    errors = [line for line in output.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1, output
    # argparse's usage error puts the offending option on the line after pytest's "ERROR: usage:"
    assert args[-1].split("::")[-1] in "\n".join(output.splitlines()[-5:]), output
    assert len([line for line in output.splitlines() if line.strip()]) <= 5, output
