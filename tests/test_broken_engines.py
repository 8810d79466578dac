"""The execution suites catch every deliberately broken engine (tests/broken_engines.py).

Each mutant runs against the suites it must fail, in a pytest session of its own; the
reference passing every suite is checked by CI's run of `suites/` itself. The catch table is
printed at the end of the run.
"""
import pytest

from tests import broken_engines
from tests.test_broken_runtimes import failed_suites, run_suites

MUST_CATCH = {
    "SlotWraps": {"test_padding_isolation.py"},
    "StaleBlockTables": {"test_replay_equivalence.py"},
    "NewInputTensors": {"test_replay_equivalence.py", "test_static_addresses.py"},
    "PadsBelowBatch": {"test_replay_equivalence.py", "test_padding_isolation.py"},
    "LeakyReduction": {"test_padding_isolation.py"},
    "SilentDowngrade": {"test_backend_support.py"},
    "ReportsGraphRunsEager": {"test_launch_overhead.py"},
    "ReportsWrongMode": {"test_launch_overhead.py"},
    "OutputsOverwritten": {"test_static_addresses.py"},
    "WindowFrozenAtCapture": {"test_replay_equivalence.py"},
    "AlwaysLiar": {"test_backend_support.py"},
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_engines.MUTANTS} == set(MUST_CATCH)


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_execution_suites_catch_the_mutant(pytester, record_property, mutant):
    report = run_suites(pytester, f"tests.broken_engines:{mutant}", sorted(MUST_CATCH[mutant]))
    caught = failed_suites(report)
    record_property("caught_by", sorted(caught))
    missing = MUST_CATCH[mutant] - caught
    assert not missing, f"{mutant} ({getattr(broken_engines, mutant).__doc__.strip()}) escaped {sorted(missing)}"
