"""Replay equivalence (docs/spec.md section 7, invariant 1): a graph step equals an eager step of
the same runtime at the same padded shape, bit for bit (`torch.equal`), at every bucket boundary
s-1, s, s+1 of the runtime's own sizes, for uniform, mixed and q > 1 verify batches, and for
batches of q x num_real_rows tokens in requests of unequal lengths (which are not uniform); a graph
engine and an eager engine driven through the same generation agree at every step, and through
decode steps of one size whose rows change owner (an engine that keeps request rows from step to
step, as vLLM's persistent batch does, must follow each request to its row), and through verify
steps that reject drafts (the next step rolls back to the last accepted token); one-token prompts
join decode batches. The suites' larger engine (harness.runtime.factory) runs the boundaries its grid
adds: the steps of its policy, its largest graph and a maximum off its grid.

Expected values: an eager step of the same runtime at the same shape (of the same engine, or of a
second engine fed the same steps). The mode each step ran
is checked against the runtime's own dispatch() on every step (harness.runtime.observe).
"""
import pytest

from harness.expectations.equality import largest_difference, same_bits
from harness.scenarios.drafts import rejecting_drafts
from harness.scenarios.batches import (OWNER_ROWS, decode_requests, describe_batch, mixed_requests, prefill,
                                      prefill_within, rows_changing_owner, uneven_requests)
from harness.scenarios.generation import generation, numbered
from harness.vocabulary import EAGER, GRAPH_MODES, MIXED_GRAPH_MODES

INVARIANT = "replay equivalence"
pytestmark = pytest.mark.requires("execution")
TWIN_EAGER = "an eager step of a second engine of the same runtime and mode, driven through the same steps"
LENGTHS = [3, 5, 2, 9, 4, 7, 1, 6]


def boundary_counts(runtime, engine, above: int = 0) -> list[int]:
    """s-1, s and s+1 for every capture size s above `above` of the engine's resolved policy,
    within the token budget it was built with (no scheduler sends more: a size at the budget has
    no s+1)."""
    sizes = runtime.capture_sizes(engine.policy) if runtime.capabilities.capture_sizes else []
    budget = engine.policy.max_num_batched_tokens
    return sorted({n for s in sizes or range(1, 17) if s > above for n in (s - 1, s, s + 1) if 1 <= n <= budget})


def boundary_batches(engines, engine, seqs, q=1, above: int = 0):
    """Uniform batches over the live sequences; batches of q x n tokens in uneven requests (q > 1);
    then mixed ones with one new prompt joining, after two requests leave so the engine never
    holds more than max_num_seqs."""
    counts = boundary_counts(engines.runtime, engine, above)
    for n in counts:
        if n % q == 0 and n // q <= len(seqs):
            yield decode_requests(seqs[: n // q], q), []
            if q > 1 and n // q >= 2:
                yield uneven_requests(seqs[: n // q], q), []
    for gone in seqs[-2:]:
        engine.release(gone.request_id)
    seqs = seqs[:-2]
    for n in counts:
        decode = seqs[: min(len(seqs), max(0, (n - 1) // q))]
        rest = n - q * len(decode)
        if rest >= 1:
            ids = [engines.new_id()]
            yield mixed_requests(decode, ids, [rest], q), ids


def check_step(check, engine, requests):
    graph = engine.step(requests)
    eager = engine.eager_step(requests, graph.num_padded_tokens)
    check.same_bits(graph.logits, eager.logits, what="graph step vs eager at the same padded shape", source=EAGER,
                    case=f"{describe_batch(requests)}; ran {graph.runtime_mode} at {graph.num_padded_tokens}")
    return graph


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_graph_equals_eager_at_every_bucket_boundary(check, engines, mode):
    engine = engines.for_mode(mode)
    seqs = prefill(engine, [engines.new_id() for _ in LENGTHS], LENGTHS)
    ran = set()
    for requests, started in boundary_batches(engines, engine, seqs):
        ran.add(check_step(check, engine, requests).runtime_mode)
        for request_id in started:
            engine.release(request_id)
    check.that(ran - {"NONE"}, what=f"mode {mode} (resolved {engine.resolution.resolved}) ran no batch in a graph",
               ran=sorted(ran))


def test_graph_equals_eager_at_the_top_of_a_larger_grid(check, engines):
    """The same on the suites' larger engine (harness.runtime.factory: max_num_seqs past its grid's
    power-of-two prefix and off its own sizes), at the boundaries the default engine's grid does
    not reach: the steps of its policy, its largest graph, its maximum and what lies above it."""
    engine = engines.larger()
    seats = engine.policy.max_num_seqs
    seqs = prefill_within(engine, [engines.new_id() for _ in range(seats)], [2 + i % 4 for i in range(seats)],
                          engine.policy.max_num_batched_tokens)
    ran = set()
    for requests, started in boundary_batches(engines, engine, seqs, above=engines.defaults["max_num_seqs"]):
        ran.add(check_step(check, engine, requests).runtime_mode)
        for request_id in started:
            engine.release(request_id)
    check.that(ran - {"NONE"}, what=f"the larger engine ({engine.resolution.resolved}) ran no batch in a graph",
               ran=sorted(ran))


@pytest.mark.requires("speculative_steps")
@pytest.mark.parametrize("mode", MIXED_GRAPH_MODES)
def test_graph_equals_eager_for_verify_batches_of_q_tokens(check, engines, mode):
    q = 2
    engine = engines.for_mode(mode, spec=q - 1)
    seqs = prefill(engine, [engines.new_id() for _ in LENGTHS], LENGTHS)
    for requests, started in boundary_batches(engines, engine, seqs, q=q):
        check_step(check, engine, requests)
        for request_id in started:
            engine.release(request_id)


def scenario(engine, step, steps=6, q=1):
    """Requests join and leave over several steps; `step(requests)` runs one and returns
    (logits, padded size, runtime mode). Request ids are fixed so two engines see the same inputs.
    At steps 2 and 5 requests whose prompt is one token join a decode batch: every request brings
    one token, so the batch is uniform although some have no KV yet."""
    joins = {0: [4, 7, 2], 1: [5], 2: [1], 3: [3, 3], 4: [6], 5: [1, 1]}
    leaves = {2: 1, 4: 2}
    trace = []
    for requests, (logits, padded, ran), _ in generation(engine, None, numbered(joins, 50_000), leaves, steps, q,
                                                         step=step):
        trace.append((describe_batch(requests), padded, ran, logits))
    return trace


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_generation_matches_eager_step_by_step(check, engines, mode):
    """A graph engine and an eager engine driven through the same scenario agree at every step."""
    graph_engine = engines.for_mode(mode, fresh=True)
    eager_engine = engines.get(mode="NONE", fresh=True, capture=False)

    def graph_step(requests):
        out = graph_engine.step(requests)
        return out.logits, out.num_padded_tokens, out.runtime_mode

    graph_trace = scenario(graph_engine, graph_step)
    pads = iter([padded for _, padded, _, _ in graph_trace])

    def eager_step(requests):
        out = eager_engine.eager_step(requests, next(pads))
        return out.logits, out.num_padded_tokens, out.runtime_mode

    eager_trace = scenario(eager_engine, eager_step)
    for t, ((batch, padded, ran, logits), (_, _, _, expected)) in enumerate(zip(graph_trace, eager_trace)):
        check.same_bits(logits, expected, source="an eager engine of the same runtime driven through the same steps",
                        what=f"step {t} of a generation with requests joining and leaving",
                        case=f"{batch}; {mode} engine ran {ran} at {padded}")


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_decode_rows_follow_their_requests(check, engines, mode):
    """Decode steps of one size whose rows change owner (harness.scenarios.batches.OWNER_ROWS) on a fresh
    graph engine, with no other step in between, so whatever it kept from one step is what the
    next builds on; each against an eager step of a second engine of the same mode (the suites'
    shared one) driven through the same steps. A bug shared by both paths is the numerical
    anchor's to catch. A mismatch also says which side moved (_which_side_moved)."""
    _rows_follow_their_requests(check, engines, mode, spec=0, q=1)


@pytest.mark.requires("speculative_steps")
def test_verify_rows_follow_their_requests(check, engines):
    """The same with verify steps of q = 2 tokens a request (a row's positions and slots span two)."""
    _rows_follow_their_requests(check, engines, "FULL_AND_PIECEWISE", spec=1, q=2)


REJECTING_SPEC = 2  # q = 3: a verify step keeps none, one or both of its drafts


@pytest.mark.requires("speculative_steps", "rejected_drafts")
def test_steps_after_rejected_drafts_equal_eager(check, engines):
    """Verify steps that reject some drafts, then decode and verify steps (harness.scenarios.drafts):
    a fresh graph engine and a second engine's eager steps at the same padded sizes agree at every
    step. An engine that advances a request past its rejected drafts on its graph path only (a
    persistent batch adding q to every row's position) differs here; one that does it on every path
    is the numerical anchor's to catch."""
    q = REJECTING_SPEC + 1
    graph_engine = engines.for_mode("FULL_AND_PIECEWISE", spec=REJECTING_SPEC, fresh=True)
    twin = engines.for_mode("FULL_AND_PIECEWISE", spec=REJECTING_SPEC, fresh=True)
    first_id = engines.new_id() * 100  # the same requests on both fresh engines
    graph = [out for _, out, _ in rejecting_drafts(graph_engine, None, first_id, q)]
    steps = iter(graph)
    eager = rejecting_drafts(twin, None, first_id, q,
                             step=lambda requests: twin.eager_step(requests, next(steps).num_padded_tokens))
    for t, ((requests, expected, _), got) in enumerate(zip(eager, graph)):
        rejected = {r.request_id: r.num_rejected_tokens for r in requests if r.num_rejected_tokens}
        check.same_bits(got.logits, expected.logits, source=TWIN_EAGER,
                        what=f"step {t} after verify steps (q = {q}) that rejected drafts {rejected or 'none'}",
                        case=f"{describe_batch(requests)}; ran {got.runtime_mode} at {got.num_padded_tokens}")


def _rows_follow_their_requests(check, engines, mode, spec, q):
    steps = "decode" if q == 1 else f"verify (q = {q})"
    graph_engine, twin = engines.for_mode(mode, spec=spec, fresh=True), engines.for_mode(mode, spec=spec)
    graph = [graph_engine.step(requests) for requests, _ in rows_changing_owner(graph_engine, q=q)]
    for t, (requests, _) in enumerate(rows_changing_owner(twin, q=q)):
        got = graph[t]
        expected = twin.eager_step(requests, got.num_padded_tokens)
        if same_bits(got.logits, expected.logits):
            continue
        diagnosis = _which_side_moved(engines.for_mode(mode, spec=spec, fresh=True), graph, t, q, expected)
        check.same_bits(got.logits, expected.logits, source=TWIN_EAGER,
                        what=f"{steps} step {t} of one size whose rows change owner (rows {OWNER_ROWS[t]} of the pool)",
                        case=f"{describe_batch(requests)}; ran {got.runtime_mode} at {got.num_padded_tokens}",
                        **{"a fresh engine": diagnosis})


def _which_side_moved(fresh, graph, t, q, twin_step) -> str:
    """After a mismatch at step t: the same steps, eager, on a third engine that has served nothing
    else. Agreeing with the graph engine (fresh too) puts the difference on the shared twin's side
    (what it served before, or the process it ran in); agreeing with the twin puts it in the graph step."""
    for s, (requests, _) in enumerate(rows_changing_owner(fresh, q=q)):
        opinion = fresh.eager_step(requests, graph[s].num_padded_tokens)
        if s == t:
            break
    with_graph, with_twin = same_bits(opinion.logits, graph[t].logits), same_bits(opinion.logits, twin_step.logits)
    if with_graph:
        return ("its eager step equals the graph step, so the shared twin's eager step moved: what that engine "
                "served before, or the state of the process it ran in, changed its result; not the graph")
    if with_twin:
        return "its eager step equals the shared twin's: the graph step is what differs"
    return (f"its eager step equals neither (largest difference {largest_difference(opinion.logits, graph[t].logits)} "
            f"from the graph step, {largest_difference(opinion.logits, twin_step.logits)} from the twin's)")
