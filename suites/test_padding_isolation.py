"""Padding isolation (docs/spec.md section 7, invariants 2 and 3).

- Real rows do not depend on what padded rows hold (zeros, random values, NaN, inf), and the
  fill provably took effect (the harness reads the padded rows back, `input_inspection`).
- Padded rows write no KV-cache slot (every slot snapshotted, the last one included).
- The engine's own padded inputs, read back by the harness: in-range token ids and positions, the
  declared padding slot, and the same values whatever ran before (a large batch, a small one).
- A small batch after a large one runs on fresh metadata, not on what the large one left.

Expected values: the same step without the fill, an eager engine that never saw the large batch,
and the KV snapshot before the step. Padded batches are chosen from the runtime's own sizes.
"""
import pytest
import torch

from harness.expectations import kv
from harness.scenarios.batches import advance, decode_requests, describe_batch, mixed_requests, prefill, prefill_within
from harness.vocabulary import CONFIG_MODES, EAGER, MIXED_GRAPH_MODES, OBSERVED, OWN_POLICY

INVARIANT = "padding isolation"
pytestmark = pytest.mark.requires("execution")
LENGTHS = [3, 5, 2, 9, 4, 7, 1]


def padded_counts(runtime, engine, most: int) -> list[int]:
    """Token counts up to `most` that the runtime's own policy pads (up to four of them)."""
    if runtime.capabilities.capture_sizes:
        counts = [n for n in range(1, most + 1) if (runtime.padded_size(engine.policy, n) or n) > n]
    else:
        counts = list(range(1, most + 1))
    return counts[:4] if len(counts) <= 4 else [counts[0], counts[len(counts) // 3], counts[2 * len(counts) // 3],
                                                  counts[-1]]


def padded_batches(engines, engine, seqs):
    """Padded uniform and mixed batches; with 7 requests live, one joining keeps max_num_seqs 8."""
    for n in padded_counts(engines.runtime, engine, len(seqs)):
        yield decode_requests(seqs[:n]), []
        if n >= 2:
            ids = [engines.new_id()]
            yield mixed_requests(seqs[: n - 2], ids, [2]), ids


@pytest.mark.requires("padding_fills")
@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_real_rows_ignore_what_padded_rows_hold(check, engines, mode, padding_fill):
    engine = engines.for_mode(mode)
    seqs = prefill(engine, [engines.new_id() for _ in LENGTHS], LENGTHS)
    padded_steps = 0
    for requests, started in padded_batches(engines, engine, seqs):
        plain = engine.step(requests)
        plain_inputs = engine.last_step_inputs() if engines.runtime.capabilities.input_inspection else None
        filled = engine.step(requests, padding_fill=padding_fill)
        case = f"{describe_batch(requests)}; {filled.runtime_mode} at {filled.num_padded_tokens}"
        padded_steps += filled.num_padded_tokens > filled.num_real_tokens
        check.same_bits(filled.logits, plain.logits, what=f"real rows changed when padded rows held {padding_fill!r}",
                        source="the same step without the fill", case=case)
        if plain_inputs is not None and filled.num_padded_tokens > filled.num_real_tokens and padding_fill != "zeros":
            n, filled_inputs = filled.num_real_tokens, engine.last_step_inputs()
            check.that(not torch.equal(filled_inputs.token_ids[n:], plain_inputs.token_ids[n:])
                       or not torch.equal(filled_inputs.positions[n:], plain_inputs.positions[n:]),
                       what=f"the {padding_fill!r} fill did not reach the padded rows: they hold the token ids and "
                            "positions they held without it (every fill but 'zeros' puts random ids and positions "
                            "there)", source=OBSERVED, case=case, padded_token_ids=filled_inputs.token_ids[n:].tolist(),
                       padded_positions=filled_inputs.positions[n:].tolist())
        for request_id in started:
            engine.release(request_id)
    check.that(padded_steps > 0, what="none of the batches chosen to be padded was padded", source=OWN_POLICY)


@pytest.mark.requires("kv_inspection")
@pytest.mark.parametrize("mode", CONFIG_MODES)
def test_padded_rows_write_no_kv_slot(check, engines, mode):
    """Snapshot every slot, run padded steps, and allow changes only where real tokens wrote. The
    engine's own padding writes the same values every time (a stray write may find its own bits
    already there, from warm-up): where it can, each batch runs again with random padded rows."""
    engine = engines.get(mode=mode, fresh=True, capture=mode != "NONE")
    seqs = prefill(engine, [engines.new_id() for _ in LENGTHS], LENGTHS)
    fills = [None] + (["random"] if "random" in engines.runtime.capabilities.padding_fills else [])
    for requests, started in padded_batches(engines, engine, seqs):
        for fill in fills:  # the same batch again: what real tokens write is the same
            before = engine.kv_snapshot()
            out = engine.step(requests) if fill is None else engine.step(requests, padding_fill=fill)
            after = engine.kv_snapshot()
            written = kv.written_slots(engine, requests)
            stray = kv.stray_slots(engine, requests, before, after, written)
            last = before.shape[0] - 1
            check.that(not stray, what="padded rows wrote KV-cache slots" + (
                " (including the last slot, where -1 wraps)" if last in stray else ""), source=OBSERVED,
                case=f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}; "
                     f"padded rows {fill or 'as the engine pads'}", stray_slots=stray[:10], real_slots=sorted(written)[:10])
        for request_id in started:
            engine.release(request_id)


@pytest.mark.requires("kv_inspection")
def test_padded_rows_at_the_top_of_a_larger_grid_are_isolated(check, engines):
    """On the suites' larger engine, decode batches its grid pads past the default engine's sizes:
    real rows equal the same step with random padded rows (where the runtime can fill them), and
    no padded row writes a KV slot."""
    engine = engines.larger()
    seats = engine.policy.max_num_seqs
    seqs = prefill_within(engine, [engines.new_id() for _ in range(seats)], [2 + i % 3 for i in range(seats)],
                          engine.policy.max_num_batched_tokens)
    fill = "random" if "random" in engines.runtime.capabilities.padding_fills else None
    above = engines.defaults["max_num_seqs"]
    padded = 0
    for n in [n for n in padded_counts(engines.runtime, engine, seats) if n > above] or [seats]:
        requests = decode_requests(seqs[:n])
        before = engine.kv_snapshot()
        plain = engine.step(requests)
        stray = kv.stray_slots(engine, requests, before, engine.kv_snapshot(), kv.written_slots(engine, requests))
        case = f"{describe_batch(requests)}; {plain.runtime_mode} at {plain.num_padded_tokens}"
        padded += plain.num_padded_tokens > plain.num_real_tokens
        check.that(not stray, what="padded rows wrote KV-cache slots", source=OBSERVED, case=case, stray_slots=stray[:10])
        if fill:
            filled = engine.step(requests, padding_fill=fill)
            check.same_bits(filled.logits, plain.logits, source="the same step without the fill", case=case,
                            what=f"real rows changed when padded rows held {fill!r}")
    check.that(padded > 0 or not engines.runtime.capabilities.capture_sizes, source=OWN_POLICY,
               what="none of the larger engine's batches chosen to be padded was padded")


@pytest.mark.requires("input_inspection")
@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_padded_inputs_are_valid_and_do_not_remember_earlier_steps(check, engines, mode):
    """The padded rows the engine itself wrote: token ids in the vocabulary, positions inside the
    model's length, the padding slot; and the same values after a large batch as after a small one
    (stale positions left in padded rows are a bug real engines shipped). A runtime that declares
    `random_padding_ids` draws the ids anew each step: they are held to differ from what the step
    before left in those rows, and only positions and slots to be the same."""
    engine = engines.for_mode(mode)
    random_ids = engines.runtime.capabilities.declares("random_padding_ids")
    seqs = prefill(engine, [engines.new_id() for _ in LENGTHS], LENGTHS)
    for n in padded_counts(engines.runtime, engine, len(seqs)):
        requests = decode_requests(seqs[:n])
        seen, left_there = [], []
        stranger = engines.new_id()
        for previous in (decode_requests(seqs), mixed_requests([], [stranger], [8]), decode_requests(seqs[:1])):
            engine.step(previous)  # leaves another batch's rows in the static buffers
            before = engine.last_step_inputs().token_ids
            out = engine.step(requests)
            inputs = engine.last_step_inputs()
            pad = slice(out.num_real_tokens, out.num_padded_tokens)
            case = f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}"
            ids, positions, slots = inputs.token_ids[pad], inputs.positions[pad], inputs.slot_mapping[pad]
            check.that(bool(((ids >= 0) & (ids < engines.vocab)).all()), source=OBSERVED, case=case,
                       what=f"padded rows hold token ids outside the vocabulary 0..{engines.vocab - 1}",
                       padded_token_ids=ids.tolist())
            check.that(bool(((positions >= 0) & (positions < engines.max_model_len)).all()), source=OBSERVED,
                       case=case, what=f"padded rows hold positions outside 0..{engines.max_model_len - 1}",
                       padded_positions=positions.tolist())
            check.that(bool((slots == inputs.padding_slot).all()), source=OBSERVED, case=case,
                       what=f"padded rows must carry the padding slot {inputs.padding_slot} (no KV write)",
                       padded_slots=slots.tolist())
            kept = [ids] if not random_ids else []
            seen.append(torch.stack([*kept, positions, slots]).cpu())
            if random_ids and len(before) >= out.num_padded_tokens:
                left_there.append(bool(torch.equal(ids.cpu(), before[pad].cpu())))
        engine.release(stranger)
        check.that(all(torch.equal(seen[0], other) for other in seen[1:]), source=OBSERVED,
                   case=describe_batch(requests), what="padded rows hold different values depending on which "
                   "batch ran before: stale rows from an earlier step" + (" (positions and slots: the runtime "
                   "declares random_padding_ids)" if random_ids else ""),
                   padded_rows_after_each=[rows.tolist() for rows in seen])
        check.that(not (left_there and all(left_there)), source=OBSERVED, case=describe_batch(requests),
                   what="the runtime declares random_padding_ids, but its padded rows hold the token ids the "
                        "step before left there", steps_whose_ids_were_left=len(left_there))


@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_a_small_batch_after_a_large_one_sees_fresh_metadata(check, engines, mode):
    """Large then small: the small step must match a fresh eager engine that never saw the large one."""
    engine = engines.for_mode(mode, fresh=True)
    ids = [engines.new_id() for _ in range(8)]
    seqs = prefill(engine, ids, [9, 3, 5, 2, 7, 4, 6, 8])
    large = decode_requests(seqs)
    engine.step(large)
    advance(seqs, large)
    small = decode_requests(seqs[:2])
    got = engine.step(small)
    case = f"{describe_batch(small)}; {got.runtime_mode} at {got.num_padded_tokens}"
    check.same_bits(got.logits, engine.eager_step(small, got.num_padded_tokens).logits, source=EAGER, case=case,
                    what="small step after a large one vs eager at the same shape")
    # An engine that never ran the large batch: prefill each context whole, then the same small step.
    fresh = engines.get(mode="NONE", fresh=True, capture=False)
    fresh.step([type(r)(r.request_id, tuple(s.tokens), 0) for r, s in zip(small, seqs)])
    expected = fresh.step(small)
    scale = float(expected.logits.abs().max())
    error = float((got.logits.double() - expected.logits.double()).abs().max())
    check.note_difference(error)
    check.that(error <= 1e-3 * max(scale, 1.0), source="an eager engine that never ran the large batch", case=case,
               what="a small batch after a large one differs from an engine that never ran the large one "
                    "(stale block tables or seq_lens?)", largest_difference=error, logit_scale=scale)

