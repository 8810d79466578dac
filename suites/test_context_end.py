"""The end of the context (docs/spec.md section 7, invariants 1 and 3 at the last position): an
engine built with max_model_len holds every request up to that many tokens, on every path. Steps
whose last token is at position max_model_len - 1 (a prefill chunk that ends there, decode and
verify steps that reach it, in the last KV block) run in every graph mode and equal an eager step
at the same padded shape; the suites' max_model_len is the tiny model's max_position_embeddings,
so these are the model's last positions too. Past its limit an engine may refuse a step, and
then says so with a ValueError naming max_model_len before it writes anything; or it runs the
step right. A build past the model's positions is refused the same way, or runs them (as
transformers does: test_numerical_anchor.py).

Expected values: an eager step of the same runtime at the same shape, the KV snapshot before the
step, transformers' forward over the harness's checkpoint (test_numerical_anchor.py holds every
mode to it at the end of the context), and the preset's max_position_embeddings.
"""
import pytest

from harness.expectations import kv, presets
from harness.protocol import Request
from harness.reliability.safe import describe_exception, safe_str
from harness.scenarios.batches import describe_batch, prompt, reaching_the_end
from harness.vocabulary import EAGER, GRAPH_MODES, OBSERVED

INVARIANT = "context end"
pytestmark = pytest.mark.requires("execution")
LIMIT = ("max_model_len", "max_position")  # what a refusal names: the limit build() accepted, or the model's


def run_to_the_end(check, engines, engine, q: int = 1):
    budget, length = engine.policy.max_num_batched_tokens, engines.max_model_len
    for requests, _ in reaching_the_end(engine, engines.new_id() * 10, length, budget, q):
        last = max(r.context_len + len(r.token_ids) for r in requests) - 1
        case = f"{describe_batch(requests)}; last position {last} of max_model_len {length}"
        try:
            out = engine.step(requests)
        except ValueError as exc:
            check.fail("a step within max_model_len was refused: an engine holds every request up to the length "
                       "it was built with", case=case, error=describe_exception(exc))
        if (out.runtime_mode, out.num_padded_tokens) == ("NONE", out.num_real_tokens):
            continue  # it ran as the eager step would: nothing to compare
        eager = engine.eager_step(requests, out.num_padded_tokens)
        check.same_bits(out.logits, eager.logits, source=EAGER, case=f"{case}; ran {out.runtime_mode} at "
                        f"{out.num_padded_tokens}", what="a step at the end of the context differs from eager")


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_steps_that_reach_the_last_position_equal_eager(check, engines, mode):
    run_to_the_end(check, engines, engines.for_mode(mode))


@pytest.mark.requires("speculative_steps")
def test_verify_steps_that_reach_the_last_position_equal_eager(check, engines):
    run_to_the_end(check, engines, engines.for_mode("FULL_AND_PIECEWISE", spec=1), q=2)


def refused_clearly(check, call, case) -> bool:
    """True where the call was refused with a ValueError that names the limit; a refusal of any
    other kind fails."""
    try:
        call()
    except ValueError as exc:
        text = describe_exception(exc)  # the first line, for the message; the limit may be named further on
        check.that(any(word in safe_str(exc) for word in LIMIT), source=OBSERVED, case=case, error=text,
                   what=f"a refusal past the limit must name it ({' or '.join(LIMIT)})")
        return True
    except Exception as exc:  # a crash, or an index past a table: the limit was not checked
        check.fail("past the limit the engine crashed instead of refusing with a ValueError that names it",
                   case=case, raised=describe_exception(exc))
    return False


def test_a_step_past_max_model_len_is_refused_clearly_or_runs_right(check, engines):
    """A request that already holds max_model_len tokens brings one more, beside a request admitted
    after it: refused with a ValueError naming the limit, writing no KV slot; or run without
    touching the other request's KV. Either way the engine runs the next step right."""
    engine = engines.for_mode("FULL_AND_PIECEWISE")
    length, budget = engines.max_model_len, engine.policy.max_num_batched_tokens
    full, other = engines.new_id(), engines.new_id()
    _prefill_long(engine, full, length, budget)  # first, so the other request's KV comes after its
    engine.step([Request(other, prompt(other, 3), 0)])
    past = [Request(full, (5,), length), Request(other, (7,), 3)]
    inspect = engines.runtime.capabilities.kv_inspection
    before = engine.kv_snapshot() if inspect else None
    case = f"{describe_batch(past)}; request {full} already holds max_model_len = {length} tokens"
    refused = refused_clearly(check, lambda: engine.step(past), case)
    if inspect and refused:
        check.that(not kv.changed_slots(before, engine.kv_snapshot()), source=OBSERVED, case=case,
                   what="a refused step wrote KV-cache slots")
    elif inspect:
        held = [engine.slot_of(other, position) for position in range(3)]
        after = engine.kv_snapshot()
        changed = [slot for slot in held if not bool((before[slot] == after[slot]).all())]
        check.that(not changed, source=OBSERVED, case=case, slots_of_the_other_request=held, changed=changed,
                   what="a step past max_model_len overwrote another request's KV")
    within = [Request(other, (7,), 3)]
    out = engine.step(within)
    check.same_bits(out.logits, engine.eager_step(within, out.num_padded_tokens).logits, source=EAGER,
                    case=describe_batch(within), what="the step after one past the limit differs from eager")
    for request_id in (full, other):
        engine.release(request_id)


def _prefill_long(engine, request_id: int, length: int, budget: int) -> None:
    for start in range(0, length, budget):
        engine.step([Request(request_id, prompt(request_id, length)[start:start + budget], start)])


def test_an_engine_past_the_models_positions_is_refused_or_runs_them(check, engines):
    """Built with max_model_len one past the model's max_position_embeddings: refused with a
    ValueError naming the limit, or a prompt that long runs without a crash (and, where the engine
    loads the checkpoint, test_numerical_anchor.py holds its last position to transformers)."""
    positions = presets.preset(engines.preset).max_positions
    case = f"max_model_len {positions + 1}, max_position_embeddings {positions}"
    built = {}
    if refused_clearly(check, lambda: built.update(engine=engines.get(mode="NONE", capture=False, fresh=True,
                                                                      max_model_len=positions + 1)), case):
        return
    engine, request_id = built["engine"], engines.new_id()
    refused_clearly(check, lambda: _prefill_long(engine, request_id, positions + 1,
                                                 engines.defaults["max_num_batched_tokens"]), case)
    engine.release(request_id)
