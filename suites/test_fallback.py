"""Fallback (SPEC 7, invariant 5): above the max capture size a step runs eager, unpadded, and is
still right; at the max nothing is padded; a mode the backends cannot support resolves or fails
as the table says, and what it then runs is right."""
import warnings

import pytest

from harness import oracle
from harness.compare import expect, expect_equal
from harness.equality import first_mismatch
from harness.execution import capture_sizes, describe_batch, mixed_requests, prefill

INVARIANT = "fallback"
pytestmark = pytest.mark.requires("execution")


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_at_and_around_the_max_capture_size(runtime, engines, mode):
    engine = engines.get(mode=mode)
    sizes = capture_sizes(runtime, engines.config(mode=engine.resolution.resolved).policy)
    if not sizes:
        pytest.skip(f"runtime {runtime.name!r} resolves {mode} to {engine.resolution.resolved}: no graphs")
    largest = sizes[-1]
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    mixed_graphs = engine.resolution.resolved not in ("NONE", "FULL_DECODE_ONLY")
    for tokens in (largest - 1, largest, largest + 1, largest + 7):
        if tokens - len(seqs) < 1:
            continue  # the joining prompt needs at least one token
        ids = [engines.new_id()]
        requests = mixed_requests(seqs, ids, [tokens - len(seqs)])
        out = engine.step(requests)
        case = f"{describe_batch(requests)}; max capture size {largest}"
        if tokens > largest:
            expect_equal((out.runtime_mode, out.padded_num_tokens), ("NONE", tokens), invariant=INVARIANT,
                         runtime=runtime, what="above the max: eager and unpadded", case=case)
        else:
            if mixed_graphs:  # FULL_DECODE_ONLY runs mixed batches eager by design
                expect_equal(out.padded_num_tokens, largest, invariant=INVARIANT, runtime=runtime, case=case,
                             what="at or just below the max the step pads to the max (and at the max pads nothing)")
                expect(out.runtime_mode != "NONE", invariant=INVARIANT, runtime=runtime, case=case,
                       what="a batch that fits the largest graph must not fall back to eager", ran=out.runtime_mode)
        mismatch = first_mismatch(out.logits, engine.eager_step(requests, out.padded_num_tokens).logits)
        expect(mismatch is None, invariant=INVARIANT, runtime=runtime, case=case,
               what=f"{out.runtime_mode} step at {out.padded_num_tokens} differs from eager", mismatch=mismatch)
        engine.release(ids[0])
    for s in seqs:
        engine.release(s.request_id)


def backends_by_level(runtime):
    return {level: name for name, level in runtime.capabilities.attention_backends}


@pytest.mark.requires("attention_backends")
@pytest.mark.parametrize("requested", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_unsupported_modes_resolve_or_fail_and_then_run_right(runtime, engines, requested):
    for level, backend in backends_by_level(runtime).items():
        expected = oracle.expected_resolution(requested, level)
        case = f"mode {requested} with backend {backend} ({level})"
        if expected.error:
            with pytest.raises(ValueError):
                engines.get(mode=requested, attention=(backend,), fresh=True)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = engines.get(mode=requested, attention=(backend,))
        expect_equal(engine.resolution.resolved, expected.resolved, invariant=INVARIANT, runtime=runtime,
                     what="resolved mode", case=case)
        seqs = prefill(engine, [engines.new_id() for _ in range(3)], [4, 2, 6])
        joined = engines.new_id()
        for requests in (mixed_requests(seqs, [], []), mixed_requests(seqs[:2], [joined], [3])):
            out = engine.step(requests)
            mismatch = first_mismatch(out.logits, engine.eager_step(requests, out.padded_num_tokens).logits)
            expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
                   case=f"{case}; {describe_batch(requests)}; {out.runtime_mode} at {out.padded_num_tokens}",
                   what="after resolution the step differs from eager", mismatch=mismatch)
        for request_id in [s.request_id for s in seqs] + [joined]:
            engine.release(request_id)
