"""Replay equivalence (SPEC 7, invariant 1): a graph step equals the eager step at the same
padded shape, bit for bit, at every bucket boundary, for uniform, mixed and q > 1 batches; the
modes agree with each other; multi-step generation gives identical logits and tokens."""
import pytest
import torch

from harness.compare import expect, expect_equal
from harness.equality import first_mismatch
from harness.execution import Sequence, advance, capture_sizes, decode_requests, describe_batch, mixed_requests, prefill

INVARIANT = "replay equivalence"
pytestmark = pytest.mark.requires("execution")
GRAPH_MODES = ["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def boundary_counts(engines, q):
    sizes = capture_sizes(engines.runtime, engines.config(spec=q - 1).policy) or [1, 2, 4, 8, 16]
    return sorted({n for s in sizes for n in (s - 1, s, s + 1) if n >= 1})


def boundary_batches(engines, engine, seqs, q=1):
    """Batches of s-1, s and s+1 tokens for every capture size s (and past the max): uniform
    ones over all the prefilled requests, then mixed ones with one new prompt joining, after two
    requests leave so the engine never holds more than max_num_seqs."""
    counts = boundary_counts(engines, q)
    for n in counts:
        if n % q == 0 and n // q <= len(seqs):
            yield decode_requests(seqs[: n // q], q), []
    for gone in seqs[-2:]:
        engine.release(gone.request_id)
    seqs = seqs[:-2]
    for n in counts:
        decode = seqs[: min(len(seqs), max(0, (n - 1) // q))]
        rest = n - q * len(decode)
        if rest >= 1:
            ids = [engines.new_id()]
            yield mixed_requests(decode, ids, [rest], q), ids


def check_step(engine, runtime, requests, invariant=INVARIANT, what="graph step vs eager at the same padded shape"):
    graph = engine.step(requests)
    eager = engine.eager_step(requests, graph.padded_num_tokens)
    mismatch = first_mismatch(graph.logits, eager.logits)
    expect(mismatch is None, invariant=invariant, runtime=runtime, what=what,
           case=f"{describe_batch(requests)}; ran {graph.runtime_mode} at {graph.padded_num_tokens}",
           mismatch=mismatch)
    return graph


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_graph_equals_eager_at_every_bucket_boundary(runtime, engines, mode):
    engine = engines.get(mode=mode)
    seqs = prefill(engine, [engines.new_id() for _ in range(8)], [3, 5, 2, 9, 4, 7, 1, 6])
    ran = set()
    for requests, started in boundary_batches(engines, engine, seqs):
        ran.add(check_step(engine, runtime, requests).runtime_mode)
        for request_id in started:
            engine.release(request_id)
    for s in seqs[:-2]:
        engine.release(s.request_id)
    resolved = engine.resolution.resolved
    expect((ran - {"NONE"} != set()) == (resolved != "NONE"), invariant=INVARIANT, runtime=runtime,
           what=f"mode {mode} (resolved {resolved}) ran graphs exactly when it resolved to a graph mode",
           ran=sorted(ran))


@pytest.mark.requires("speculative")
@pytest.mark.parametrize("mode", ["FULL", "FULL_AND_PIECEWISE", "PIECEWISE"])
def test_graph_equals_eager_for_verify_batches_of_q_tokens(runtime, engines, mode):
    q = 2
    engine = engines.get(mode=mode, spec=q - 1)
    seqs = prefill(engine, [engines.new_id() for _ in range(8)], [3, 5, 2, 9, 4, 7, 1, 6])
    for requests, started in boundary_batches(engines, engine, seqs, q=q):
        check_step(engine, runtime, requests)
        for request_id in started:
            engine.release(request_id)
    for s in seqs[:-2]:
        engine.release(s.request_id)


def scenario(engine, step, steps=6, q=1):
    """Requests join and leave over several steps; `step(requests)` runs one and returns
    (logits, padded size, runtime mode). Request ids are fixed so two engines see the same inputs."""
    live: list[Sequence] = []
    joins = {0: [4, 7, 2], 1: [5], 3: [3, 3], 4: [6]}
    leaves = {2: 1, 4: 2}
    trace = []
    for t in range(steps):
        new = [(50_000 + 10 * t + j, n) for j, n in enumerate(joins.get(t, []))]
        requests = mixed_requests(live, [i for i, _ in new], [n for _, n in new], q)
        logits, padded, ran = step(requests)
        trace.append((describe_batch(requests), padded, ran, logits))
        advance(live, q)
        live += [Sequence(i, n) for i, n in new]
        for _ in range(leaves.get(t, 0)):
            engine.release(live.pop(0).request_id)
    for s in live:
        engine.release(s.request_id)
    return trace


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_generation_matches_eager_step_by_step(runtime, engines, mode):
    """A graph engine and an eager engine driven through the same scenario agree at every step."""
    graph_engine = engines.get(mode=mode, fresh=True)
    eager_engine = engines.get(mode="NONE", fresh=True, capture=False)

    def graph_step(requests):
        out = graph_engine.step(requests)
        return out.logits, out.padded_num_tokens, out.runtime_mode

    graph_trace = scenario(graph_engine, graph_step)
    pads = iter([padded for _, padded, _, _ in graph_trace])

    def eager_step(requests):
        out = eager_engine.eager_step(requests, next(pads))
        return out.logits, out.padded_num_tokens, out.runtime_mode

    eager_trace = scenario(eager_engine, eager_step)
    for t, ((batch, padded, ran, logits), (_, _, _, expected)) in enumerate(zip(graph_trace, eager_trace)):
        mismatch = first_mismatch(logits, expected)
        expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
               what=f"step {t} of a generation with requests joining and leaving differs from eager",
               case=f"{batch}; {mode} engine ran {ran} at {padded}", mismatch=mismatch)
        expect_equal(logits.argmax(-1).tolist(), expected.argmax(-1).tolist(), invariant=INVARIANT,
                     runtime=runtime, what=f"greedy tokens at step {t}", case=batch)
