"""Mode resolution (docs/spec.md section 5): what a requested mode becomes for the weakest
attention backend.

- vLLM conformance (`vllm_rules`): the spec's table cell by cell, its variants without
  piecewise graphs, without piecewise capture (vLLM 0.33), with empty splitting ops and with q > 1; rejections that suggest what works;
  modes without FULL graphs do not depend on attention support.
- Any runtime with `mode_resolution`: every answer is a config mode, echoes the request, keeps
  no FULL graphs over attention that cannot be captured, and no downgrade is silent. Runtimes
  without vLLM's compilation options are asked only the default variant.
"""
import itertools

import pytest

from harness.protocol import ResolveRequest
from harness.reports.records import ResolutionCell
from harness.vocabulary import CONFIG_MODES, CONTRACT, OWN_POLICY, SHORT_NAMES, SPEC, SPEC_RELEASE, SUPPORT_LEVELS, expected_resolution

INVARIANT = "mode resolution"


def _cells(**variant):
    for mode, support in itertools.product(CONFIG_MODES, SUPPORT_LEVELS):
        expected = expected_resolution(mode, support, **variant)
        if expected.error or expected.resolved is not None:
            yield pytest.param(ResolveRequest(mode, support, **variant), expected,
                               id=f"{mode}-{SHORT_NAMES.get(support, support)}")


def _check(check, runtime, record, request, expected, variant):
    # The cell of the runtime's declared release (docs/spec.md section 11), where releases differ.
    expected = expected_resolution(request.mode, request.support, request.num_speculative_tokens,
                                   request.attention_in_splitting_ops, request.splitting_ops_empty,
                                   vllm_version=runtime.capabilities.vllm_release or SPEC_RELEASE,
                                   piecewise_capture=request.piecewise_capture)
    cell = dict(variant=variant, requested=request.mode, support=request.support)
    if expected.error:
        record(ResolutionCell(**cell, resolved="error"))
        check.rejects(lambda: runtime.resolve_mode(request), what="this request cannot be honoured and must be rejected",
                      source=SPEC, case=request, mentions=("PIECEWISE",))
        return
    result = runtime.resolve_mode(request)
    record(ResolutionCell(**cell, resolved=result.resolved))
    check.equal(result.resolved, expected.resolved, what="resolved mode", source=SPEC, case=request)
    if result.resolved != request.mode:
        check.that(bool(result.warnings), what=f"the downgrade {request.mode} -> {result.resolved} must warn",
                   source=SPEC, case=request, warnings=result.warnings)


@pytest.mark.requires("mode_resolution", "vllm_rules")
@pytest.mark.parametrize("request_,expected", list(_cells()))
def test_default_table(check, runtime, record, request_, expected):
    _check(check, runtime, record, request_, expected, "default")


@pytest.mark.requires("mode_resolution", "vllm_rules")
@pytest.mark.parametrize("request_,expected", list(_cells(attention_in_splitting_ops=False)))
def test_without_attention_in_splitting_ops(check, runtime, record, request_, expected):
    _check(check, runtime, record, request_, expected, "no attention in splitting_ops")


@pytest.mark.requires("mode_resolution", "vllm_rules")
@pytest.mark.parametrize("request_,expected", list(_cells(splitting_ops_empty=True)))
def test_with_empty_splitting_ops(check, runtime, record, request_, expected):
    _check(check, runtime, record, request_, expected, "empty splitting_ops")


@pytest.mark.requires("mode_resolution", "vllm_rules")
@pytest.mark.vllm_release("0.33")
@pytest.mark.parametrize("request_,expected", list(_cells(piecewise_capture=False)))
def test_without_piecewise_capture(check, runtime, record, request_, expected):
    """Attention split, but the loaded model gives no piecewise graphs: vLLM 0.33 drops the pieces
    its backend downgrades led to (docs/spec.md 5.3); vLLM 0.25 has no such input."""
    _check(check, runtime, record, request_, expected, "no piecewise capture")


@pytest.mark.requires("mode_resolution", "vllm_rules", "speculative")
@pytest.mark.vllm_release("0.33")
@pytest.mark.parametrize("request_,expected", list(_cells(piecewise_capture=False, num_speculative_tokens=2)))
def test_speculative_decoding_without_piecewise_capture(check, runtime, record, request_, expected):
    _check(check, runtime, record, request_, expected, "q=3, no piecewise capture")


@pytest.mark.requires("mode_resolution", "vllm_rules", "speculative")
@pytest.mark.parametrize("request_,expected", [
    *_cells(num_speculative_tokens=1),
    *_cells(num_speculative_tokens=3),
    *_cells(num_speculative_tokens=2, attention_in_splitting_ops=False),
])
def test_speculative_decoding(check, runtime, record, request_, expected):
    variant = f"q={1 + request_.num_speculative_tokens}" + ("" if request_.attention_in_splitting_ops else ", no piecewise")
    _check(check, runtime, record, request_, expected, variant)


@pytest.mark.requires("mode_resolution", "vllm_rules")
@pytest.mark.parametrize("support", SUPPORT_LEVELS)
def test_none_and_piecewise_do_not_depend_on_attention_support(check, runtime, support):
    for mode in ("NONE", "PIECEWISE"):
        request = ResolveRequest(mode, support)
        check.equal(runtime.resolve_mode(request).resolved, mode, source=SPEC, case=request,
                    what="with piecewise graphs available, NONE stays NONE and PIECEWISE stays PIECEWISE")


VLLM_VARIANTS = [dict(num_speculative_tokens=k, attention_in_splitting_ops=a, splitting_ops_empty=e)
                 for k, a, e in itertools.product((0, 1, 3), (True, False), (False, True))]
PLAIN_VARIANTS = [dict(num_speculative_tokens=k) for k in (0, 1)]


def _variants(runtime):
    if runtime.capabilities.has("vllm_rules"):
        return VLLM_VARIANTS
    return PLAIN_VARIANTS if runtime.capabilities.speculative else PLAIN_VARIANTS[:1]


@pytest.mark.requires("mode_resolution")
def test_every_downgrade_warns_and_lands_on_a_config_mode(check, runtime):
    for variant in _variants(runtime):
        for mode, support in itertools.product(CONFIG_MODES, SUPPORT_LEVELS):
            request = ResolveRequest(mode, support, **variant)
            try:
                result = runtime.resolve_mode(request)
            except ValueError as exc:
                would_work = [w for w in (*CONFIG_MODES, *SUPPORT_LEVELS) if w != mode and w in str(exc)]
                check.that(bool(would_work), source=CONTRACT, case=request, error=str(exc)[:300],
                           what="a rejection must name what would work (another config mode or a support level)")
                continue
            check.that(result.requested == mode, what="the result must echo the requested mode", case=request,
                       source=OWN_POLICY, result=result)
            if result.resolved != mode:
                check.that(bool(result.warnings), what=f"silent downgrade {mode} -> {result.resolved}: every "
                           "downgrade must warn", source=CONTRACT, case=request, result=result)
            if support == "NEVER":
                check.that(result.resolved in ("NONE", "PIECEWISE"), source=CONTRACT, case=request, result=result,
                           what="attention that cannot be captured leaves no FULL graphs")
