"""Running suites against a broken runtime and reading which suites caught it.

Each run is an in-process pytest session over the named suite files (or single tests) with the
harness's own JSON report; in-process, because a fresh interpreter per broken runtime costs
seconds of imports and the harness keeps its state in objects registered per session.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from filelock import FileLock
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
    """The JSON report of a session over `targets` (suite file names, or `file::test` ids); without
    plots, which nothing here reads (tests/test_render.py draws them)."""
    parent = _register_catch_profile()
    outer = getattr(settings, "get_current_profile_name", lambda: parent)()  # absent from older hypothesis
    report_dir = pytester.path / "report"
    try:
        result = pytester.runpytest(
            *[str(SUITES / target) for target in targets], "--runtime", runtime_spec, "--report-dir", str(report_dir),
            "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly", "--rootdir", str(ROOT),
            "--hypothesis-profile", CATCH_PROFILE, "--no-plots", *extra,
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


def assert_mutant_caught(pytester, record_property, module, mutant: str, must_catch: dict) -> None:
    """One row of a catch table: `must_catch[mutant]` is (targets, words the failure must contain); a
    target may name the runtime as {name}; the suite files of the targets must each catch it."""
    runtime = getattr(module, mutant)
    targets, words = must_catch[mutant]
    targets = [target.format(name=getattr(runtime, "name", "")) for target in targets]
    assert_caught(pytester, record_property, f"{module.__name__}:{mutant}", runtime.__doc__, targets,
                  {target.split("::")[0] for target in targets}, mentions=(words,))


# The example engine's suites from this checkout, as its own test and the packaging test both read them.
CHECKOUT_SEED = "12345"
CHECKOUT_OPTIONS = ("--runtime", "bucket-engine", "-p", "no:xdist", "--hypothesis-seed", CHECKOUT_SEED, "-q")


def checkout_run(pytester, report_dir: Path) -> dict:
    """Every suite against the bucket engine (its entry point) from this checkout, in this process, as
    `cudagraph-conformance` runs them from the wheel (tests/test_packaging.py): pytest's exit status,
    the end of its output and the JSON report."""
    outer = getattr(settings, "get_current_profile_name", lambda: None)()
    try:
        result = pytester.runpytest(str(SUITES), *CHECKOUT_OPTIONS, "--rootdir", str(ROOT), "-p", "no:cacheprovider",
                                    "--tb=native", "--report-dir", str(report_dir))
        result.reprec.calls.clear()  # see run_suites
    finally:
        if outer is not None:
            settings.load_profile(outer)
    (report,) = report_dir.glob("conformance-*.json") if report_dir.is_dir() else (None,)
    return {"ret": int(result.ret), "output": result.stdout.str()[-3000:],
            "report": json.loads(report.read_text()) if report else None}


def once_per_run(tmp_path_factory, name: str, make) -> dict:
    """make(folder), a JSON-able result, computed once per test run and read by every test that asks
    for `name`, on any xdist worker: the first to ask makes it (the others wait for it); a folder
    of its own is the run's alone (xdist's workers share the parent of their base temp)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, saved = root / f"once-{name}", root / f"once-{name}.json"
    with FileLock(str(root / f"once-{name}.lock")):
        if not saved.exists():
            folder.mkdir(exist_ok=True)
            saved.write_text(json.dumps(make(folder)))
    return json.loads(saved.read_text())
