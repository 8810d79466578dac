"""Backend support is truthful (SPEC 7, invariant 6): each attention backend's declared level is
exercised in FULL graphs with every batch kind that level admits, and the graphs equal eager;
resolution at build time follows the table for the weakest backend; every downgrade warns."""
import itertools
import warnings

import pytest

from harness import oracle
from harness.compare import expect, expect_equal
from harness.equality import first_mismatch
from harness.execution import decode_requests, describe_batch, mixed_requests, prefill

INVARIANT = "backend support"
pytestmark = [pytest.mark.requires("execution", "attention_backends")]
LEVELS = ["ALWAYS", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE", "NEVER"]
# What each level admits in a FULL graph: (mode to build, speculative tokens, batch kinds).
ADMITS = {
    "ALWAYS": ("FULL", 0, ("uniform", "mixed", "prefill")),
    "UNIFORM_BATCH": ("FULL_AND_PIECEWISE", 1, ("uniform",)),
    "UNIFORM_SINGLE_TOKEN_DECODE": ("FULL_AND_PIECEWISE", 0, ("uniform",)),
}


def declared(runtime):
    return list(runtime.capabilities.attention_backends)


def batches(engines, seqs, kinds, q):
    """With 6 requests live, at most two join, so the engine holds at most max_num_seqs (8)."""
    for n in (1, 2, 3, 4, 5, 6):
        if "uniform" in kinds and n <= len(seqs):
            yield decode_requests(seqs[:n], q), []
        if "mixed" in kinds and 2 <= n <= len(seqs):
            ids = [engines.new_id()]
            yield mixed_requests(seqs[: n - 1], ids, [3]), ids
        if "prefill" in kinds:
            ids = [engines.new_id(), engines.new_id()]
            yield mixed_requests([], ids, [n, 2]), ids


@pytest.mark.parametrize("level", LEVELS[:3])
def test_declared_level_holds_in_full_graphs(runtime, engines, level):
    names = [name for name, declared_level in declared(runtime) if declared_level == level]
    if not names:
        pytest.skip(f"runtime {runtime.name!r} declares no {level} backend")
    mode, spec, kinds = ADMITS[level]
    q = 1 + spec
    for name in names:
        engine = engines.get(mode=mode, attention=(name,), spec=spec)
        seqs = prefill(engine, [engines.new_id() for _ in range(6)], [3, 5, 2, 9, 4, 7])
        full = 0
        for requests, started in batches(engines, seqs, kinds, q):
            out = engine.step(requests)
            full += out.runtime_mode == "FULL"
            mismatch = first_mismatch(out.logits, engine.eager_step(requests, out.padded_num_tokens).logits)
            expect(mismatch is None, invariant=INVARIANT, runtime=runtime,
                   what=f"backend {name!r} declares {level}, but its {out.runtime_mode} graph differs from eager",
                   case=f"{describe_batch(requests)}; at {out.padded_num_tokens}", mismatch=mismatch)
            for request_id in started:
                engine.release(request_id)
        for s in seqs:
            engine.release(s.request_id)
        expect(full > 0, invariant=INVARIANT, runtime=runtime,
               what=f"backend {name!r} ({level}) ran no batch in a FULL graph under {mode}")


@pytest.mark.parametrize("spec", [0, 1], ids=["q1", "q2"])
def test_resolution_at_build_follows_the_table(runtime, engines, spec):
    """One backend, and every pair of backends (a hybrid model takes the weakest)."""
    backends = declared(runtime)
    models = [(b,) for b in backends] + list(itertools.combinations(backends, 2))
    for model, requested in itertools.product(models, ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                                       "FULL_AND_PIECEWISE"]):
        weakest = max((level for _, level in model), key=LEVELS.index)  # LEVELS is strongest first
        expected = oracle.expected_resolution(requested, weakest, num_speculative_tokens=spec)
        names = tuple(name for name, _ in model)
        case = f"mode {requested}, backends {names} (weakest {weakest}), q={1 + spec}"
        if expected.error:
            with pytest.raises(ValueError):
                engines.get(mode=requested, attention=names, spec=spec, fresh=True, capture=False)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine = engines.get(mode=requested, attention=names, spec=spec, fresh=True, capture=False)
        expect_equal(engine.resolution.resolved, expected.resolved, invariant=INVARIANT, runtime=runtime,
                     what="mode resolved at build time", case=case)
        if engine.resolution.resolved != requested:
            expect(bool(engine.resolution.warnings) and bool(caught), invariant=INVARIANT, runtime=runtime,
                   what="a downgrade at build time must warn (in the resolution and as a Python warning)",
                   case=case, resolution=engine.resolution, warnings=[str(w.message) for w in caught])
