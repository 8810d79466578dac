"""The numerical anchor (docs/spec.md section 7, invariant 1's independent half): every step of a
generation, in every mode, against transformers' own forward over the same checkpoint.

Every other equality in these suites compares a runtime with itself (graph vs its own eager), so
a bug shared by all its paths (RoPE one position off, a wrong norm epsilon, keys and values
swapped) passes them. Here the expected logits come from outside the engine: the harness writes
the preset's seeded weights as a Hugging Face checkpoint, the engine loads it
(`loads_checkpoint`), and `harness.expectations.anchor` computes each request's rows from its whole sequence.
Logits must agree within the tolerance the runtime's declared precision earns (`Capabilities.precision`:
IEEE float32, TF32 matrix products, or a dtype it computes in; the rule is
harness.expectations.anchor.tolerance, docs/spec.md section 10), and the greedy token must be the
same wherever the anchor's top-2 margin exceeds twice that tolerance (each of the two logits may
move by it). Every message names the declaration that set the tolerance. Decode steps
whose rows change owner run against it too: a persistent batch that mixes up rows on every path
passes replay equivalence, since eager and graph steps then agree.
"""
import pytest
import torch

from harness.expectations.anchor import top2_margin
from harness.scenarios.batches import describe_batch, prompt, rows_changing_owner
from harness.scenarios.generation import generation as shared_generation, numbered
from harness.protocol import Request
from harness.reports.records import Anchor as AnchorRecord
from harness.vocabulary import INDEPENDENT_FORWARD, MIXED_GRAPH_MODES

INVARIANT = "numerical anchor"
pytestmark = pytest.mark.requires("execution", "loads_checkpoint")
MODES = ["NONE", *MIXED_GRAPH_MODES]


@pytest.fixture
def anchor(engine_factory):
    return engine_factory.anchor()


JOINS = {0: [5, 11, 3], 1: [7], 3: [2, 9], 5: [4]}  # step -> prompt lengths of the requests joining
LEAVES = {2: 1, 5: 2}


def generation(engine, anchor, first_id: int, q: int = 1, steps: int = 8):
    """Requests join and leave; decode steps feed the anchor's greedy tokens (plus q - 1 drafts),
    so the engine and the anchor always see the same sequences (harness.scenarios.generation).
    Yields (requests, logits, expected)."""
    return shared_generation(engine, anchor, numbered(JOINS, first_id), LEAVES, steps, q)


@pytest.mark.parametrize("mode", MODES)
def test_every_step_matches_transformers(check, engines, record, anchor, mode):
    engine = engines.get(mode="NONE", capture=False) if mode == "NONE" else engines.for_mode(mode)
    _compare(check, engines, record, anchor, generation(engine, anchor, engines.new_id() * 100), mode)


@pytest.mark.requires("speculative_steps")
def test_verify_steps_match_transformers(check, engines, record, anchor):
    engine = engines.for_mode("FULL_AND_PIECEWISE", spec=1)
    _compare(check, engines, record, anchor, generation(engine, anchor, engines.new_id() * 100, q=2),
             "FULL_AND_PIECEWISE q=2")


@pytest.mark.requires("speculative_steps", "rejected_drafts")
@pytest.mark.parametrize("mode", ["NONE", "FULL_AND_PIECEWISE"])
def test_steps_after_rejected_drafts_match_transformers(check, engines, record, anchor, mode):
    """Verify steps (q = 3) that reject some drafts, then decode and verify steps
    (harness.scenarios.drafts): the anchor sees each request's accepted tokens only, so an engine
    that keeps the rejected drafts' KV in its context, or places the next tokens past them, on
    every path (eager included, where replay equivalence compares it with itself) differs here."""
    from harness.scenarios.drafts import rejecting_drafts

    engine = engines.for_mode(mode, spec=2) if mode != "NONE" else engines.get(mode="NONE", capture=False, spec=2)
    _compare(check, engines, record, anchor, rejecting_drafts(engine, anchor, engines.new_id() * 100, q=3),
             f"{mode} q=3, drafts rejected")


@pytest.mark.parametrize("mode", ["NONE", "FULL_AND_PIECEWISE"])
def test_decode_rows_follow_their_requests(check, engines, record, anchor, mode):
    """Decode steps of one size whose rows change owner (harness.scenarios.batches.OWNER_ROWS): an engine
    that keeps request rows from step to step must follow each request, on every path (eager
    included, where replay equivalence has nothing to compare with)."""
    engine = engines.get(mode="NONE", capture=False) if mode == "NONE" else engines.for_mode(mode)

    def steps():
        for requests, history in rows_changing_owner(engine, engines.new_id() * 100):
            yield requests, engine.step(requests), anchor.step(requests, history)
    _compare(check, engines, record, anchor, steps(), f"{mode}, rows changing owner")


def _compare(check, engines, record, anchor, steps_run, label):
    """Each step's logits (steps_run yields requests, output, anchor rows) against the anchor."""
    precision = engines.runtime.capabilities.precision
    tolerance = anchor.tolerance(precision, engines.preset)
    largest, compared, equal, steps = 0.0, 0, 0, 0
    for requests, out, expected in steps_run:
        steps += 1
        got = out.logits.float().cpu()
        difference = float((got - expected).abs().max())
        largest = max(largest, difference)
        case = f"step {steps - 1}: {describe_batch(requests)}; ran {out.runtime_mode} at {out.num_padded_tokens}"
        check.note_difference(difference)
        check.that(difference <= tolerance.value, source=INDEPENDENT_FORWARD, case=case,
                   what=f"logits differ from transformers' forward by more than {tolerance.explain()}",
                   largest_difference=difference,
                   worst_row=int((got - expected).abs().max(dim=-1).values.argmax()))
        decided = top2_margin(expected) > 2 * tolerance.value
        same = got.argmax(-1) == expected.argmax(-1)
        compared += int(decided.sum())
        equal += int((same & decided).sum())
        check.that(bool(same[decided].all()), source=INDEPENDENT_FORWARD, case=case,
                   what=f"a greedy token differs from transformers' where its top-2 margin exceeds twice the "
                        f"tolerance {tolerance.value:.3g} (declared precision {precision!r})",
                   rows=torch.nonzero(decided & ~same).flatten().tolist())
    record(AnchorRecord(mode=label, dtype=engines.dtype, steps=steps, largest_difference=largest,
                        tolerance=tolerance.value, tokens_compared=compared, tokens_equal=equal))


@pytest.mark.parametrize("mode", MODES)
def test_steps_at_the_end_of_the_context_match_transformers(check, engines, record, anchor, mode):
    """Steps whose last token is at max_model_len - 1, the tiny model's last position
    (harness.scenarios.batches.reaching_the_end): a prefill chunk ending there, decode steps
    reaching it in the last KV block beside a short request, and a request whose prompt is one token
    joining them."""
    from harness.scenarios.batches import reaching_the_end

    engine = engines.get(mode="NONE", capture=False) if mode == "NONE" else engines.for_mode(mode)

    def steps():
        for requests, history in reaching_the_end(engine, engines.new_id() * 100, engines.max_model_len,
                                                  engine.policy.max_num_batched_tokens):
            yield requests, engine.step(requests), anchor.step(requests, history)
    _compare(check, engines, record, anchor, steps(), f"{mode}, at the end of the context")


def test_positions_past_the_models_match_transformers_where_an_engine_runs_them(check, engines, record, anchor):
    """An engine built with max_model_len one past the checkpoint's max_position_embeddings that
    does not refuse it (test_context_end.py judges a refusal) computes those positions as
    transformers does: a prompt of that length prefilled in chunks, every chunk against the anchor."""
    from harness.expectations import presets

    positions = presets.preset(engines.preset).max_positions
    try:
        engine = engines.get(mode="NONE", capture=False, fresh=True, max_model_len=positions + 1)
    except ValueError as exc:
        check.skip(f"it refuses max_model_len {positions + 1} past the model's {positions} positions: {exc}")
    request_id, budget = engines.new_id(), engines.defaults["max_num_batched_tokens"]
    sequence = list(prompt(request_id, positions + 1))

    def steps():
        for start in range(0, positions + 1, budget):
            requests = [Request(request_id, tuple(sequence[start:start + budget]), start)]
            yield requests, engine.step(requests), anchor.step(requests, {request_id: sequence[:start]})
    _compare(check, engines, record, anchor, steps(), "NONE, past the model's positions")
    engine.release(request_id)
