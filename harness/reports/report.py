"""The run's report: one JSON file is the source of truth, a Markdown summary is rendered from it
(by `harness.reports.render`, which also draws the plots and compares against a baseline).

It is written when the session ends and also every few seconds while tests run, so a run that
crashes part-way still leaves a report of what ran: a test that started and never finished is
"running" there (or "interrupted" when the run was stopped), and `complete` is false.
"""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

import harness
from harness.runtime import checkpoint as checkpoint_verdict
from harness.reports import render
from harness.session import coverage
from harness.session.machine import cuda_available, torch_version
from harness.reports.records import SCHEMA_VERSION
from harness.reliability.hangs import REPORT_PLUGIN as PLUGIN_NAME
from harness.reliability.safe import describe_exception, safe_str

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FLUSH_SECONDS = 5.0
NOT_APPLICABLE = pytest.StashKey[dict]()  # the tests --only-declared deselected: {why: how many}
NOT_APPLICABLE_KEY = "cudagraph_not_applicable"  # the same, in an xdist worker's workeroutput


def ended_count(tests) -> int:
    """Tests that ended: neither still running, nor stopped by Ctrl-C, nor left unrun."""
    return sum(r["outcome"] not in ("running", "interrupted", "not run") for r in tests)


class ReportDirError(Exception):
    """--report-dir names something that cannot hold the report."""


def report_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ReportDirError(f"--report-dir {value}: that is a file; name a directory (it is created if missing)")
    return path


def device_description(runtime) -> str:
    describe = getattr(runtime, "device_description", None)
    if callable(describe):
        try:
            return safe_str(describe(), 200)
        except Exception as exc:  # noqa: BLE001 - the runtime's own description is a courtesy
            return f"unknown: the runtime's device_description() raised {describe_exception(exc, 200)}"
    if runtime.capabilities.execution and cuda_available():
        import torch

        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    if runtime.capabilities.execution and _torch_version():
        return f"cpu ({platform.machine()}; torch {_torch_version()}, no CUDA device)"
    return f"cpu ({platform.machine()}), policy only"


UNKNOWN_COMMIT = "unknown"
PROJECT = "cudagraph-conformance"


def project_root() -> Path:
    """Where this harness is: a checkout's top level, or site-packages for an installed wheel."""
    return Path(harness.__file__).resolve().parent.parent


def is_project_checkout(top: Path) -> bool:
    """Whether `top` is this project's own source tree: its pyproject.toml names the project."""
    try:
        return tomllib.loads((top / "pyproject.toml").read_text()).get("project", {}).get("name") == PROJECT
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def _git(top: Path, *args: str) -> str | None:
    """git's output for `args` in `top`; None where git cannot answer."""
    try:
        out = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit(top: Path | None = None) -> str:
    """The commit of the harness's own checkout; "unknown" for an installed wheel, or a tree that is
    not its own git checkout (an exported tree inside another repository has that one's commit)."""
    top = project_root() if top is None else top
    if not is_project_checkout(top):
        return UNKNOWN_COMMIT
    lines = (_git(top, "rev-parse", "--show-toplevel", "HEAD") or "").splitlines()
    if len(lines) != 2 or len(lines[1]) != 40:
        return UNKNOWN_COMMIT
    return lines[1] if Path(lines[0]).resolve() == top.resolve() else UNKNOWN_COMMIT


def tree_changed(top: Path | None = None) -> bool | None:
    """Whether the checkout's tracked files differ from its commit (a run of uncommitted code, or a
    copy of a working tree beside an older .git); None where there is no commit to differ from."""
    top = project_root() if top is None else top
    if git_commit(top) == UNKNOWN_COMMIT:
        return None
    status = _git(top, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


def file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror or type(exc).__name__}"


def suites_digest(files: dict[str, str]) -> str:
    """One digest for the suite files that ran ({path relative to the rootdir: its sha256}): two
    reports with the same digest ran the same test code, from a checkout or from a wheel."""
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _torch_version() -> str | None:
    """As the header prints it: "2.13.0+cpu", the release and its build (machine.torch_version)."""
    release, build = torch_version()
    return release and (f"{release}+{build}" if build else release)


class RunReport:
    def __init__(self, config, conformance):
        self.config = config
        self.conformance = conformance
        self.runtime = conformance.runtime
        self.directory = report_dir(config.getoption("report_dir"))
        self.results: dict[str, dict] = {}
        self.finished_tests: set[str] = set()  # every phase reported
        self.started = time.time()
        self.last_flush = 0.0
        self.written: list[Path] = []
        self.plots: list[Path] = []
        self.finished = False
        self.interrupted = False
        self.render_error: str | None = None
        # Read now, so a bad --baseline is a usage error before any test runs.
        self.baseline_runs = [render.load_run(path) for path in config.getoption("baseline", None) or []]
        self.threshold = config.getoption("regression_threshold", 0.10)
        self.plots_wanted = not config.getoption("no_plots", False)
        self.regressions: list[dict] = []
        self.rootpath = Path(config.rootpath)
        self.file_digests: dict[str, str] = {}  # each test file's sha256, read once
        self.collected: int | None = None  # tests this run was to run (after any deselection)
        self.not_applicable: dict[str, int] = {}  # what --only-declared deselected: {why: how many}

    # -- pytest hooks (this object is registered as a plugin) -----------------------------
    def pytest_collection_finish(self, session):
        self.collected = len(session.items)
        self.not_applicable = session.config.stash.get(NOT_APPLICABLE, {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.collected is None:  # every worker collects the same tests
            self.collected = len(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.not_applicable = self.not_applicable or getattr(node, "workeroutput", {}).get(NOT_APPLICABLE_KEY, {})

    def pytest_runtest_logreport(self, report):
        entry = self.results.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0})
        entry["duration"] = round(entry["duration"] + report.duration, 6)
        outcome = _outcome(report)
        if report.when == "call":
            records = [value for key, value in report.user_properties if key == "record"]
            if records:
                entry["records"] = records
        if _SEVERITY[outcome] > _SEVERITY[entry["outcome"]]:
            entry["outcome"] = outcome
            entry["reason"] = _reason(report)
        elif outcome in ("failed", "error") and entry["outcome"] in ("failed", "error"):
            # A failed test whose teardown fails too (taint, a broken CUDA context): both reasons count.
            entry["reason"] += f"\n\nthen, in {report.when}: {_reason(report)}"
        if report.when not in ("setup", "call"):  # teardown, or xdist's report of a crashed worker
            self.finished_tests.add(report.nodeid)
        if time.time() - self.last_flush > FLUSH_SECONDS:
            self.write()

    def record_crash(self, nodeid: str, when: str, reason: str) -> None:
        """A test the process cannot finish (harness.reliability.watchdog): into the report, written now."""
        self.pytest_runtest_logreport(pytest.TestReport(nodeid, (nodeid.split("::")[0], None, nodeid), {}, "failed",
                                                        reason, when))
        self.write()

    def not_run(self, nodeid: str, reason: str) -> None:
        """A collected test no process ran (harness.reliability.workers: xdist stopped replacing crashed workers)."""
        self.results[nodeid] = {"nodeid": nodeid, "outcome": "not run", "duration": 0.0, "reason": reason}
        self.finished_tests.add(nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        self.finished = True
        self.interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        try:
            self.write()
        except KeyboardInterrupt:  # Ctrl-C while the report renders: the JSON says so, in one line
            self._write_interrupted()
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            return
        if render.counted(self.regressions) and self.config.getoption("fail_on_regression", False) \
                and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        tests = list(self.results.values())
        for change in coverage.changes(self.runtime.capabilities, tests):
            terminalreporter.write_line(coverage.describe(self.runtime.name, change), yellow=True)
        if self.written:
            terminalreporter.write_line(f"conformance report: {', '.join(str(p) for p in self.written)}")
        if self.interrupted:
            terminalreporter.write_line(f"cudagraph-conformance: the run stopped early {self._how_far()}; the report "
                                        "says complete: false", yellow=True)
        if self.plots:
            terminalreporter.write_line(f"plots: {', '.join(str(p) for p in self.plots)}")
        if not self.baseline_runs:
            return
        beyond = f"beyond {100 * self.threshold:.0f}%"
        if self.regressions:
            terminalreporter.section(f"regressions against baseline ({beyond})", red=bool(render.counted(self.regressions)))
            for regression in self.regressions:
                terminalreporter.write_line(render.describe_regression(regression))
        else:
            terminalreporter.write_line(f"baseline comparison: no regression {beyond}")

    # -- output -------------------------------------------------------------------------
    @functools.cached_property
    def device(self) -> str:
        # Read once, at the first flush: the watchdog's flush must not wait on a device a test has wedged.
        return device_description(self.runtime)

    @functools.cached_property
    def commit(self) -> str:
        # Once per run, not at every flush: a subprocess each time would hold up the watchdog's flush too.
        return git_commit()

    @functools.cached_property
    def changed(self) -> bool | None:
        return tree_changed()

    def known_failures_files(self) -> list[dict]:
        known = self.config.pluginmanager.get_plugin("cudagraph-conformance-known-failures")
        return known.as_report() if known is not None else []

    def suite_files(self, tests: list[dict]) -> dict[str, str]:
        """{test file: sha256} for the files whose tests are in the report."""
        for path in {test["nodeid"].split("::")[0] for test in tests} - set(self.file_digests):
            self.file_digests[path] = file_digest(self.rootpath / path)
        return {path: self.file_digests[path] for path in sorted({t["nodeid"].split("::")[0] for t in tests})}

    def as_dict(self) -> dict:
        runtime = self.runtime
        tests = [self._as_ended(r) for r in sorted(self.results.values(), key=lambda r: r["nodeid"])]
        counts = Counter(r["outcome"] for r in tests)
        torch_release, torch_build = torch_version()
        files = self.suite_files(tests)
        return {
            "schema_version": SCHEMA_VERSION,
            "harness_version": harness.__version__,
            "runtime": runtime.name,
            "version": runtime.version,
            "capabilities": asdict(runtime.capabilities),
            "device": self.device,
            "graph_backend": self.conformance.graph_backend,
            "hypothesis": {"profile": self.conformance.hypothesis_profile, "seed": self.conformance.hypothesis_seed},
            "torch": torch_release,  # what a version range compares: "2.13.0"
            "torch_build": torch_build,  # the wheel's local tag: "cpu", "cu128"; null for none
            "python": platform.python_version(),
            "git_commit": self.commit,
            "git_tree_changed": self.changed,
            "suites_digest": suites_digest(files),
            "suite_files": files,
            "known_failures_files": self.known_failures_files(),
            "args": list(self.config.invocation_params.args),
            "started": self.started,
            "seconds": round(time.time() - self.started, 3),
            # every collected test ended, and no Ctrl-C: a second SIGINT under xdist can end the
            # session with another status, so the count is the word that counts
            "complete": self.finished and not self.interrupted and len(tests) >= (self.collected or 0)
                        and all(r["outcome"] not in ("running", "interrupted") for r in tests),
            "tests_ended": ended_count(tests),
            "summary": dict(counts),
            "collected": self.collected,
            "not_applicable": self.not_applicable,
            "checkpoint": checkpoint_verdict.report_entry(runtime, self.config.getoption("preset", "tiny"), tests),
            "coverage_changes": coverage.changes(runtime.capabilities, tests),
            "tests": tests,
        }

    def _how_far(self) -> str:
        if self.collected is None:
            return "while the tests were collected, before any ran"
        ended = ended_count(map(self._as_ended, self.results.values()))
        return f"after {ended} of {self.collected} collected tests ended"

    def _as_ended(self, entry: dict) -> dict:
        """A test with phases still to come: running now, or interrupted when the run was stopped."""
        if entry["nodeid"] in self.finished_tests or entry["outcome"] != "passed":
            return entry
        if self.finished:
            return {**entry, "outcome": "interrupted", "reason": "the run was stopped before this test finished"}
        return {**entry, "outcome": "running"}

    def _write_interrupted(self) -> None:
        """The JSON again, marked incomplete, with a further Ctrl-C held off while it is written."""
        self.interrupted = True
        held = signal.signal(signal.SIGINT, signal.SIG_IGN) if threading.current_thread() is threading.main_thread() \
            else None
        try:
            if self.directory is not None:
                data = self.as_dict()
                stem = self.directory / f"conformance-{self.runtime.name}"
                stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=safe_str) + "\n")
                stem.with_suffix(".md").write_text(
                    f"# Conformance report: {self.runtime.name}\n\nThe run was stopped (Ctrl-C) while this summary "
                    f"was rendered; {stem.with_suffix('.json').name} beside this file has every result.\n")
                self.written = [stem.with_suffix(".json"), stem.with_suffix(".md")]
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line("cudagraph-conformance: stopped (Ctrl-C) while the report was rendered; "
                                    "its JSON says complete: false", yellow=True)
        finally:
            if held is not None:
                signal.signal(signal.SIGINT, held)

    def write(self) -> None:
        self.last_flush = time.time()
        if self.directory is None and not (self.finished and self.baseline_runs):
            return  # nothing to write and nothing to compare
        data = self.as_dict()
        if self.finished and self.baseline_runs:
            self.regressions = render.compare([data], self.baseline_runs, self.threshold)
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"conformance-{self.runtime.name}"
        json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
        json_path.write_text(json.dumps(data, indent=1, default=safe_str) + "\n")
        self.written = [json_path, md_path]
        try:
            if self.finished:  # plots once, at the end: the flushes during the run refresh only the text
                self.plots = render.write_report([data], self.directory, md_path.name, threshold=self.threshold,
                                                 regressions=self.regressions if self.baseline_runs else None,
                                                 plots=self.plots_wanted).plots
            else:
                md_path.write_text(render.render_markdown(data))
        except Exception as exc:  # noqa: BLE001 - the JSON is written; a summary that fails must not end the run
            self.render_error = f"the Markdown summary could not be rendered: {describe_exception(exc)}"
            md_path.write_text(f"# Conformance report: {self.runtime.name}\n\n{self.render_error}. "
                               f"{json_path.name} beside this file has every result.\n")
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None and self.finished:
                terminal.write_line(f"cudagraph-conformance: {self.render_error}", yellow=True)


_SEVERITY = {"passed": 0, "skipped": 1, "xfailed": 2, "xpassed": 3, "error": 4, "failed": 5}
# Reported only for tests that never finished: "running" (a flush during the test), "interrupted";
# and "not run" for tests no process ran, the one that would have run them having died.


def _outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.passed:
        return "passed"
    if report.skipped:
        return "skipped"
    return "error" if report.when in ("setup", "teardown") else "failed"  # xdist's crash reports say when="???"


def _reason(report) -> str:
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None) or ""
    crash = crash.removeprefix("Failed: ").strip()
    if hasattr(report, "wasxfail"):
        # What the xfail stands for, and the failure itself: the finding's figures, run by run.
        return report.wasxfail + (f"\n\nthe failure it covers: {safe_str(crash, limit=2000)}" if crash else "")
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    # The crash message is the check's own text (or the exception's); the tail of the longer
    # representation holds the last frames. Long tracebacks are cut in the middle, never the message.
    text = safe_str(report.longrepr, limit=100_000)
    if len(text) <= 4000:
        return text
    tail = text[-1500:]
    if crash and crash not in tail:
        return safe_str(crash, limit=4000) + "\n...\n" + tail
    return safe_str(text, limit=4000)  # its start and its end, the cut marked
