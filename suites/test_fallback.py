"""Fallback (docs/spec.md section 7, invariant 5): above the largest capture size a step runs
eager and unpadded and is still right; near the largest size a graph step runs at one of the
runtime's own sizes that holds the batch (under `vllm_rules` the smallest, so at the largest
nothing is padded); a mode the attention backends cannot honour resolves (or is rejected) as it
should, and what then runs is right.

Expected values: the runtime's own sizes and dispatch (under `vllm_rules` also the spec), where
the mode resolves to (the spec, or the runtime's own resolve_mode()), and an eager step of the
same runtime at the same shape.
"""
import warnings

import pytest

from harness.expectations import expected
from harness.scenarios.batches import describe_batch, mixed_requests, prefill
from harness.vocabulary import EAGER, MIXED_GRAPH_MODES, OWN_POLICY, SPEC, padded

INVARIANT = "fallback"
pytestmark = pytest.mark.requires("execution")


@pytest.mark.requires("capture_sizes")
@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_at_and_around_the_max_capture_size(check, engines, mode):
    _around_the_max(check, engines, engines.for_mode(mode))


@pytest.mark.requires("capture_sizes")
def test_at_and_around_the_max_of_a_larger_grid(check, engines):
    """The same on the suites' larger engine, whose maximum is off the steps of its grid."""
    _around_the_max(check, engines, engines.larger())


def _around_the_max(check, engines, engine):
    runtime = engines.runtime
    sizes = runtime.capture_sizes(engine.policy)
    if not sizes:
        check.skip(f"its policy has no capture sizes under {engine.policy.mode}")
    largest = sizes[-1]
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    for tokens in (largest - 1, largest, largest + 1, largest + 7):
        if tokens - len(seqs) < 1 or tokens > engine.policy.max_num_batched_tokens:
            continue  # the joining prompt needs a token; no scheduler sends more than the token budget
        ids = [engines.new_id()]
        requests = mixed_requests(seqs, ids, [tokens - len(seqs)])
        out = engine.step(requests)  # the mode and size are checked against dispatch() on every step
        case = f"{describe_batch(requests)}; max capture size {largest}"
        if tokens > largest:  # no graph is that large, whatever the grid
            check.equal((out.runtime_mode, out.num_padded_tokens), ("NONE", tokens), source=OWN_POLICY, case=case,
                        what="above the largest size: eager and unpadded")
        elif out.runtime_mode != "NONE" and runtime.capabilities.has("vllm_rules"):
            check.equal(out.num_padded_tokens, padded(sizes, tokens), source=SPEC, case=case,
                        what="a mixed batch pads to the smallest capture size that holds it (at the largest, nothing)")
        elif out.runtime_mode != "NONE":  # mixed batches may pad by their own buckets (SGLang's prefill does)
            check.that(out.num_padded_tokens in sizes and out.num_padded_tokens >= tokens, source=OWN_POLICY,
                       case=case, padded=out.num_padded_tokens, capture_sizes_near_the_top=sizes[-4:],
                       what="a graph step runs at one of its own capture sizes, never smaller than the batch")
        check.same_bits(out.logits, engine.eager_step(requests, out.num_padded_tokens).logits, source=EAGER,
                        case=case, what=f"{out.runtime_mode} step at {out.num_padded_tokens} differs from eager")
        engine.release(ids[0])


@pytest.mark.parametrize("requested", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_modes_the_backend_cannot_honour_resolve_and_then_run_right(check, engines, requested, attention_backend):
    name, level = attention_backend
    want = expected.resolution(engines.runtime, requested, (name,), 0)
    case = f"mode {requested} with backend {name} ({level})"
    if want.value == "error":
        check.rejects(lambda: engines.get(mode=requested, attention=(name,), fresh=True), source=want.source,
                      case=case, what="building an engine for a mode its attention cannot honour must be rejected")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = engines.get(mode=requested, attention=(name,))
    if want.value is not None:
        check.equal(engine.resolution.resolved, want.value, what="resolved mode", source=want.source, case=case)
    seqs = prefill(engine, [engines.new_id() for _ in range(3)], [4, 2, 6])
    joined = engines.new_id()
    for requests in (mixed_requests(seqs, [], []), mixed_requests(seqs[:2], [joined], [3])):
        out = engine.step(requests)
        check.same_bits(out.logits, engine.eager_step(requests, out.num_padded_tokens).logits, source=EAGER,
                        case=f"{case}; {describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}",
                        what="after resolution the step differs from eager")
