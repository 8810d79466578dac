"""The policy suites catch every deliberately broken runtime (tests/broken_runtimes.py), and the
reference passes them all. The catch table (mutant -> suites that caught it) is printed at the end.
"""
import pytest

from tests import broken_runtimes
from tests.catching import assert_caught, caught_by, run_suites

POLICY_SUITES = ["test_capture_sizes.py", "test_padding.py", "test_dispatch.py", "test_mode_resolution.py",
                 "test_data_parallel.py"]
# mutant -> (suite files to run, words the failure must contain)
MUST_CATCH = {
    "PaddingOffByOne": (["test_padding.py"], "padded size for every batch"),
    "PaddingRoundsDown": (["test_padding.py"], "padded size"),
    "ClampsAboveMax": (["test_padding.py"], "padded"),
    "MissingOffGridAppend": (["test_capture_sizes.py"], "capture sizes"),
    "NoSpeculativeRounding": (["test_capture_sizes.py"], "multiple of q"),
    "SilentDowngrade": (["test_mode_resolution.py"], "must warn"),
    "FullWithNeverBackend": (["test_mode_resolution.py"], "rejected"),
    "PiecewiseBeforeFull": (["test_dispatch.py"], "dispatch of"),
    "LoraCountNotRounded": (["test_dispatch.py"], "active adapters"),
    "DataParallelMovesUp": (["test_data_parallel.py"], "what each rank runs"),
    "RejectsEveryConfig": (["test_capture_sizes.py"], "must be answered, not rejected"),
    "KeyIsTokensPlusThree": (["test_dispatch.py"], "padded_size()"),
    "MixedBatchRunsDecodeGraph": (["test_dispatch.py"], "mixed batch under FULL_DECODE_ONLY"),
    "PaddingNotMonotone": (["test_padding.py"], "padded size"),
    "V2RoundsSizes": (["test_capture_sizes.py"], "capture sizes"),
    "V2ExactKeyDispatch": (["test_dispatch.py"], "dispatch of"),
    "V2DataParallelSharesPaddedSizes": (["test_data_parallel.py"], "what each rank runs"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_runtimes.MUTANTS} == set(MUST_CATCH)


def test_reference_passes_every_policy_suite(pytester):
    report = run_suites(pytester, "reference", POLICY_SUITES)
    assert report["complete"]
    assert caught_by(report) == set()
    assert report["summary"].get("passed", 0) > 100


def test_a_runtime_with_its_own_policy_is_held_only_to_the_generic_checks(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:OwnPolicy", POLICY_SUITES)
    assert caught_by(report) == set()
    skipped = [t for t in report["tests"] if t["outcome"] == "skipped"]
    assert skipped and all("vllm_policy" in t["reason"] for t in skipped)


def test_a_runtime_declaring_only_data_parallel_is_not_asked_to_dispatch(pytester):
    pytester.makepyfile(dp_only="""
        from harness.protocol import Capabilities
        class DataParallelOnly:
            name, version = "dp-only", "1"
            capabilities = Capabilities(data_parallel=True)
            def dp_dispatch(self, config, ranks):
                raise AssertionError("not asked: the suite's checks need dispatch() too")
    """)
    pytester.syspathinsert()
    report = run_suites(pytester, "dp_only:DataParallelOnly", ["test_data_parallel.py"])
    assert {t["outcome"] for t in report["tests"]} == {"skipped"}


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_suites_catch_the_mutant(pytester, record_property, mutant):
    suites, words = MUST_CATCH[mutant]
    assert_caught(pytester, record_property, f"tests.broken_runtimes:{mutant}", getattr(broken_runtimes, mutant).__doc__,
                  suites, set(suites), mentions=(words,))
