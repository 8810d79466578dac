"""The policy suites catch every deliberately broken runtime (tests/broken_runtimes.py), and the
reference passes them all. The catch table (mutant -> suites that caught it) is printed at the end.
"""
import pytest

from tests import broken_runtimes
from tests.catching import assert_mutant_caught, caught_by, run_suites

SIZES, PADDING, DISPATCH = "test_capture_sizes.py", "test_padding.py", "test_dispatch.py"
RESOLUTION, DP = "test_mode_resolution.py", "test_data_parallel.py"
POLICY_SUITES = [SIZES, PADDING, DISPATCH, RESOLUTION, DP]
# mutant -> (the tests that must catch it, words the failure must contain). Each names the test
# built to catch that class of bug; the catch table shows what the run saw fail.
MUST_CATCH = {
    "PaddingOffByOne": ([f"{PADDING}::test_every_batch_pads_to_the_smallest_size_that_holds_it"],
                        "padded size for every batch"),
    "PaddingRoundsDown": ([f"{PADDING}::test_every_batch_pads_to_the_smallest_size_that_holds_it"], "padded size"),
    "ClampsAboveMax": ([f"{PADDING}::test_above_the_max_runs_eager_and_at_the_max_pads_nothing"], "padded"),
    "MissingOffGridAppend": ([f"{SIZES}::test_spec_counts"], "number of capture sizes"),
    "NoSpeculativeRounding": ([f"{SIZES}::test_v1_full_decode_sizes_hold_whole_requests"], "multiple of q"),
    "SilentDowngrade": ([f"{RESOLUTION}::test_default_table"], "must warn"),
    "FullWithNeverBackend": ([f"{RESOLUTION}::test_default_table"], "rejected"),
    "PiecewiseBeforeFull": ([f"{DISPATCH}::test_spec_examples"], "dispatch of"),
    "LoraCountNotRounded": ([f"{DISPATCH}::test_lora_counts_round_up_to_a_captured_case"], "active adapters"),
    "DataParallelMovesUp": ([f"{DP}::test_ranks_agree_and_never_move_up"], "[data-parallel consensus]"),
    "RejectsEveryConfig": ([f"{SIZES}::test_sizes_are_sorted_unique_positive_and_fit_the_token_budget"],
                           "must be answered, not rejected"),
    "KeyIsTokensPlusThree": ([f"{DISPATCH}::test_a_decode_graph_key_is_the_runtimes_own_padded_size"], "padded_size()"),
    "MixedBatchRunsDecodeGraph": ([f"{DISPATCH}::test_runtime_mode_is_one_the_config_mode_can_run"],
                                  "under FULL_DECODE_ONLY runs one of"),
    "PaddingNotMonotone": ([f"{PADDING}::test_padding_is_monotone_and_lands_on_a_size"], "padded"),
    "V2RoundsSizes": ([f"{SIZES}::test_spec_counts"], "number of capture sizes"),
    "V2ExactKeyDispatch": ([f"{DISPATCH}::test_spec_examples"], "dispatch of"),
    "V2DataParallelSharesPaddedSizes": ([f"{DP}::test_spec_examples"], "what each rank runs"),
    "VagueRejection": ([f"{RESOLUTION}::test_every_downgrade_warns_and_lands_on_a_config_mode"],
                       "must name what would work"),
    "IgnoresAdapters": ([f"{DISPATCH}::test_a_batch_with_adapters_runs_eager_or_in_a_graph_that_holds_them"],
                        "leave adapters out"),
    "DeclaresVllm025AnswersVllm033": ([f"{SIZES}::test_spec_counts", f"{DISPATCH}::test_spec_examples"],
                                      "number of capture sizes"),
    "DeclaresVllm025V1AnswersVllm033V1": ([f"{SIZES}::test_spec_counts"], "number of capture sizes"),
    "DeclaresVllm025V1AnswersV2": ([f"{SIZES}::test_spec_counts", f"{DISPATCH}::test_spec_examples"],
                                   "number of capture sizes"),
    "GridGapsAbove256": ([f"{DISPATCH}::test_every_batch_size_matches_the_oracle"], "capture sizes"),
    "V2DecodeKeysPastTheMax": ([f"{DISPATCH}::test_every_batch_size_matches_the_oracle",
                                f"{DISPATCH}::test_every_batch_size_pads_and_dispatches_by_its_own_policy"],
                               "dispatch of every uniform batch"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_runtimes.MUTANTS} == set(MUST_CATCH)


def test_a_runtime_with_its_own_policy_is_held_only_to_the_generic_checks(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:OwnPolicy", POLICY_SUITES)
    assert caught_by(report) == set()
    skipped = [t for t in report["tests"] if t["outcome"] == "skipped"]
    assert skipped and all("vllm_rules" in t["reason"] for t in skipped)


def test_a_piecewise_only_policy_is_asked_about_the_modes_it_runs(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:PiecewiseOnly", POLICY_SUITES)
    assert caught_by(report) == set(), [t["reason"][:300] for t in report["tests"] if t["outcome"] == "failed"]


def test_a_policy_of_its_own_may_reject_user_given_sizes(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:RejectsUserSizes", ["test_padding.py"])
    assert caught_by(report) == set()
    assert any("rejects user-given capture sizes" in (t.get("reason") or "") for t in report["tests"])


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
    assert_mutant_caught(pytester, record_property, broken_runtimes, mutant, MUST_CATCH)
