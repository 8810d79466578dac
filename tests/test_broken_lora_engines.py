"""suites/test_lora.py catches every deliberately broken LoRA engine (tests/broken_lora_engines.py).

Each mutant runs, in a pytest session of its own, the tests that must catch it; the catch table
(mutant -> suites that caught it) is printed at the end of the run, as for tests/broken_engines.py.
"""
import pytest

from tests import broken_lora_engines
from tests.catching import assert_mutant_caught

LORA = "test_lora.py::"

# mutant -> (tests to run, words the failure must contain)
MUST_CATCH = {
    "LoraDtypesDeclaredNotHeld": ([LORA + "test_a_lora_build_outside_its_declared_dtypes_is_refused"],
                                  "which its declared lora_dtypes"),
    "GraphsWithoutAdapters": (
        [LORA + "test_graph_equals_eager_with_adapters_on_some_rows[{name}-FULL_DECODE_ONLY]"], "graph step vs eager"),
    "GraphSharedAcrossAdapterCounts": ([LORA + "test_a_graph_for_every_adapter_key"], "a graph per key"),
    "KeyIgnoresAdapterCount": (
        [LORA + "test_dispatch_follows_the_active_adapter_count[{name}-FULL_DECODE_ONLY]"], "num_active_loras"),
    "PaddedRowsRunAnAdapter": (
        [LORA + "test_padded_rows_carry_no_adapter[{name}-FULL_AND_PIECEWISE]"], "padded rows: 0"),
    "GraphSlotsMissTheLastAdapter": (
        [LORA + "test_graph_equals_eager_with_adapters_on_some_rows[{name}-FULL_AND_PIECEWISE]"], "graph step vs eager"),
    "AdapterOnTheWrongRequest": (
        [LORA + "test_the_adapter_changes_its_own_rows_alone[{name}-FULL_AND_PIECEWISE]"], "names no adapter: the step with adapters"),
}


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_lora_engines.MUTANTS} == set(MUST_CATCH)


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_the_lora_suite_catches_the_mutant(pytester, record_property, mutant):
    assert_mutant_caught(pytester, record_property, broken_lora_engines, mutant, MUST_CATCH)


def test_the_reference_passes_what_catches_them(pytester):
    """The checks are fair: the reference engine passes every test the mutants fail."""
    from tests.catching import run_suites

    targets = sorted({t.format(name="reference") for ts, _ in MUST_CATCH.values() for t in ts})
    report = run_suites(pytester, "reference", targets)
    # The reference declares no lora_dtypes: it runs adapters in any dtype, so that test is skipped.
    undeclared = "test_a_lora_build_outside_its_declared_dtypes_is_refused"
    assert [t["outcome"] for t in report["tests"]] == \
        ["skipped" if undeclared in t["nodeid"] else "passed" for t in report["tests"]], \
        [(t["nodeid"], t.get("reason")) for t in report["tests"]]
    assert any(undeclared in t["nodeid"] for t in report["tests"]) and len(report["tests"]) == len(targets)
