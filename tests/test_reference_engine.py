"""The reference engine: model parity with transformers, mode equivalence, capture rules.

Runs on the graph emulator everywhere and on CUDA graphs where a GPU is present.
"""
import gc
import warnings

import pytest
import torch

from contextlib import contextmanager
from dataclasses import replace

from harness.expectations.presets import checkpoint, seeded_model
from harness.graphs import CaptureError, StaleAddressError
from harness.protocol import Request
from harness.scenarios.serving import generate
from reference_runtime.engine.plan import FULL, NONE
from reference_runtime.engine.runner import ModelRunner, RunnerConfig
from reference_runtime.policy import PolicyConfig

BACKENDS = ["emulated", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="no CUDA device"))]
MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 12, [3, 1, 4, 1, 5, 9, 2, 6], [42]]
BUDGETS = [6, 9, 4, 12, 7]


def config(mode="FULL_AND_PIECEWISE", attention=("static",), spec=0, seqs=8, graph_backend="emulated") -> RunnerConfig:
    return RunnerConfig(
        checkpoint=str(checkpoint("tiny")), device="cuda" if graph_backend == "cuda" else "cpu",
        graph_backend=graph_backend, attention_backends=attention,
        policy=PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=64, num_speculative_tokens=spec, mode=mode))


def runner(graph_backend="emulated", mode="FULL_AND_PIECEWISE", attention=("static",), spec=0, seqs=8, **seams):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ModelRunner(config(mode, attention, spec, seqs, graph_backend), **seams)


def test_eager_forward_matches_transformers():
    hf = seeded_model("tiny", seed=0)
    r = runner(mode="NONE")
    prompt = [5, 17, 3, 99, 200, 7, 11]
    tokens = list(prompt)
    out = r.step([Request(0, tuple(prompt), 0)])
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(out.logits, expected, rtol=0, atol=2e-5)
    for _ in range(4):
        tokens.append(int(out.logits[-1].argmax()))
        out = r.step([Request(0, (tokens[-1],), len(tokens) - 1)])
        with torch.no_grad():
            expected = hf(torch.tensor([tokens])).logits[0, -1:]
        torch.testing.assert_close(out.logits, expected, rtol=0, atol=2e-5)


class ModesSeen:
    """The runner, remembering which runtime modes its steps ran."""

    def __init__(self, runner):
        self.runner = runner
        self.modes_seen = set()

    def step(self, requests):
        out = self.runner.step(requests)
        self.modes_seen.add(out.runtime_mode)
        return out

    def release(self, request_id):
        self.runner.release(request_id)


@pytest.mark.parametrize("graph_backend", BACKENDS)
@pytest.mark.parametrize("spec", [0, 1], ids=["q1", "q2"])
@pytest.mark.parametrize("attention", [("static",), ("uniform",), ("decode",), ("static", "varlen")],
                         ids=lambda a: "+".join(a))
def test_generation_is_identical_in_every_mode(graph_backend, spec, attention):
    outputs = {}
    for mode in MODES:
        try:
            r = runner(graph_backend, mode, attention, spec)
        except ValueError:  # FULL with a NEVER backend: the table says error
            assert "varlen" in attention and mode == "FULL"
            continue
        r.capture()
        seen = ModesSeen(r)
        outputs[mode] = generate(seen, PROMPTS, BUDGETS, max_num_seqs=8, token_budget=64, q=1 + spec)
        assert seen.modes_seen <= {"NONE", "PIECEWISE", "FULL"} and (mode == "NONE" or seen.modes_seen - {"NONE"})
    reference = outputs.pop("NONE")
    for mode, tokens in outputs.items():
        assert tokens == reference, f"{mode} generated different tokens"


@pytest.mark.parametrize("graph_backend", BACKENDS)
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_replay_equals_eager_at_the_same_padded_shape(graph_backend, mode):
    r = runner(graph_backend, mode)
    r.capture()
    prefill = [Request(i, tuple(range(1, 4 + i)), 0) for i in range(6)]
    r.step(prefill)
    for batch in (1, 2, 3, 4, 5, 7, 8, 9):
        decode = [Request(i % 6, (i + 1,), 3 + i % 6) for i in range(min(batch, 6))]
        mixed = decode[:-1] + [Request(100 + batch, (5, 6), 0)]
        for requests in (decode, mixed):
            graph = r.step(requests)
            eager = r.eager_step(requests, graph.num_padded_tokens)
            assert graph.runtime_mode != "NONE" or graph.num_padded_tokens == graph.num_real_tokens
            assert torch.equal(graph.logits, eager.logits), (mode, batch, graph.runtime_mode)
            r.release(100 + batch)


@pytest.mark.parametrize("graph_backend", BACKENDS)
def test_padded_rows_write_no_kv_slot(graph_backend):
    r = runner(graph_backend, "FULL_AND_PIECEWISE")
    r.capture()
    r.step([Request(0, (1, 2, 3), 0)])
    before = r.cache.real_blocks().clone()
    out = r.step([Request(0, (4,), 3), Request(1, (9, 9, 9, 9, 9), 0)])  # 6 tokens padded to 8
    assert out.num_padded_tokens == 8
    written = {r.slot_of(0, 3)} | {r.slot_of(1, p) for p in range(5)}
    after = r.cache.real_blocks()
    changed = {s for s in range(r.cache.num_slots) if not torch.equal(after[:, :, s], before[:, :, s])}
    assert changed <= written, f"padded rows wrote slots {sorted(changed - written)}"
    assert r.cache.num_slots - 1 not in changed  # where a -1 index would wrap


def test_a_full_step_copies_its_inputs_inside_the_graph():
    """A FULL step only stages its inputs on the host and launches the graph, whose first nodes
    copy them in; outside the graph it copies the logits out, nothing else. Another step then
    gets its own inputs, a mixed one too (its padded request rows staged at the graph's extent)."""
    from harness.graphs import counting

    r = runner(mode="FULL")
    r.capture()
    r.step([Request(0, (1, 2, 3), 0), Request(1, (4, 5), 0)])
    for requests in ([Request(0, (4,), 3)], [Request(0, (5,), 4), Request(1, (7, 8), 2)]):
        counted = counting.count(lambda: r.step(requests), "cpu")
        assert (counted.kernels, counted.graphs, counted.copies) == (1, 1, 1), counted
        graph = r.step(requests)
        assert graph.runtime_mode == "FULL"
        assert torch.equal(graph.logits, r.eager_step(requests, graph.num_padded_tokens).logits)


def test_staging_refuses_more_rows_than_the_graph_copies():
    r = runner(mode="FULL")
    plan = r.planner.lay_out([Request(0, (1,), 0), Request(1, (2,), 0)], NONE, None, 2)
    with pytest.raises(ValueError, match="2 request rows does not fit the 1 rows staged"):
        r.stager.stage(replace(plan, staged_rows=1))


def test_staging_refuses_a_plan_whose_lists_disagree_with_its_size():
    r = runner(mode="FULL")
    plan = r.planner.lay_out([Request(0, (1, 2), 0)], NONE, None, 2)
    plan.positions.append(7)
    with pytest.raises(ValueError, match="a plan of 2 tokens in 1 rows needs 2 token ids, positions"):
        r.stager.stage(plan)


def test_a_remembered_dispatch_answers_as_the_dispatcher_does():
    """A step looks each batch shape up once; every answer is the dispatcher's, a
    batch the dispatcher refuses is refused every time, and before capture steps run eager."""
    r = runner(mode="FULL_AND_PIECEWISE")
    assert r.step([Request(0, (1,), 0)]).runtime_mode == "NONE"
    r.capture()
    shapes = [(n, reqs, uniform) for n in (1, 2, 3, 5, 8, 9, 16, 17, 64, 65) for reqs in (1, 2, n)
              for uniform in (False, True) if reqs <= min(n, 8) and (not uniform or n == reqs)]
    for _ in range(2):  # the second time from memory
        for shape in shapes:
            assert r.planner.decide(*shape, captured=True) == r.dispatcher.dispatch(*shape), shape
    for _ in range(2):
        with pytest.raises(ValueError, match="num_real_rows must be in"):
            r.planner.decide(4, 9, False, captured=True)


@pytest.mark.parametrize("graph_backend", BACKENDS)
def test_steps_issued_back_to_back_each_read_their_own_inputs(graph_backend):
    """No synchronisation between steps: each stages while the device may still run the last, so
    the pinned buffer must not be rewritten before the graph that reads it has copied it."""
    r = runner(graph_backend, "FULL_AND_PIECEWISE")
    r.capture()
    r.step([Request(i, tuple(range(1, 9)), 0) for i in range(4)])
    # Runs of six steps of one shape: the later ones restage over the rows the first kept.
    batches = [[Request(i, (10 + step + i,), 8 + step) for i in range(1 + step // 6)] for step in range(24)]
    outputs = [r.step(requests) for requests in batches]  # issued back to back, compared after
    for step, (requests, out) in enumerate(zip(batches, outputs)):
        assert out.runtime_mode == "FULL"
        # The KV the step wrote is there now; rewriting it with the same values changes nothing.
        eager = r.eager_step(requests, out.num_padded_tokens)
        assert torch.equal(out.logits, eager.logits), f"step {step} read another step's inputs"


@pytest.mark.parametrize("q", [1, 2], ids=["decode", "verify-q2"])
def test_a_step_over_kept_rows_stages_what_a_fresh_plan_would(q):
    """A uniform step of the shape the last one kept updates that plan in place (the persistent
    batch) and stages only what changed; the plan it runs with, and what it stages, must equal a
    fresh plan staged whole, through positions crossing a block, a request taking another's row,
    the requests in another order, a released id coming back with another table, and steps in
    between that stage their own plans (eager, a padding fill, a prompt)."""
    import random

    from reference_runtime.engine.buffers import StaticBuffers

    r = runner(mode="FULL_AND_PIECEWISE", spec=q - 1)
    r.capture()
    b = r.stager
    fresh = StaticBuffers(b.max_tokens, b.max_rows, b.max_blocks, r.config.max_model_len, "cpu")
    rng = random.Random(q)
    contexts = {i: 0 for i in range(3)}
    r.step([Request(i, (5,) * 14, 0) for i in contexts])  # 14 tokens: a block boundary a step or two on
    contexts = dict.fromkeys(contexts, 14)
    next_id, updated = 3, 0
    for step in range(40):
        if step % 9 == 4:  # a request leaves and a new one takes its row: same shape, another table
            gone = rng.choice(sorted(contexts))
            r.release(gone)
            del contexts[gone]
            comeback = gone if step % 2 else next_id  # a released id may come back with a new table
            next_id += comeback == next_id
            r.step([Request(comeback, (6,) * (3 + step % 5), 0)])
            contexts[comeback] = 3 + step % 5
        if step % 7 == 3:  # the same requests in another order: each row now holds another's table
            contexts = dict(reversed(contexts.items()))
        if step % 13 == 7:
            r.step([Request(i, (7,) * q, c) for i, c in contexts.items()], padding_fill="random")
        if step % 17 == 11:
            r.eager_step([Request(i, (8,) * q, c) for i, c in contexts.items()], 4 * q)
        requests = [Request(i, tuple(rng.randrange(1, 200) for _ in range(q)), c) for i, c in contexts.items()]
        kept = r.planner.persistent
        revision = kept.revision if kept is not None else None
        out = r.step(requests)
        assert out.runtime_mode == "FULL"
        plan = r.last_plan
        updated += plan is kept and plan.revision == revision + 1
        expected = r.planner.fresh(requests, FULL, plan.key, out.num_padded_tokens, q)
        for name in ("input_ids", "positions", "slot_mapping", "token_req", "block_tables", "seq_lens",
                     "query_start_loc", "num_padded_tokens", "staged_rows", "uniform_q"):
            assert getattr(plan, name) == getattr(expected, name), f"step {step}: {name} differs from a fresh plan"
        m = fresh.stage(expected)
        assert torch.equal(b.host[: 2 * m], fresh.host[: 2 * m]), f"step {step} staged other values"
        if step % 6 == 5:  # an eager step stages its own plan: the next step stages the kept one whole
            assert torch.equal(out.logits, r.eager_step(requests, out.num_padded_tokens).logits), step
        for i in contexts:
            contexts[i] += q
    assert updated >= 20, f"only {updated} of 40 steps updated the kept plan"


def test_capture_order_counts_and_phase():
    r = runner(mode="FULL_AND_PIECEWISE")
    summary = r.capture()
    sizes = r.dispatcher.sizes
    pieces = r.model.num_layers + 1
    decode_sizes = [s for s in sizes if s <= r.policy.max_num_seqs]
    assert summary.graphs == {"PIECEWISE": len(sizes) * pieces, "FULL": len(decode_sizes)}
    modes = [m for m, _ in summary.order]
    assert modes == sorted(modes, key=["PIECEWISE", "FULL"].index)
    for mode in ("PIECEWISE", "FULL"):
        order = [n for m, n in summary.order if m == mode]
        assert order == sorted(order, reverse=True)
    with pytest.raises(RuntimeError, match="capture phase"):
        r.capture()
    with pytest.raises(CaptureError):
        r.graphs.capture(lambda: None, static_inputs={})


@contextmanager
def _thawing_capture_phase():
    """A capture phase built to slip past the check below: it stops collection during capture,
    as it should, but ends with gc.unfreeze(), which thaws every frozen object of the process."""
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _process_freeze_survives(capture_phase) -> bool:
    """Whether objects the process froze before `capture_phase` are frozen after it (the
    collector lists only unfrozen objects)."""
    frozen_before = vars(pytest)  # frozen with everything else alive when the tests started
    assert gc.get_freeze_count() > 0 and not any(o is frozen_before for o in gc.get_objects()), \
        "the harness (harness/session/process_exit.py) freezes what is alive when the tests start"
    with capture_phase():
        assert not gc.isenabled(), "no collection may run while graphs are recorded"
    return not any(o is frozen_before for o in gc.get_objects())


def test_a_capture_phase_leaves_the_process_freeze_alone():
    """The engine stops collection during capture and leaves the collector's frozen objects alone: a
    process that froze its own (a test session, a server after start-up) would have them thawed by
    gc.unfreeze(), and every later full collection would walk them again."""
    assert _process_freeze_survives(runner().capture_phase)
    try:
        assert not _process_freeze_survives(_thawing_capture_phase)  # the broken twin is caught
    finally:
        gc.collect()
        gc.freeze()  # what the twin thawed, frozen again for the rest of this process's tests


def test_a_capture_phase_leaves_the_collector_as_it_found_it():
    r = runner()
    frozen = gc.get_freeze_count()
    with r.capture_phase():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() <= frozen  # refcount frees can only lower it
    gc.disable()  # a process that runs without automatic collection keeps it off
    try:
        with r.capture_phase():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_swapped_input_buffer_fails_loudly():
    r = runner(mode="FULL_AND_PIECEWISE")
    r.capture()
    r.swap_static_buffer("input_ids")  # a new tensor instead of a copy
    with pytest.raises(StaleAddressError):
        r.step([Request(0, (1,), 0)])


def test_downgrades_warn():
    with pytest.warns(UserWarning, match="FULL -> FULL_AND_PIECEWISE"):
        ModelRunner(config(mode="FULL", attention=("decode",)))
    with pytest.raises(ValueError, match="PIECEWISE"):
        ModelRunner(config(mode="FULL", attention=("varlen",)))


def test_memory_budget_needs_cuda():
    with pytest.raises(ValueError, match="device='cuda'"):
        runner().fit_kv_cache(0.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_memory_budget_sets_aside_the_graph_estimate():
    r = runner("cuda", "FULL_AND_PIECEWISE")
    r.fit_kv_cache(0.2)
    assert r.cache.num_blocks > 2 and r.graph_memory_estimate > 0
    report = r.capture()
    print(f"graph memory estimate {r.graph_memory_estimate} B, actual {report.memory_bytes} B, "
          f"{r.cache.num_blocks} KV blocks")
    assert generate(r, PROMPTS[:2], [3, 3], max_num_seqs=8, token_budget=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_compiled_pieces_replay_equal_their_eager_run():
    from reference_runtime.engine.compiled import compiled_decoder

    r = runner("cuda", "FULL_AND_PIECEWISE", model=compiled_decoder)
    r.capture()
    r.step([Request(0, (1, 2, 3), 0)])
    for requests in ([Request(0, (4,), 3)], [Request(0, (5,), 4), Request(1, (7, 8), 0)]):
        graph = r.step(requests)
        assert torch.equal(graph.logits, r.eager_step(requests, graph.num_padded_tokens).logits)


def test_the_reference_policy_converts_every_field_of_the_protocols_config():
    """The adapter converts PolicyConfig field by field: a field the protocol gains fails here until
    the conversion handles it (it would otherwise be dropped, silently, from every answer)."""
    import dataclasses

    from harness import protocol as p
    from reference_runtime import adapter

    assert {f.name for f in dataclasses.fields(p.PolicyConfig)} == adapter.CONVERTED_FIELDS
    converted = adapter.to_policy_config(p.PolicyConfig(max_num_seqs=9, num_speculative_tokens=1, max_loras=2,
                                                        mode="FULL", rules="vllm-0.33/v1"))
    assert (converted.max_num_seqs, converted.num_speculative_tokens, converted.max_loras, converted.runner) == (9, 1, 2, "v1")  # the policy's own field
    assert converted.mode.name == "FULL"


def test_the_field_check_fails_on_a_field_the_conversion_does_not_handle(monkeypatch):
    import dataclasses

    from harness import protocol as p
    from reference_runtime import adapter

    grown = dataclasses.make_dataclass("PolicyConfig", [("new_option", int, dataclasses.field(default=0))],
                                       bases=(p.PolicyConfig,), frozen=True)
    assert {f.name for f in dataclasses.fields(grown)} - adapter.CONVERTED_FIELDS == {"new_option"}
