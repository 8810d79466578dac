"""The suites catch every broken engine of tests/broken_lifetime_engines.py: memory freed under a
graph, drafts taken as accepted. Each runs, in a pytest session of its own, the tests that must catch
it (the catch table, as tests/test_broken_engines.py)."""
import pytest

from tests import broken_lifetime_engines
from tests.catching import assert_mutant_caught

BOUNDARY = "test_replay_equivalence.py::test_graph_equals_eager_at_every_bucket_boundary[{name}-FULL_AND_PIECEWISE]"

# mutant -> (tests to run, words the failure must contain)
MUST_CATCH = {
    "WorkspaceFreedUnderGraphs": ([BOUNDARY], "was freed after the capture"),
    # On every path: eager too, so the anchor is what tells.
    "AcceptsEveryDraft": (["test_numerical_anchor.py::test_steps_after_rejected_drafts_match_transformers[{name}-NONE]"],
                          "transformers"),
    "PersistentBatchAcceptsEveryDraft": (
        ["test_replay_equivalence.py::test_steps_after_rejected_drafts_equal_eager[{name}]"], "rejected drafts"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_lifetime_engines.MUTANTS} == set(MUST_CATCH)


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_suites_catch_the_mutant(pytester, record_property, mutant):
    assert_mutant_caught(pytester, record_property, broken_lifetime_engines, mutant, MUST_CATCH)
