"""The run's report: one JSON file is the source of truth, a Markdown summary is rendered from it
(by `harness.render`, which also draws the plots and compares against a baseline).

It is written when the session ends and also every few seconds while tests run, so a run that
crashes part-way still leaves a report of what ran.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import pytest

from . import render
from .records import SCHEMA_VERSION
from .safe import safe_str

FLUSH_SECONDS = 5.0


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
        return describe()
    if "torch" in sys.modules or runtime.capabilities.execution:
        try:
            import torch

            if torch.cuda.is_available():
                return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
            return f"cpu (torch {torch.__version__}, no CUDA device)"
        except ImportError:
            pass
    return f"cpu ({platform.machine()}), policy only"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        return commit if out.returncode == 0 and len(commit) == 40 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _torch_version() -> str | None:
    # Read from the installed metadata: importing torch costs seconds on a policy-only run.
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


class RunReport:
    def __init__(self, config, conformance):
        self.config = config
        self.conformance = conformance
        self.runtime = conformance.runtime
        self.directory = report_dir(config.getoption("report_dir"))
        self.results: dict[str, dict] = {}
        self.started = time.time()
        self.last_flush = 0.0
        self.written: list[Path] = []
        self.plots: list[Path] = []
        self.finished = False
        # Read now, so a bad --baseline is a usage error before any test runs.
        self.baseline_runs = [render.load_run(path) for path in config.getoption("baseline", None) or []]
        self.threshold = config.getoption("regression_threshold", 0.10)
        self.regressions: list[dict] = []

    # -- pytest hooks (this object is registered as a plugin) -----------------------------
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
        if time.time() - self.last_flush > FLUSH_SECONDS:
            self.write()

    def pytest_sessionfinish(self, session, exitstatus):
        self.finished = True
        self.write()
        if self.regressions and self.config.getoption("fail_on_regression", False) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.written:
            terminalreporter.write_line(f"conformance report: {', '.join(str(p) for p in self.written)}")
        if self.plots:
            terminalreporter.write_line(f"plots: {', '.join(str(p) for p in self.plots)}")
        if not self.baseline_runs:
            return
        beyond = f"beyond {100 * self.threshold:.0f}%"
        if self.regressions:
            terminalreporter.section(f"regressions against baseline ({beyond})", red=True)
            for regression in self.regressions:
                terminalreporter.write_line(render.describe_regression(regression))
        else:
            terminalreporter.write_line(f"baseline comparison: no regression {beyond}")

    # -- output -------------------------------------------------------------------------
    def as_dict(self) -> dict:
        runtime = self.runtime
        counts = Counter(r["outcome"] for r in self.results.values())
        torch_version = _torch_version()
        return {
            "schema_version": SCHEMA_VERSION,
            "runtime": runtime.name,
            "version": runtime.version,
            "capabilities": asdict(runtime.capabilities),
            "device": device_description(runtime),
            "graph_backend": self.conformance.graph_backend,
            "hypothesis": {"profile": self.conformance.hypothesis_profile, "seed": self.conformance.hypothesis_seed},
            "torch": torch_version,
            "python": platform.python_version(),
            "git_commit": git_commit(),
            "args": list(self.config.invocation_params.args),
            "started": self.started,
            "seconds": round(time.time() - self.started, 3),
            "complete": self.finished,
            "summary": dict(counts),
            "tests": sorted(self.results.values(), key=lambda r: r["nodeid"]),
        }

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
        json_path.write_text(json.dumps(data, indent=1, default=str) + "\n")
        if self.finished:  # plots once, at the end: the flushes during the run refresh only the text
            self.plots = render.write_report([data], self.directory, md_path.name, threshold=self.threshold,
                                             regressions=self.regressions if self.baseline_runs else None).plots
        else:
            md_path.write_text(render.render_markdown(data))
        self.written = [json_path, md_path]


_SEVERITY = {"passed": 0, "skipped": 1, "xfailed": 2, "xpassed": 3, "error": 4, "failed": 5}


def _outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.passed:
        return "passed"
    if report.skipped:
        return "skipped"
    return "failed" if report.when == "call" else "error"


def _reason(report) -> str:
    if hasattr(report, "wasxfail"):
        return report.wasxfail
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    # The crash message is the check's own text (or the exception's); the tail of the longer
    # representation holds the last frames. Long tracebacks are cut in the middle, never the message.
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None) or ""
    crash = crash.removeprefix("Failed: ").strip()
    text = safe_str(report.longrepr, limit=100_000)
    if len(text) <= 4000:
        return text
    tail = text[-1500:]
    return tail if crash in tail else safe_str(crash, limit=4000) + "\n...\n" + tail
