"""The suites catch every deliberately broken runtime, and the reference passes them all.

Each case runs a real pytest session over the suites against one runtime and reads the
harness's own JSON report. The catch table (mutant -> suites that failed) is printed at the end.
"""
import json
from pathlib import Path

import pytest

from tests import broken_runtimes

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"

# Which suite each mutant must fail, at least.
MUST_CATCH = {
    "PaddingOffByOne": {"test_padding.py"},
    "PaddingRoundsDown": {"test_padding.py"},
    "ClampsAboveMax": {"test_padding.py"},
    "MissingOffGridAppend": {"test_capture_sizes.py"},
    "NoSpeculativeRounding": {"test_capture_sizes.py"},
    "SilentDowngrade": {"test_mode_resolution.py"},
    "FullWithNeverBackend": {"test_mode_resolution.py"},
    "PiecewiseBeforeFull": {"test_dispatch.py"},
    "LoraCountNotRounded": {"test_dispatch.py"},
    "DataParallelMovesUp": {"test_data_parallel.py"},
    "V2RoundsSizes": {"test_capture_sizes.py"},
    "V2ExactKeyDispatch": {"test_dispatch.py"},
    "V2DataParallelSharesPaddedSizes": {"test_data_parallel.py"},
}


POLICY_SUITES = ["test_capture_sizes.py", "test_padding.py", "test_dispatch.py", "test_mode_resolution.py",
                 "test_data_parallel.py"]


def run_suites(pytester, runtime_spec, suites=POLICY_SUITES):
    report_dir = pytester.path / "report"
    # A subprocess per run: each runtime gets a clean interpreter, as in real use.
    pytester.runpytest_subprocess(
        *[str(SUITES / name) for name in suites], "--runtime", runtime_spec, "--report-dir", str(report_dir),
        "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
    )
    (report,) = report_dir.glob("conformance-*.json")
    return json.loads(report.read_text())


def failed_suites(report):
    return {Path(t["nodeid"].split("::")[0]).name for t in report["tests"] if t["outcome"] in ("failed", "error")}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_runtimes.MUTANTS} == set(MUST_CATCH)


def test_reference_passes_every_policy_suite(pytester):
    report = run_suites(pytester, "reference")
    assert report["complete"]
    assert failed_suites(report) == set()
    assert report["summary"].get("passed", 0) > 100


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_suites_catch_the_mutant(pytester, record_property, mutant):
    report = run_suites(pytester, f"tests.broken_runtimes:{mutant}")
    caught = failed_suites(report)
    record_property("caught_by", sorted(caught))
    missing = MUST_CATCH[mutant] - caught
    assert not missing, f"{mutant} ({getattr(broken_runtimes, mutant).__doc__.strip()}) escaped {sorted(missing)}"
