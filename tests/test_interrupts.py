"""Ctrl-C at any point ends the run with a short message and a report that says `complete: false`
and how many tests ended; nothing is left running. Each case is a real process sent real SIGINTs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TESTS = """
import os, time
from pathlib import Path

def test_quick():
    Path(os.environ["MARKER"] + ".quick").touch()

def test_slow(tmp_path_factory):
    quick = Path(os.environ["MARKER"] + ".quick")
    for _ in range(400):  # under xdist the other worker may run test_quick: Ctrl-C lands after it ended
        if quick.exists():
            break
        time.sleep(0.05)
    time.sleep(1)  # its result on its way to the controller
    Path(os.environ["MARKER"]).touch()
    time.sleep(30)

def test_after():
    pass
"""
SLOW_COLLECTION = """
import os, time
from pathlib import Path

Path(os.environ["MARKER"]).touch()
time.sleep(30)  # collection is still importing this module when Ctrl-C lands


def test_never_collected():
    pass
"""
SLOW_RENDERING = """
import os, time
from pathlib import Path
from harness.reports import render

real = render.write_report

def slow(*args, **kwargs):
    Path(os.environ["MARKER"]).touch()
    time.sleep(30)
    return real(*args, **kwargs)

render.write_report = slow
"""


def interrupt(tmp_path: Path, args: list[str], signals: int = 1, conftest: str = "", tests: str = TESTS):
    (tmp_path / "test_inner.py").write_text(tests)
    if conftest:
        (tmp_path / "conftest.py").write_text(conftest)
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARKER": str(marker)}
    process = subprocess.Popen([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider",
                                "--report-dir", "out", *args], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(signals):
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the run
        time.sleep(0.3)
    output = process.communicate(timeout=120)[0]
    try:
        leftovers = os.killpg(process.pid, 0) is None  # anything of its group still alive
    except ProcessLookupError:
        leftovers = False
    report = json.loads((tmp_path / "out" / "conformance-reference.json").read_text())
    return process.returncode, output, report, leftovers


def assert_honest(code, output, report, leftovers, ended_at_least):
    assert code == 2, output[-3000:]  # pytest's "interrupted"
    assert "Traceback" not in output, output[-3000:]
    assert report["complete"] is False, output[-3000:]
    assert report["tests_ended"] >= ended_at_least, report["summary"]
    ended = [t for t in report["tests"] if t["outcome"] not in ("running", "interrupted", "not run")]
    assert report["tests_ended"] == len(ended), report["summary"]
    said = "while the tests were collected, before any ran" if report["collected"] is None else \
        f"after {report['tests_ended']} of {report['collected']} collected tests ended"
    assert f"cudagraph-conformance: the run stopped early {said}; the report says complete: false" in output, \
        output[-3000:]
    assert not leftovers, "a process of the run outlived it"


def test_ctrl_c_during_a_test(tmp_path):
    assert_honest(*interrupt(tmp_path, ["--runtime", "reference"]), ended_at_least=1)


def test_ctrl_c_while_the_report_renders(tmp_path):
    code, output, report, leftovers = interrupt(tmp_path, ["--runtime", "reference"], conftest=SLOW_RENDERING,
                                                tests="def test_quick():\n    pass\n")
    assert "stopped (Ctrl-C) while the report was rendered" in output, output[-3000:]
    assert_honest(code, output, report, leftovers, ended_at_least=1)


def test_two_ctrl_c_under_xdist(tmp_path):
    assert_honest(*interrupt(tmp_path, ["--runtime", "reference", "-n", "2"], signals=2), ended_at_least=1)


def test_ctrl_c_during_collection(tmp_path):
    code, output, report, leftovers = interrupt(tmp_path, ["--runtime", "reference"], tests=SLOW_COLLECTION)
    assert "KeyboardInterrupt" in output and len(output.splitlines()) < 40, output[-3000:]
    assert_honest(code, output, report, leftovers, ended_at_least=0)
    assert report["tests_ended"] == 0 and report["tests"] == [], report["summary"]


def test_two_ctrl_c_during_collection_under_xdist(tmp_path):
    code, output, report, leftovers = interrupt(tmp_path, ["--runtime", "reference", "-n", "2"], signals=2,
                                                tests=SLOW_COLLECTION)
    assert_honest(code, output, report, leftovers, ended_at_least=0)
    assert report["tests_ended"] == 0, report["summary"]
