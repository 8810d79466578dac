"""Static addresses (docs/spec.md section 7, invariant 4): every static buffer keeps its address
through capture, replays and steps; a replay with an input moved to another address fails loudly
(a RuntimeError or AssertionError naming the address or the buffer) or provably does not read it;
a held output lives as long as the runtime declares.

`static_buffer_addresses()` lists graph inputs only: each name is what `swap_static_buffer()` takes.
"""
import pytest

from harness.scenarios.batches import advance, decode_requests, describe_batch, mixed_requests, prefill, prefill_within
from harness.graphs import FreedMemoryError
from harness.expectations.equality import first_mismatch
from harness.reliability.safe import describe_exception
from harness.vocabulary import EAGER, OBSERVED

INVARIANT = "static addresses"
pytestmark = pytest.mark.requires("execution")
LOUD = (RuntimeError, AssertionError)  # what an address check raises (vLLM: an assertion in debug mode)


def test_addresses_survive_capture_replays_and_steps(check, engines):
    """Capture may add buffers (an engine that allocates each graph's inputs as it captures that
    graph, as LMDeploy does), but moves none that existed before it; after capture, none moves."""
    engine = engines.for_mode("FULL_AND_PIECEWISE", fresh=True, capture=False)
    existing = dict(engine.static_buffer_addresses())
    engine.capture()
    before = dict(engine.static_buffer_addresses())
    check.equal({name: before.get(name) for name in existing}, existing, what="capture moved (or dropped) a static "
                "buffer", source=OBSERVED)
    seqs = prefill(engine, [engines.new_id() for _ in range(7)], [3, 5, 2, 9, 4, 7, 1])
    for n in (1, 3, 7, 5):
        joined = engines.new_id()
        for requests in (decode_requests(seqs[:n]), mixed_requests(seqs[: n - 1], [joined], [3])):
            engine.step(requests)
            check.equal(dict(engine.static_buffer_addresses()), before, what="a step moved a static buffer",
                        source=OBSERVED, case=describe_batch(requests))
        engine.release(joined)


@pytest.mark.requires("address_checks")
@pytest.mark.parametrize("batch", ["uniform", "mixed"])
def test_a_moved_input_fails_loudly_or_is_not_read(check, engines, batch):
    """Swap each static buffer for a copy at another address (what a step that assigns a new
    tensor instead of copying into the buffer does), then replay a graph for the first time.
    It must raise, or be right because the graph does not read that buffer; it must never
    compute on the old memory. (Like vLLM, a runtime may check only a graph's first replay.) A
    runtime whose own dispatch runs these batches eager has no replay here: the test skips.
    FULL graphs, one per size, hold every input a step reads: a fresh engine per buffer is cheap.
    A runtime that declares lazy_capture records its graph in service, and that recording is its
    first replay: it serves the batch's shape twice on other inputs first, and the graph it
    recorded must then not compute on the old memory either (graph trees copy their inputs in).
    A step that differs from eager has two candidate causes: the steps it served are run again,
    without the move, on a fresh engine, and the move is blamed only where that one is right."""
    lazy = engines.runtime.capabilities.lazy_capture
    names = sorted(engines.for_mode("FULL").static_buffer_addresses())
    raised, replayed = [], []
    for name in names:
        engine = engines.for_mode("FULL", fresh=True)
        served, requests = _serve_before_the_move(engines, engine, batch, lazy)
        engine.swap_static_buffer(name)
        try:
            out = engine.step(requests)
        except FreedMemoryError as exc:  # the harness's emulator, not the engine, noticed: a failure
            check.that(False, source=OBSERVED, case=describe_batch(requests),
                       what=f"after moving static buffer {name!r} the graph replayed over the freed old buffer (the "
                            "emulator raised; on a GPU it reads whatever reused that memory): the graph read the "
                            "memory it was captured with", error=describe_exception(exc))
            continue
        except LOUD as exc:
            text = describe_exception(exc)
            check.that("address" in text.lower() or name in text, source=OBSERVED, case=describe_batch(requests),
                       what=f"the step after moving {name!r} raised, but not about an address or the buffer",
                       error=text)
            raised.append(name)
            continue
        if out.runtime_mode != "NONE":
            replayed.append(name)
        case = f"{describe_batch(requests)}; {out.runtime_mode} at {out.num_padded_tokens}"
        eager = engine.eager_step(requests, out.num_padded_tokens)
        if first_mismatch(out.logits, eager.logits) is None:
            continue
        # Two candidate causes: the moved buffer, or a step that is wrong without any move (a graph
        # keyed or recorded for another batch). The same history on an engine whose buffers never
        # moved tells them apart before one is named.
        unmoved = engines.for_mode("FULL", fresh=True)
        for call, argument in served.calls:
            getattr(unmoved, call)(argument)
        plain = unmoved.step(requests)
        check.same_bits(plain.logits, unmoved.eager_step(requests, plain.num_padded_tokens).logits, source=EAGER,
                        case=f"{describe_batch(requests)}; {plain.runtime_mode} at {plain.num_padded_tokens}",
                        what=f"the step differs from eager without any move too (on an engine that served the "
                             f"same steps, whose buffers the harness never moved): the cause is not the move of "
                             f"{name!r}; the graph this step replays was recorded or keyed for another batch, or "
                             "read the memory it was captured with where the engine itself moved an input")
        check.same_bits(out.logits, eager.logits, source=EAGER, case=case,
                        what=f"after moving static buffer {name!r} the step neither failed nor computed the right "
                             "answer: the graph read the memory it was captured with (without the move, the same "
                             "step on an engine that served the same steps equals eager)")
    if not raised and not replayed:  # its own dispatch sends these batches to eager (FULL_DECODE_ONLY, say)
        check.skip(f"every {batch} step ran eager under {engine.resolution.resolved}: no replay to move an input under")
    if lazy:  # a graph that copies its inputs in reads no moved buffer: right answers are all it owes
        return
    check.that(bool(raised), what=f"moving any static buffer went unnoticed by every {batch} replay",
               source=OBSERVED, buffers=names)


class _Served:
    """An engine whose steps and releases are noted, to serve them again on another engine."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def step(self, requests):
        self.calls.append(("step", list(requests)))
        return self.engine.step(requests)

    def release(self, request_id):
        self.calls.append(("release", request_id))
        self.engine.release(request_id)


def _serve_before_the_move(engines, engine, batch, lazy):
    """Prefill, and under lazy_capture the batch's shape twice on inputs of its own (its graph is
    recorded then, at most after a warm-up); (what was served, the batch the move comes before)."""
    served = _Served(engine)
    seqs = prefill(served, [engines.new_id() for _ in range(4)], [3, 5, 2, 9])
    for _ in range(2 if lazy else 0):
        earlier = _batch(engines, seqs, batch)
        served.step(earlier)
        advance(seqs, earlier)
        if batch == "mixed":
            served.release(earlier[-1].request_id)
    return served, _batch(engines, seqs, batch)


def _batch(engines, seqs, batch):
    """Three decode steps, or two and a new prompt of two tokens: the same shape at every call."""
    return decode_requests(seqs[:3]) if batch == "uniform" else mixed_requests(seqs[:2], [engines.new_id()], [2])


@pytest.mark.requires("not outputs_alias_graph_buffers")
def test_held_output_lives_as_declared(check, engines):
    """Hold step t's output, run step t+1, and compare with a copy taken at t. (A runtime that
    declares aliasing outputs is skipped: its callers must copy before the next step.)"""
    engine = engines.for_mode("FULL_AND_PIECEWISE")
    seqs = prefill(engine, [engines.new_id() for _ in range(4)], [3, 5, 2, 9])
    first = engine.step(decode_requests(seqs[:2]))
    kept = first.logits.clone()
    engine.step(decode_requests(seqs[2:4]))  # same padded size, other inputs
    check.same_bits(first.logits, kept, source="a copy taken before the next step",
                    what="a returned output changed after the next step, but the runtime declares that outputs "
                         "do not alias graph buffers (outputs_alias_graph_buffers=False)")


@pytest.mark.requires("not outputs_alias_graph_buffers")
def test_held_outputs_live_across_steps_of_other_sizes(check, engines):
    """On the larger engine, whose graphs share a memory pool: hold the output of a decode step of
    each size and run a step of every other size after the largest, and the largest after every
    other; a held output must keep its values (a graph replayed after another captured later may
    write where that one keeps its output, on the GPU and on the emulator alike)."""
    engine = engines.larger()
    seats = engine.policy.max_num_seqs
    seqs = prefill_within(engine, [engines.new_id() for _ in range(seats)], [2 + i % 3 for i in range(seats)],
                          engine.policy.max_num_batched_tokens)
    sizes = engines.runtime.capture_sizes(engine.policy) if engines.runtime.capabilities.capture_sizes else []
    batches = sorted({n for n in sizes if n <= seats} | {1, seats})  # requests a decode batch brings
    largest = batches[-1]
    pairs = [(largest, n) for n in batches[:-1]] + [(n, largest) for n in batches[:-1]]
    for held_at, then in pairs:
        held = engine.step(decode_requests(seqs[:held_at]))
        kept = held.logits.clone()
        after = engine.step(decode_requests(seqs[:then]))
        check.same_bits(held.logits, kept, source="a copy taken before the next step",
                        case=f"held: {held.runtime_mode} at {held.num_padded_tokens}; then "
                             f"{after.runtime_mode} at {after.num_padded_tokens}",
                        what="a returned output changed after a step of another size, but the runtime declares that "
                             "outputs do not alias graph buffers (outputs_alias_graph_buffers=False)")
