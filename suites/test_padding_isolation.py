"""Padding isolation (SPEC 7, invariants 2 and 3): real rows do not depend on what padded rows
hold; padded rows write no KV-cache slot; a small batch after a large one runs on fresh
metadata, not on what the large one left in the static buffers."""
import pytest
import torch

from harness.compare import expect
from harness.equality import first_mismatch
from harness.execution import decode_requests, describe_batch, mixed_requests, prefill

INVARIANT = "padding isolation"
pytestmark = pytest.mark.requires("execution")
FILLS = ["zeros", "random", "nan", "inf"]
PADDED_COUNTS = [3, 5, 6, 7]  # none is a capture size of the default test grid [1, 2, 4, 8, 16]


@pytest.fixture(params=FILLS)
def padding_fill(request, runtime):
    if request.param not in runtime.capabilities.padding_fills:
        pytest.skip(f"runtime {runtime.name!r} cannot fill padding with {request.param!r} (padding_fills)")
    return request.param


def padded_batches(engines, seqs):
    """Padded uniform and mixed batches; with 7 requests live, one joining keeps max_num_seqs 8."""
    for n in PADDED_COUNTS:
        yield decode_requests(seqs[:n]), []
        ids = [engines.new_id()]
        yield mixed_requests(seqs[: n - 2], ids, [2]), ids


@pytest.mark.requires("padding_fills")
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_real_rows_ignore_what_padded_rows_hold(runtime, engines, mode, padding_fill):
    engine = engines.get(mode=mode)
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    for requests, started in padded_batches(engines, seqs):
        plain = engine.step(requests)
        filled = engine.step(requests, padding_fill=padding_fill)
        expect(filled.padded_num_tokens > filled.num_tokens, invariant=INVARIANT, runtime=runtime,
               what="the batch was meant to be padded", case=describe_batch(requests),
               padded=filled.padded_num_tokens)
        mismatch = first_mismatch(filled.logits, plain.logits)
        expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
               what=f"real rows changed when padded rows held {padding_fill!r}",
               case=f"{describe_batch(requests)}; {filled.runtime_mode} at {filled.padded_num_tokens}",
               mismatch=mismatch)
        for request_id in started:
            engine.release(request_id)
    for s in seqs:
        engine.release(s.request_id)


@pytest.mark.requires("kv_inspection")
@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_padded_rows_write_no_kv_slot(runtime, engines, mode):
    """Snapshot every slot, run padded steps, and allow changes only where real tokens wrote."""
    engine = engines.get(mode=mode, fresh=True, capture=mode != "NONE")
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    for requests, started in padded_batches(engines, seqs):
        before = engine.kv_snapshot()
        out = engine.step(requests)
        after = engine.kv_snapshot()
        written = {engine.slot_of(r.request_id, r.context_len + j) for r in requests for j in range(len(r.token_ids))}
        changed = set((before != after).flatten(1).any(dim=1).nonzero().flatten().tolist())
        # A NaN that stayed NaN is not a change.
        changed = {s for s in changed if not torch.equal(before[s].isnan(), after[s].isnan())
                   or not torch.equal(before[s].nan_to_num(), after[s].nan_to_num())}
        stray = sorted(changed - written)
        last = before.shape[0] - 1
        expect(not stray, invariant=INVARIANT, runtime=runtime,
               what="padded rows wrote KV-cache slots" + (" (including the last slot, where -1 wraps)"
                                                          if last in stray else ""),
               case=f"{describe_batch(requests)}; {out.runtime_mode} at {out.padded_num_tokens}",
               stray_slots=stray[:10], real_slots=sorted(written)[:10])
        for request_id in started:
            engine.release(request_id)


@pytest.mark.parametrize("mode", ["FULL", "FULL_AND_PIECEWISE", "PIECEWISE"])
def test_a_small_batch_after_a_large_one_sees_fresh_metadata(runtime, engines, mode):
    """Large then small: the small step must match a fresh eager engine that never saw the large one."""
    engine = engines.get(mode=mode, fresh=True)
    ids = [engines.new_id() for _ in range(8)]
    lengths = [9, 3, 5, 2, 7, 4, 6, 8]
    seqs = prefill(engine, ids, lengths)
    engine.step(decode_requests(seqs))  # large: all 8 at their contexts
    for s in seqs:
        s.context_len += 1
    small = decode_requests(seqs[:2])
    got = engine.step(small)
    same_shape = engine.eager_step(small, got.padded_num_tokens)
    mismatch = first_mismatch(got.logits, same_shape.logits)
    expect(mismatch is None, invariant=INVARIANT, runtime=runtime, what="small step after a large one vs eager",
           case=f"{describe_batch(small)}; {got.runtime_mode} at {got.padded_num_tokens}", mismatch=mismatch)
    # An engine that never ran the large batch: prefill each context whole, then the same small step.
    fresh = engines.get(mode="NONE", fresh=True, capture=False)
    fresh_seqs = prefill(fresh, ids[:2], [s.context_len for s in seqs[:2]])
    expected = fresh.step(decode_requests(fresh_seqs))
    scale = float(expected.logits.abs().max())
    error = float((got.logits.double() - expected.logits.double()).abs().max())
    expect(error <= 1e-3 * max(scale, 1.0), invariant=INVARIANT, runtime=runtime,
           what="a small batch after a large one differs from an engine that never ran the large one "
                "(stale block tables or seq_lens?)",
           case=describe_batch(small), largest_difference=error, logit_scale=scale)
