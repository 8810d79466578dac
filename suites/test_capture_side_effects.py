"""Capture leaves no trace (docs/spec.md section 6): capturing graphs changes no KV-cache slot,
takes none of the KV capacity the engine was built with, and an engine that captures lazily, in
service, leaves the live requests' KV and outputs intact.

Warm-up and capture run the model on dummy batches; an engine whose dummy rows write real slots,
or whose warm-up consumes cache positions (transformers' StaticCache write offset, for one),
corrupts or loses what it holds. Expected values: the KV snapshot before, the configured
`kv_tokens`, and an eager step of the same runtime.
"""
import pytest

from harness.expectations import kv
from harness.scenarios.batches import decode_requests, describe_batch, mixed_requests, prefill
from harness.protocol import Request
from harness.reliability.safe import describe_exception
from harness.vocabulary import EAGER, OBSERVED

INVARIANT = "capture side effects"
pytestmark = pytest.mark.requires("execution")


@pytest.mark.requires("kv_inspection")
def test_capture_changes_no_kv_slot(check, engines):
    engine = engines.for_mode("FULL_AND_PIECEWISE", fresh=True, capture=False)
    seqs = prefill(engine, [engines.new_id() for _ in range(3)], [5, 9, 3])
    before = engine.kv_snapshot()
    engine.capture()
    after = engine.kv_snapshot()
    changed = kv.changed_slots(before, after)
    check.that(not changed, what="capture wrote KV-cache slots (live requests' KV included)", source=OBSERVED,
               changed_slots=changed[:10], live=[(s.request_id, s.context_len) for s in seqs])


def test_the_configured_kv_capacity_is_there_after_capture(check, engines):
    """Requests that together need all of kv_tokens fit after capture."""
    engine = engines.for_mode("FULL_AND_PIECEWISE", fresh=True)
    capacity, longest = engines.kv_tokens, engines.max_model_len
    chunk = engines.defaults["max_num_batched_tokens"]
    filled, request_id = 0, None
    while filled < capacity:
        request_id, context = engines.new_id(), 0
        length = min(longest, capacity - filled)
        while context < length:  # prefill in chunks that fit one step
            n = min(chunk, length - context)
            request = Request(request_id, tuple(1 + (context + j) % 200 for j in range(n)), context)
            error = None
            try:
                engine.step([request])
            except Exception as exc:  # the cache is full: a wrong answer, reported with what was held
                error = describe_exception(exc)
            check.that(error is None, what=f"after capture, requests needing {capacity} KV tokens (kv_tokens) "
                       "do not fit", source="the configured kv_tokens", held_tokens=filled + context, error=error)
            context += n
        filled += length


def test_lazy_capture_in_service_leaves_live_requests_intact(check, engines):
    """Batches of every size after capture: whatever an engine records or replays, live requests'
    KV is changed only where their own tokens wrote, and each step equals eager."""
    engine = engines.for_mode("FULL_AND_PIECEWISE", fresh=True)
    seqs = prefill(engine, [engines.new_id() for _ in range(6)], [3, 5, 2, 9, 4, 7])
    inspect = engines.runtime.capabilities.kv_inspection
    for n in range(1, len(seqs) + 1):
        for requests, joined in ((decode_requests(seqs[:n]), None),
                                 (mixed_requests(seqs[: n - 1], [engines.new_id()], [2]), True)):
            before = engine.kv_snapshot() if inspect else None
            out = engine.step(requests)
            case = f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}"
            if inspect:
                stray = kv.stray_slots(engine, requests, before, engine.kv_snapshot())
                check.that(not stray, what="a step wrote KV slots its real tokens did not own", source=OBSERVED,
                           case=case, stray_slots=stray[:10], graphs_captured_in_service=engine.captures_in_service)
            check.same_bits(out.logits, engine.eager_step(requests, out.num_padded_tokens).logits, source=EAGER,
                            case=case, what="a step differs from eager")
            if joined:
                engine.release(requests[-1].request_id)
