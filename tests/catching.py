"""Running suites against a broken runtime and reading which suites caught it.

Each run is an in-process pytest session over the named suite files (or single tests) with the
harness's own JSON report; in-process, because a fresh interpreter per broken runtime costs
seconds of imports and the harness keeps its state in objects registered per session.
"""
from __future__ import annotations

import json
from pathlib import Path

from hypothesis import Phase, settings

from harness.session.hypothesis_profiles import default_profile

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"


CATCH_PROFILE = "catch"


def _register_catch_profile() -> str:
    """The harness's profile for this run (ci under CI, else dev: the same examples drawn), without
    the shrink phase, and its name. A catch session asks whether a suite fails and what its message
    says, not for the smallest failing example, and shrinking was most of a failing property test's time."""
    parent = default_profile()
    settings.register_profile(CATCH_PROFILE, settings.get_profile(parent),
                              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])
    return parent


def run_suites(pytester, runtime_spec: str, targets, *extra: str) -> dict:
    """The JSON report of a session over `targets` (suite file names, or `file::test` ids)."""
    parent = _register_catch_profile()
    outer = getattr(settings, "get_current_profile_name", lambda: parent)()  # absent from older hypothesis
    report_dir = pytester.path / "report"
    try:
        result = pytester.runpytest(
            *[str(SUITES / target) for target in targets], "--runtime", runtime_spec, "--report-dir", str(report_dir),
            "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly", "--rootdir", str(ROOT),
            "--hypothesis-profile", CATCH_PROFILE, *extra,
        )
        # Hypothesis's caches keep some of a session's test functions, and through their modules' loader
        # the whole session: its recorded hook calls and their reports (frames and tracebacks of every
        # failure) would then live to the end of the worker, and every full collection walk them.
        result.reprec.calls.clear()
    finally:
        settings.load_profile(outer)  # the session loaded the catch profile into hypothesis's global settings
    (report,) = report_dir.glob("conformance-*.json")
    return json.loads(report.read_text())


def caught_by(report: dict) -> set[str]:
    """Suite files with a failed or erroring test."""
    return {Path(t["nodeid"].split("::")[0]).name for t in report["tests"] if t["outcome"] in ("failed", "error")}


def failure_text(report: dict) -> str:
    return "\n".join(t.get("reason") or "" for t in report["tests"] if t["outcome"] in ("failed", "error"))


def assert_caught(pytester, record_property, runtime_spec: str, doc: str, targets, must_catch: set[str],
                  mentions: tuple[str, ...] = ()) -> None:
    report = run_suites(pytester, runtime_spec, targets)
    caught = caught_by(report)
    record_property("caught_by", sorted(caught))
    missing = must_catch - caught
    assert not missing, f"{runtime_spec} ({doc.strip()}) escaped {sorted(missing)}"
    text = failure_text(report)
    absent = [word for word in mentions if word not in text]
    assert not absent, f"{runtime_spec} was caught, but the failure does not say {absent}:\n{text[-3000:]}"
