"""Every option of the plugin with a bad value: exit 4 (pytest's usage error), one line saying what
was wrong and what would be right, no traceback, and no word blaming the runtime. The table has a
row for every option the plugin registers (read from the parser), so a new option needs one."""
from __future__ import annotations

import os
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


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    file = tmp_path / "a-file"
    file.write_text("")
    args = [arg.replace("{file}", str(file)) for arg in args]
    return subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "suites" / "test_padding.py"), "-q",
                           "-p", "no:cacheprovider", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("args", [args for args in BAD.values() if args] + MORE, ids=" ".join)
def test_a_bad_value_is_one_line_and_exit_4(args, tmp_path):
    result = _run(args, tmp_path)
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
