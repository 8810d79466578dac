"""The execution suites catch every deliberately broken engine (tests/broken_engines.py).

Each mutant runs, in a pytest session of its own, the tests that must catch it; the reference
passing every suite is checked by the README's test command running `suites/` itself. The catch
table (mutant -> suites that caught it) is printed at the end of the run.
"""
import pytest

from tests import broken_engines
from tests.catching import assert_mutant_caught

# One parametrisation each where one is enough to catch the bug: {name} is the runtime's name.
BOUNDARY = "test_replay_equivalence.py::test_graph_equals_eager_at_every_bucket_boundary[{name}-FULL_AND_PIECEWISE]"
FILLS = "test_padding_isolation.py::test_real_rows_ignore_what_padded_rows_hold[{name}-random-FULL_AND_PIECEWISE]"
AFTER_PHASE = "test_capture_accounting.py::test_nothing_is_captured_after_the_capture_phase"
MOVED = "test_static_addresses.py::test_a_moved_input_fails_loudly_or_is_not_read[{name}-uniform]"
PADDED_INPUTS = "test_padding_isolation.py::test_padded_inputs_are_valid_and_do_not_remember_earlier_steps[{name}-FULL]"

# mutant -> (tests to run, suites that must fail, words the failure must contain)
MUST_CATCH = {
    "SlotWraps": (["test_padding_isolation.py::test_padded_rows_write_no_kv_slot[{name}-FULL]"], "last slot"),
    "StaleBlockTables": ([BOUNDARY], "differ"),
    "NewInputTensors": ([MOVED, BOUNDARY], "read the memory it was captured with"),
    "PadsBelowBatch": ([BOUNDARY], "pad"),
    "LeakyReduction": ([FILLS], "real rows changed"),
    "StalePaddedPositions": (
        ["test_padding_isolation.py::test_padded_inputs_are_valid_and_do_not_remember_earlier_steps[{name}-FULL]"],
        "stale rows"),
    "KeptRowsKeepTheirTables": (
        ["test_replay_equivalence.py::test_decode_rows_follow_their_requests[{name}-FULL_AND_PIECEWISE]"],
        "the graph step is what differs"),
    # Served first, the boundary test gives the shared engine its history; the rows test says so.
    "EagerDriftsWithHistory": (
        [BOUNDARY, "test_replay_equivalence.py::test_decode_rows_follow_their_requests[{name}-FULL_AND_PIECEWISE]"],
        "the shared twin's eager step moved"),
    "KeptRowsUpdateOneTokenARow": (
        ["test_replay_equivalence.py::test_verify_rows_follow_their_requests[{name}]"], "verify (q = 2) step"),
    "RowsKeepTheirTablesOnEveryPath": (
        ["test_numerical_anchor.py::test_decode_rows_follow_their_requests[{name}-NONE]"], "transformers"),
    "IgnoresPaddingFills": ([FILLS], "did not reach the padded rows"),
    "OutputsOverwritten": (["test_static_addresses.py::test_held_output_lives_as_declared"], "changed after the next step"),
    "SwapBreaksTheStep": ([MOVED], "Error"),
    "SilentDowngrade": (["test_backend_support.py::test_resolution_at_build_follows_the_policy"], "must warn"),
    "ResolvesEverythingToNone": ([BOUNDARY], "resolved at build time"),
    "ReportsGraphRunsEager": (["test_launch_overhead.py"], "quarter of an eager step"),
    "ReportsWrongMode": (["test_launch_overhead.py"], "graph_launches_seen"),
    "UniformByCount": (["test_replay_equivalence.py::test_graph_equals_eager_for_verify_batches_of_q_tokens"],
                       "own dispatch()"),
    "StandInGraphs": (["test_launch_overhead.py"], "graph_launches_seen: 0"),
    "DoubleReplay": (["test_launch_overhead.py"], "graph_launches_seen: 2"),
    "WindowFrozenAtCapture": ([BOUNDARY], "differ"),
    "AlwaysLiar": (["test_backend_support.py::test_declared_level_holds_in_full_graphs"], "declares ALWAYS"),
    "RotaryOffByOne": (["test_numerical_anchor.py"], "transformers"),
    "CaptureWritesLiveKV": (["test_capture_side_effects.py::test_capture_changes_no_kv_slot"], "capture wrote"),
    "CaptureConsumesKVCapacity": (["test_capture_side_effects.py::test_the_configured_kv_capacity_is_there_after_capture"],
                                  "do not fit"),
    "PiecewiseIsOneGraph": (["test_capture_accounting.py::test_graphs_match_the_policy_keys"], "pieces"),
    "GraphMemoryInKiB": (["test_capture_accounting.py::test_graph_memory_is_reported_and_agrees_with_what_the_harness_measured"],
                         "within a factor of 4"),
    "SecondCaptureTypeError": ([AFTER_PHASE], "TypeError"),
    "RecapturesSilently": ([AFTER_PHASE], "was accepted"),
    "CapturesInService": ([AFTER_PHASE], "captured while serving"),
    "RecordsPerContext": ([AFTER_PHASE], "third pass"),
    "LazyChecksTheFirstReplayOnly": ([MOVED], "read the memory it was captured with"),
    "StalePaddingIdsDeclaredRandom": ([PADDED_INPUTS], "declares random_padding_ids, but"),
    "RandomPaddingIdsUndeclared": ([PADDED_INPUTS], "stale rows from an earlier step"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_engines.MUTANTS} == set(MUST_CATCH)


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_execution_suites_catch_the_mutant(pytester, record_property, mutant):
    assert_mutant_caught(pytester, record_property, broken_engines, mutant, MUST_CATCH)


def test_random_padding_ids_declared_pass(pytester):
    """The declaration is fair: an engine that draws padded ids anew every step and says so passes."""
    from tests.catching import run_suites

    name = broken_engines.RandomPaddingIdsDeclared.name
    report = run_suites(pytester, "tests.broken_engines:RandomPaddingIdsDeclared", [PADDED_INPUTS.format(name=name)])
    assert [t["outcome"] for t in report["tests"]] == ["passed"], [t.get("reason") for t in report["tests"]]


def test_lazy_capture_declared_passes(pytester):
    """The declaration is fair too: an engine that records each graph the first time a step needs
    it and says so passes every check that reads the declaration (and one that records again for
    each new context, declaring the same, does not: MUST_CATCH)."""
    from tests.catching import run_suites

    name = broken_engines.LazyCaptureDeclared.name
    keys = f"test_capture_accounting.py::test_graphs_match_the_policy_keys[{name}-FULL-q1]"
    targets = [AFTER_PHASE, keys, MOVED.format(name=name),
               "test_capture_side_effects.py::test_lazy_capture_in_service_leaves_live_requests_intact",
               f"test_launch_overhead.py::test_a_graph_step_submits_far_less_than_eager[{name}-PIECEWISE-3]"]
    report = run_suites(pytester, "tests.broken_engines:LazyCaptureDeclared", targets)
    outcomes = {t["nodeid"].split("/")[-1]: (t["outcome"], t.get("reason", "")) for t in report["tests"]}
    assert len(outcomes) == len(targets), outcomes
    skipped = outcomes.pop(keys)
    assert skipped[0] == "skipped" and "declares lazy_capture" in skipped[1], skipped
    assert {outcome for outcome, _ in outcomes.values()} == {"passed"}, outcomes
