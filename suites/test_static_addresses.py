"""Static addresses (SPEC 7, invariant 4): every static buffer keeps its address through capture,
replays and steps; a replay with an input at another address fails loudly; a held output lives
as long as the runtime says it does."""
import pytest

from harness.compare import expect
from harness.equality import first_mismatch
from harness.execution import decode_requests, describe_batch, mixed_requests, prefill

INVARIANT = "static addresses"
pytestmark = pytest.mark.requires("execution")


def test_addresses_survive_capture_replays_and_steps(runtime, engines):
    engine = engines.get(mode="FULL_AND_PIECEWISE", fresh=True, capture=False)
    before = dict(engine.static_buffer_addresses())
    engine.capture()
    expect(dict(engine.static_buffer_addresses()) == before, invariant=INVARIANT, runtime=runtime,
           what="capture moved a static buffer", before=before, after=engine.static_buffer_addresses())
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    for n in (1, 3, 7, 5):
        joined = engines.new_id()
        for requests in (decode_requests(seqs[:n]), mixed_requests(seqs[: n - 1], [joined], [3])):
            engine.step(requests)
            expect(dict(engine.static_buffer_addresses()) == before, invariant=INVARIANT, runtime=runtime,
                   what="a step moved a static buffer", case=describe_batch(requests),
                   before=before, after=engine.static_buffer_addresses())
        engine.release(joined)
    for s in seqs:
        engine.release(s.request_id)


@pytest.mark.requires("address_checks")
@pytest.mark.parametrize("batch", ["uniform", "mixed"])
def test_a_moved_input_fails_loudly_or_is_not_read(runtime, engines, batch):
    """Swap each static buffer for a copy at another address (what a step that assigns a new
    tensor instead of copying into the buffer does), then replay a graph for the first time.
    It must raise, or be right because the graph does not read that buffer; it must never
    compute on the old memory. (Like vLLM, a runtime may check only a graph's first replay.)"""
    names = sorted(engines.get(mode="FULL_AND_PIECEWISE").static_buffer_addresses())
    raised = []
    for name in names:
        engine = engines.get(mode="FULL_AND_PIECEWISE", fresh=True)
        seqs = prefill(engine, [engines.new_id() for _ in range(4)], [3, 5, 2, 9])
        requests = (decode_requests(seqs[:3]) if batch == "uniform" else
                    mixed_requests(seqs[:2], [engines.new_id()], [2]))
        engine.swap_static_buffer(name)
        try:
            out = engine.step(requests)
        except Exception:  # noqa: BLE001 - a loud failure is what we want
            raised.append(name)
            continue
        mismatch = first_mismatch(out.logits, engine.eager_step(requests, out.padded_num_tokens).logits)
        expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
               what=f"after moving static buffer {name!r} the step neither failed nor computed the right "
                    "answer: the graph read the memory it was captured with",
               case=f"{describe_batch(requests)}; {out.runtime_mode} at {out.padded_num_tokens}",
               mismatch=mismatch)
    expect(bool(raised), invariant=INVARIANT, runtime=runtime,
           what=f"moving any static buffer went unnoticed by every {batch} replay", buffers=names)


@pytest.mark.requires("not outputs_alias_graph_buffers")
def test_held_output_lives_as_declared(runtime, engines):
    """Hold step t's output, run step t+1, and compare with a copy taken at t. (A runtime that
    declares aliasing outputs is skipped: its callers must copy before the next step.)"""
    engine = engines.get(mode="FULL_AND_PIECEWISE")
    seqs = prefill(engine, [engines.new_id() for _ in range(4)], [3, 5, 2, 9])
    first = engine.step(decode_requests(seqs[:2]))
    kept = first.logits.clone()
    engine.step(decode_requests(seqs[2:4]))  # same padded size, other inputs
    mismatch = first_mismatch(first.logits, kept)
    expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
           what="a returned output changed after the next step, but the runtime declares that outputs "
                "do not alias graph buffers (outputs_alias_graph_buffers=False)", mismatch=mismatch)
    for s in seqs:
        engine.release(s.request_id)
