"""The bucket engine (examples/bucket_engine) passes every suite it declares; each of its broken
variants (tests/broken_example_engines.py) is caught by the suite named for it, by the check
that should catch it.

Each case is a pytest session over the suite files it needs, in this process, read back from
the harness's own JSON report. The catch table is printed at the end of the run.
"""
from pathlib import Path

import pytest

from tests import broken_example_engines, broken_example_models, catching

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"


def eager_anchor(mutant) -> str:
    """The anchor's eager generation alone: a model read wrong is wrong on every path, and one
    session of one test is what the catch costs."""
    return f"test_numerical_anchor.py::test_every_step_matches_transformers[{mutant.name}-NONE]"


# broken variant -> (the test built to catch its class of bug, as file::test, and words from the failure of the
# check that does); the catch table shows the suite that caught it.
MUST_CATCH = {
    "BucketOffByThree": ("test_replay_equivalence.py::test_graph_equals_eager_for_verify_batches_of_q_tokens",
                         "own dispatch()"),
    "ReportsDispatchedSize": ("test_padding_isolation.py::test_padded_inputs_are_valid_and_do_not_remember_earlier_steps",
                              "padded rows"),
    "PaddingSlotZero": ("test_padding_isolation.py::test_padded_rows_write_no_kv_slot", "wrote KV-cache slots"),
    "StalePaddedRows": ("test_padding_isolation.py::test_padded_inputs_are_valid_and_do_not_remember_earlier_steps",
                        "padding slot"),
    "GraphKeepsRowTable": ("test_replay_equivalence.py::test_graph_equals_eager_at_every_bucket_boundary",
                           "graph step vs eager"),
    "HostSyncInForward": ("test_capture_accounting.py::test_nothing_is_captured_after_the_capture_phase", "CaptureError"),
    "OutputIsAGraphBuffer": ("test_static_addresses.py::test_held_output_lives_as_declared",
                             "outputs_alias_graph_buffers=False"),
    "NoAddressCheck": ("test_static_addresses.py::test_a_moved_input_fails_loudly_or_is_not_read",
                       "the graph read the memory it was captured with"),
    "CaptureWritesLiveSlots": ("test_capture_side_effects.py::test_capture_changes_no_kv_slot",
                               "capture wrote KV-cache slots"),
    "InterleavedRope": (eager_anchor(broken_example_engines.InterleavedRope), "transformers' forward"),
    "SilentDowngrade": ("test_mode_resolution.py", "silent downgrade"),
    "DeclaresFewerSizes": ("test_fallback.py::test_at_and_around_the_max_capture_size", "one of its own capture sizes"),
    "PaddingWritesAFreeSlot": ("test_padding_isolation.py::test_padded_rows_write_no_kv_slot",
                               "padded rows wrote KV-cache slots"),
    # Bugs of a grid past its powers of two, of a maximum off them, of one-token prompts joining a decode
    # batch, and of graphs captured out of order into one pool: each needs the suites' larger engine,
    # their one-token joins, or the emulator's memory pool.
    "PowerOfTwoLookup": ("test_replay_equivalence.py::test_graph_equals_eager_at_the_top_of_a_larger_grid",
                         "own dispatch()"),
    "GraphsKeyedByExponent": ("test_capture_accounting.py::test_a_larger_engines_graphs_match_the_policy_keys",
                              "graphs the harness saw captured"),
    "DecodeGraphSkipsNewRows": ("test_replay_equivalence.py::test_generation_matches_eager_step_by_step",
                                "driven through the same steps"),
    "SmallestFirstUncopiedTop": ("test_static_addresses.py::test_held_outputs_live_across_steps_of_other_sizes",
                                 "after a step of another size"),
    # Wrong only at the end of the context, which no step reached before.
    "LastDecodeRefused": ("test_context_end.py::test_steps_that_reach_the_last_position_equal_eager", "was refused"),
    "NoLengthCheck": ("test_context_end.py::test_a_step_past_max_model_len_is_refused_clearly_or_runs_right",
                      "crashed instead of refusing"),
    "RopeTableOneShort": ("test_context_end.py::test_steps_that_reach_the_last_position_equal_eager", "IndexError"),
    "LastSlotNotAttended": ("test_numerical_anchor.py::test_steps_at_the_end_of_the_context_match_transformers"
                            "[last-slot-not-attended-NONE]", "transformers' forward"),
    # A config field ignored, its default used: on a checkpoint of defaults each computes transformers' numbers.
    **{mutant.__name__: (eager_anchor(mutant), "transformers' forward") for mutant in broken_example_models.MUTANTS},
}
# Where each variant lives, for the runtime spec of its session.
MODULE = {**{m.__name__: "tests.broken_example_engines" for m in broken_example_engines.MUTANTS},
          **{m.__name__: "tests.broken_example_models" for m in broken_example_models.MUTANTS}}
# What depends on the shape of a runtime's grid.
GRID_SUITES = ["test_capture_accounting.py", "test_capture_sizes.py", "test_dispatch.py", "test_fallback.py",
               "test_padding.py", "test_replay_equivalence.py"]


def run_suites(pytester, runtime: str, suites: list[str]) -> dict:
    """One session over the suite files; --tb=native, since pytest's own tracebacks parse every
    torch source file an error passed through (a second a failure)."""
    module = MODULE.get(runtime, "tests.broken_example_engines")
    return catching.run_suites(pytester, f"{module}:{runtime}", suites, "--tb=native")


def failures(report) -> list[dict]:
    return [t for t in report["tests"] if t["outcome"] in ("failed", "error")]


def test_every_variant_has_an_expectation():
    assert set(MODULE) == set(MUST_CATCH)


def test_the_bucket_engine_passes_every_suite(bucket_engine_in_the_checkout):
    """Its entry point's session, which tests/test_packaging.py compares with the wheel's."""
    run = bucket_engine_in_the_checkout
    report = run["report"]
    assert report is not None and report["complete"], run["output"]
    assert [t["nodeid"] for t in failures(report)] == []
    passed = {Path(t["nodeid"].split("::")[0]).name for t in report["tests"] if t["outcome"] == "passed"}
    # Every suite that can run on the CPU without vLLM's policy or data parallelism runs something.
    assert passed >= {"test_backend_support.py", "test_capture_accounting.py", "test_capture_side_effects.py",
                      "test_capture_sizes.py", "test_dispatch.py", "test_fallback.py", "test_launch_overhead.py",
                      "test_mode_resolution.py", "test_numerical_anchor.py", "test_padding.py",
                      "test_padding_isolation.py", "test_replay_equivalence.py", "test_static_addresses.py"}


def test_a_grid_with_neighbouring_sizes_at_the_top_is_judged_by_its_own_rule(pytester):
    """An honest grid ending in ..., 15, 16: a batch of 15 tokens pads to 15, and no suite may
    expect 16 (vLLM's grids have gaps at the top; not every grid does)."""
    report = run_suites(pytester, "DenseTopBuckets", GRID_SUITES)
    assert report["complete"] and [t["nodeid"] for t in failures(report)] == []
    ran = {t["nodeid"].split("::")[1] for t in report["tests"] if t["outcome"] == "passed"}
    assert "test_at_and_around_the_max_capture_size[dense-top-buckets-FULL]" in ran


def test_a_grid_that_reaches_the_token_budget_is_not_sent_more(pytester):
    """Sizes up to the budget the engine was built with: no suite sends a batch above it."""
    report = run_suites(pytester, "GridToTheBudget", ["test_fallback.py", "test_replay_equivalence.py"])
    assert report["complete"] and [t["nodeid"] for t in failures(report)] == []


def test_a_mode_rejected_at_build_is_taken_on_the_runtimes_word_where_nothing_can_check_it(pytester):
    report = run_suites(pytester, "RejectsFullDeclaringNoBackends", ["test_replay_equivalence.py", "test_fallback.py"])
    assert report["complete"] and [t["nodeid"] for t in failures(report)] == []
    skipped = [t for t in report["tests"] if t["outcome"] == "skipped" and "rejects FULL at build" in t["reason"]]
    assert skipped and all("-FULL]" in t["nodeid"] for t in skipped)


def test_outputs_that_alias_graph_buffers_as_declared_are_copied_by_the_harness(pytester):
    """A runtime that declares outputs_alias_graph_buffers may hand out views the next step
    overwrites; the harness, its caller, copies what it keeps."""
    report = run_suites(pytester, "AliasedOutputs", ["test_replay_equivalence.py", "test_static_addresses.py"])
    assert report["complete"] and [t["nodeid"] for t in failures(report)] == []
    ran = {t["nodeid"].split("::")[1] for t in report["tests"] if t["outcome"] == "passed"}
    assert "test_generation_matches_eager_step_by_step[aliased-outputs-FULL]" in ran


@pytest.mark.parametrize("variant", sorted(MUST_CATCH))
def test_the_suites_catch_the_broken_variant(pytester, record_property, variant):
    suite, words = MUST_CATCH[variant]
    failed = failures(run_suites(pytester, variant, [suite]))
    record_property("caught_by", sorted({Path(t["nodeid"].split("::")[0]).name for t in failed}))
    suite = suite.split("::")[0]
    doc = (getattr(broken_example_engines, variant, None) or getattr(broken_example_models, variant)).__doc__.strip()
    assert failed, f"{variant} ({doc}) escaped {suite}"
    assert any(words in t.get("reason", "") for t in failed), \
        f"{variant} failed {suite}, but no failure says {words!r}: {failed[0].get('reason', '')[:2000]}"
