"""Padded request rows (docs/spec.md section 7, invariant 3): the per-request metadata a graph
replays with, read back by the harness (`last_step_inputs()`: sequence lengths, query start
offsets, block-table rows).

- Real rows are right: each request's length after the step and where its tokens start, from the
  requests the harness sent; each block-table row maps the request's positions to the slots the
  runtime's `slot_of()` names (its two answers checked against each other).
- Query start offsets never decrease, padded rows included (FlashAttention reads them so).
- Padded rows are neutral: length 0, or a table of the runtime's declared `padding_block` only.
- Padded rows do not remember earlier steps: the same values whatever batch ran before.

Bugs engines shipped: padded rows that kept an earlier request's length and blocks (SGLang, illegal
memory accesses in FlashInfer), query starts padded with -1 (vLLM, wrong FULL replays).
"""
import pytest
import torch

from harness.scenarios.batches import decode_requests, describe_batch, mixed_requests, padded_counts, prefill
from harness.vocabulary import CONFIG_MODES, MIXED_GRAPH_MODES, OBSERVED

INVARIANT = "padded request rows"
pytestmark = pytest.mark.requires("execution", "input_inspection")
LENGTHS = [3, 5, 2, 9, 4, 7, 1]
FIELDS = ("seq_lens", "query_start_loc", "block_tables")
SENT = "the requests the harness sent"


def seated(engine) -> list[int]:
    """The prompt lengths of the requests kept live, leaving seats under max_num_seqs for the
    request that joins a mixed batch and the stranger of another history."""
    return LENGTHS[: max(1, engine.policy.max_num_seqs - 2)]


def exposed(check, inputs):
    """The request-row fields the runtime exposes; a skip naming why where it exposes none."""
    shown = [name for name in FIELDS if getattr(inputs, name, None) is not None]
    if not shown:
        reasons = "; ".join(f"{name}: {why}" for name, why in dict(inputs.not_exposed or {}).items())
        check.skip(f"exposes no request rows in last_step_inputs() ({reasons or 'no reason given in not_exposed'})")
    return shown


def check_real_rows(check, engines, engine, requests, inputs, case):
    """Lengths and query starts against the requests; block rows against slot_of()."""
    real = len(requests)
    if inputs.seq_lens is not None:
        check.equal(inputs.seq_lens[:real].tolist(), [r.context_len + len(r.token_ids) for r in requests],
                    source=SENT, case=case, what="the real rows' sequence lengths (context after the step)")
    if inputs.query_start_loc is not None:
        starts = [0]
        for r in requests:
            starts.append(starts[-1] + len(r.token_ids))
        check.equal(inputs.query_start_loc[: real + 1].tolist(), starts, source=SENT, case=case,
                    what="the real rows' query start offsets")
    block_size = inputs.block_size
    if inputs.block_tables is None or not block_size or not engines.runtime.capabilities.kv_inspection:
        return
    for row, r in enumerate(requests):
        table = inputs.block_tables[row].tolist()
        for position in range(r.context_len + len(r.token_ids)):
            slot = engine.slot_of(r.request_id, position)
            index = position // block_size
            mapped = table[index] * block_size + position % block_size if index < len(table) else None
            check.that(mapped == slot, source="the runtime's slot_of(), checked against its block-table rows",
                       case=case, what=f"request {r.request_id}'s block-table row does not hold position {position}: "
                                       f"it maps to slot {mapped}, slot_of() says {slot}", block_row=table,
                       block_size=block_size)


def padded_rows(inputs, real: int) -> dict:
    """What the padded request rows hold, field by field (on the CPU)."""
    rows = {}
    if inputs.seq_lens is not None:
        rows["seq_lens"] = inputs.seq_lens[real:].cpu()
    if inputs.query_start_loc is not None:
        rows["query_start_loc"] = inputs.query_start_loc[real + 1:].cpu()
    if inputs.block_tables is not None:
        rows["block_tables"] = inputs.block_tables[real:].cpu()
    return rows


def check_padded_rows(check, engines, inputs, real: int, num_real_tokens: int, case):
    """Query starts non-decreasing inside the step; padded rows neutral."""
    if inputs.query_start_loc is not None:
        starts = inputs.query_start_loc.cpu()
        check.that(bool((starts[1:] >= starts[:-1]).all()) and bool(((starts >= 0) & (starts <= num_real_tokens)).all()),
                   source=OBSERVED, case=case, query_start_loc=starts.tolist(),
                   what=f"query start offsets must be non-decreasing and within 0..{num_real_tokens}, padded rows "
                        "included (attention kernels read every row's start and end)")
    if inputs.seq_lens is None:
        return
    lengths = inputs.seq_lens[real:].cpu()
    check.that(bool(((lengths >= 0) & (lengths <= engines.max_model_len)).all()), source=OBSERVED, case=case,
               what=f"padded rows hold sequence lengths outside 0..{engines.max_model_len}",
               padded_seq_lens=lengths.tolist())
    reading = lengths > 0
    if inputs.block_tables is None or not bool(reading.any()):
        return
    tables = inputs.block_tables[real:].cpu()[reading]
    pad = inputs.padding_block
    check.that(pad is not None and bool((tables == pad).all()), source="the runtime's declared padding_block",
               case=case, padded_seq_lens=lengths.tolist(), padded_block_rows=tables.tolist(), padding_block=pad,
               what="padded rows that read context (length > 0) must read only the declared padding_block "
                    "(StepInputs.padding_block), never a block a request may own")


@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_request_rows_are_right_and_padded_rows_neutral(check, engines, mode):
    """Padded uniform and mixed batches after three different histories: real rows right, padded
    rows neutral and the same after each history."""
    engine = engines.for_mode(mode)
    lengths = seated(engine)
    seqs = prefill(engine, [engines.new_id() for _ in lengths], lengths)
    exposed(check, engine.last_step_inputs())
    for n in padded_counts(engines.runtime, engine.policy, len(seqs)):
        batches = [(decode_requests(seqs[:n]), None)]
        if n >= 2:
            batches.append((mixed_requests(seqs[: n - 2], [joining := engines.new_id()], [2]), joining))
        for requests, joined in batches:
            seen = []
            stranger = engines.new_id()
            for previous in (decode_requests(seqs), mixed_requests([], [stranger], [8]), decode_requests(seqs[:1])):
                engine.step(previous)  # leaves another batch's rows in the static buffers
                out = engine.step(requests)
                inputs = engine.last_step_inputs()
                case = f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}"
                check_real_rows(check, engines, engine, requests, inputs, case)
                check_padded_rows(check, engines, inputs, len(requests), out.num_padded_tokens, case)
                seen.append(padded_rows(inputs, len(requests)))
            engine.release(stranger)
            if joined is not None:
                engine.release(joined)
            for name in seen[0]:
                check.that(all(torch.equal(seen[0][name], other[name]) for other in seen[1:]), source=OBSERVED,
                           case=describe_batch(requests),
                           what=f"padded request rows' {name} depend on which batch ran before: stale rows from "
                                "an earlier step", padded_rows_after_each=[other[name].tolist() for other in seen])


@pytest.mark.parametrize("mode", CONFIG_MODES)
def test_unpadded_and_eager_steps_stage_right_rows(check, engines, mode):
    """Every mode, a prefill and a decode step: the real rows right wherever the step ran."""
    engine = engines.get(mode="NONE", capture=False) if mode == "NONE" else engines.for_mode(mode)
    lengths = seated(engine)[:3]
    seqs = prefill(engine, [engines.new_id() for _ in lengths], lengths)
    exposed(check, engine.last_step_inputs())
    for requests in (decode_requests(seqs), mixed_requests(seqs[:2], [engines.new_id()], [4])):
        out = engine.step(requests)
        inputs = engine.last_step_inputs()
        case = f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}"
        check_real_rows(check, engines, engine, requests, inputs, case)
        check_padded_rows(check, engines, inputs, len(requests), out.num_padded_tokens, case)
