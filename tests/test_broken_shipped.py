"""The suites catch every engine rebuilt from a bug shipped in 2025-26 (tests/broken_shipped.py):
padded request rows, a full KV cache, and the moved-input test's causes told apart. Each passed
every suite of main before (reports/issue53/slip_past_main.txt). The catch table (mutant -> suites
that caught it) is printed at the end of the run.
"""
import re

import pytest

from tests import broken_shipped
from tests.catching import assert_mutant_caught, failure_text, run_suites

ROWS = "test_padded_request_rows.py::test_request_rows_are_right_and_padded_rows_neutral[{name}-FULL]"
STAGED = "test_padded_request_rows.py::test_unpadded_and_eager_steps_stage_right_rows[{name}-NONE]"
FULL_CACHE = "test_full_kv_cache.py::test_padded_graph_steps_on_a_full_cache[{name}-FULL]"
MOVED = "test_static_addresses.py::test_a_moved_input_fails_loudly_or_is_not_read[{name}-uniform]"

# mutant -> (tests to run, words the failure must contain)
MUST_CATCH = {
    "StaleRequestRows": ([ROWS], "declared padding_block"),
    "StaleRequestLengths": ([ROWS], "stale rows from an earlier step"),
    "SeqLensBeforeTheStep": ([STAGED], "sequence lengths (context after the step)"),
    "QueryStartsCountTheContext": ([ROWS], "the real rows' query start offsets"),
    "QueryStartsPaddedWithMinusOne": ([ROWS], "non-decreasing"),
    "LazyPaddingDummy": ([FULL_CACHE], "own dispatch()"),
    "PadWritesABorrowedBlock": ([FULL_CACHE], "wrote slots its real tokens do not own"),
    "DummyFreesABorrowedBlock": ([FULL_CACHE], "fit again after padded steps"),
    "RefusesWithAnyError": ([FULL_CACHE], "refused with another error"),
    "LazyKeyMissesTheContext": ([MOVED], "not the move of"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_shipped.MUTANTS} == set(MUST_CATCH)


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_suites_catch_the_shipped_bug(pytester, record_property, mutant):
    assert_mutant_caught(pytester, record_property, broken_shipped, mutant, MUST_CATCH)


def test_a_wrong_step_is_not_blamed_on_a_moved_input(pytester):
    """The moved-input test names the cause it tested: a lazily recorded graph keyed without the
    context is wrong with no buffer moved, and the failure says so instead of blaming the move."""
    wrong = broken_shipped.LazyKeyMissesTheContext
    text = failure_text(run_suites(pytester, f"tests.broken_shipped:{wrong.__name__}", [MOVED.format(name=wrong.name)]))
    assert "whose buffers the harness never moved" in text and "not the move of" in text, text[-2000:]
    assert "the step neither failed nor computed the right answer" not in text, text[-2000:]


def test_a_graph_that_reads_the_old_memory_is_blamed_on_the_move(pytester):
    """The other cause: right without the move, wrong after it (the graph read what it was captured with)."""
    from tests import broken_engines

    moved = broken_engines.LazyChecksTheFirstReplayOnly
    text = failure_text(run_suites(pytester, "tests.broken_engines:LazyChecksTheFirstReplayOnly",
                                   [MOVED.format(name=moved.name)]))
    assert "the step neither failed nor computed the right answer" in text and "not the move of" not in text, text[-2000:]


def test_a_cache_smaller_than_kv_tokens_is_caught_when_filled(pytester):
    """The fill holds the engine to the kv_tokens it was built with: capture that keeps blocks for
    itself (tests/broken_engines.py) leaves fewer, and the full-cache suite says how many."""
    from tests import broken_engines

    name = broken_engines.CaptureConsumesKVCapacity.name
    text = failure_text(run_suites(pytester, "tests.broken_engines:CaptureConsumesKVCapacity",
                                   [FULL_CACHE.format(name=name)]))
    assert re.search(r"refused a block with \d+ tokens held, fewer than the \d+ it was built to hold", text), \
        text[-2000:]
