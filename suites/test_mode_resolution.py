"""Mode resolution (SPEC 5): what a requested mode becomes for the weakest attention backend.

Expected cells are the SPEC table, as data in `harness.oracle`; every downgrade must warn.
"""
import itertools

import pytest

from harness import oracle
from harness.compare import expect, expect_equal, expect_error
from harness.protocol import CONFIG_MODES, SUPPORT_LEVELS, ResolveRequest

INVARIANT = "mode resolution"
SHORT = {"UNIFORM_SINGLE_TOKEN_DECODE": "USTD"}


def _cells(**variant):
    for mode, support in itertools.product(CONFIG_MODES, oracle.SUPPORTS):
        expected = oracle.expected_resolution(mode, support, **variant)
        if expected.error or expected.resolved is not None:
            yield pytest.param(ResolveRequest(mode, support, **variant), expected,
                               id=f"{mode}-{SHORT.get(support, support)}")


def _check(runtime, request, expected, record_property, variant):
    record = {"variant": variant, "requested": request.mode, "support": request.support}
    if expected.error:
        record_property("resolution", {**record, "resolved": "error"})
        expect_error(lambda: runtime.resolve_mode(request), invariant=INVARIANT, runtime=runtime, case=request,
                     what="this request cannot be honoured and must be rejected", mentions=("PIECEWISE",))
        return
    result = runtime.resolve_mode(request)
    record_property("resolution", {**record, "resolved": result.resolved})
    expect_equal(result.resolved, expected.resolved, invariant=INVARIANT, runtime=runtime, case=request,
                 what="resolved mode")
    if result.resolved != request.mode:
        expect(bool(result.warnings), invariant=INVARIANT, runtime=runtime, case=request,
               what=f"the downgrade {request.mode} -> {result.resolved} must warn", warnings=result.warnings)


@pytest.mark.requires("mode_resolution", "vllm_policy")
@pytest.mark.parametrize("request_,expected", list(_cells()))
def test_default_table(runtime, record_property, request_, expected):
    _check(runtime, request_, expected, record_property, "default")


@pytest.mark.requires("mode_resolution", "vllm_policy")
@pytest.mark.parametrize("request_,expected", list(_cells(attention_in_splitting_ops=False)))
def test_without_attention_in_splitting_ops(runtime, record_property, request_, expected):
    _check(runtime, request_, expected, record_property, "no attention in splitting_ops")


@pytest.mark.requires("mode_resolution", "vllm_policy")
@pytest.mark.parametrize("request_,expected", list(_cells(splitting_ops_empty=True)))
def test_with_empty_splitting_ops(runtime, record_property, request_, expected):
    _check(runtime, request_, expected, record_property, "empty splitting_ops")


@pytest.mark.requires("mode_resolution", "vllm_policy", "speculative")
@pytest.mark.parametrize("request_,expected", [
    *_cells(num_speculative_tokens=1),
    *_cells(num_speculative_tokens=3),
    *_cells(num_speculative_tokens=2, attention_in_splitting_ops=False),
])
def test_speculative_decoding(runtime, record_property, request_, expected):
    variant = f"q={1 + request_.num_speculative_tokens}" + ("" if request_.attention_in_splitting_ops else ", no piecewise")
    _check(runtime, request_, expected, record_property, variant)


VARIANTS = [dict(num_speculative_tokens=k, attention_in_splitting_ops=a, splitting_ops_empty=e)
            for k, a, e in itertools.product((0, 1, 3), (True, False), (False, True))]


@pytest.mark.requires("mode_resolution")
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={int(x)}" for k, x in v.items()))
def test_every_downgrade_warns_and_lands_on_a_config_mode(runtime, variant):
    for mode, support in itertools.product(CONFIG_MODES, SUPPORT_LEVELS):
        request = ResolveRequest(mode, support, **variant)
        try:
            result = runtime.resolve_mode(request)
        except ValueError as exc:
            expect(bool(str(exc).strip()), invariant=INVARIANT, runtime=runtime, case=request,
                   what="a rejection must say why")
            continue
        expect(result.resolved in CONFIG_MODES, invariant=INVARIANT, runtime=runtime, case=request,
               what="the resolved mode must be a config mode", result=result)
        expect(result.requested == mode, invariant=INVARIANT, runtime=runtime, case=request,
               what="the result must echo the requested mode", result=result)
        if result.resolved != mode:
            expect(bool(result.warnings), invariant=INVARIANT, runtime=runtime, case=request,
                   what=f"silent downgrade {mode} -> {result.resolved}: every downgrade must warn", result=result)
        if support == "NEVER":
            expect(result.resolved in ("NONE", "PIECEWISE"), invariant=INVARIANT, runtime=runtime, case=request,
                   what="attention that cannot be captured leaves no FULL graphs", result=result)


@pytest.mark.requires("mode_resolution")
@pytest.mark.parametrize("support", SUPPORT_LEVELS)
def test_none_and_piecewise_never_change_with_piecewise_available(runtime, support):
    for mode in ("NONE", "PIECEWISE"):
        request = ResolveRequest(mode, support)
        expect_equal(runtime.resolve_mode(request).resolved, mode, invariant=INVARIANT, runtime=runtime,
                     case=request, what="modes without FULL graphs do not depend on attention support")
