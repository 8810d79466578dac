"""Backend support is truthful (docs/spec.md section 7, invariant 6): each attention backend's
declared support level holds in FULL graphs for every batch kind that level admits (the graphs
equal eager); the mode an engine resolves at build time, for one backend and for every pair (a
hybrid model takes the weakest), is where the spec (under `vllm_rules`) or the runtime's own
resolve_mode() says it lands; every downgrade warns.
"""
import itertools
import warnings

import pytest

from harness.expectations import expected
from harness.scenarios.batches import decode_requests, describe_batch, mixed_requests, prefill
from harness.vocabulary import CONFIG_MODES, EAGER, OBSERVED, weakest

INVARIANT = "backend support"
pytestmark = pytest.mark.requires("execution", "attention_backends")
# What each level admits in a FULL graph: (mode to build, speculative tokens, batch kinds).
ADMITS = {
    "ALWAYS": ("FULL", 0, ("uniform", "mixed", "prefill")),
    "UNIFORM_BATCH": ("FULL_AND_PIECEWISE", 1, ("uniform",)),
    "UNIFORM_SINGLE_TOKEN_DECODE": ("FULL_AND_PIECEWISE", 0, ("uniform",)),
}


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


def test_declared_level_holds_in_full_graphs(check, engines, attention_backend):
    name, level = attention_backend
    if level not in ADMITS:
        check.skip(f"backend {name!r} declares {level}: it admits no FULL graph")
    mode, spec, kinds = ADMITS[level]
    if spec and not engines.runtime.capabilities.speculative_steps:
        mode, spec, kinds = "FULL_AND_PIECEWISE", 0, ("uniform",)
    engine = engines.for_mode(mode, attention=(name,), spec=spec)
    seqs = prefill(engine, [engines.new_id() for _ in range(6)], [3, 5, 2, 9, 4, 7])
    full = 0
    for requests, started in batches(engines, seqs, kinds, 1 + spec):
        out = engine.step(requests)
        full += out.runtime_mode == "FULL"
        check.same_bits(out.logits, engine.eager_step(requests, out.num_padded_tokens).logits, source=EAGER,
                        case=f"{describe_batch(requests)}; at {out.num_padded_tokens}",
                        what=f"backend {name!r} declares {level}, but its {out.runtime_mode} graph differs from eager")
        for request_id in started:
            engine.release(request_id)
    check.that(full > 0, what=f"backend {name!r} ({level}) ran no batch in a FULL graph under {mode}", source=OBSERVED)


@pytest.mark.parametrize("spec", [0, 1], ids=["q1", "q2"])
def test_resolution_at_build_follows_the_policy(check, engines, spec):
    """One backend, and every pair of backends (a hybrid model takes the weakest)."""
    runtime = engines.runtime
    if spec and not runtime.capabilities.speculative_steps:
        check.skip("it does not declare speculative_steps")
    backends = list(runtime.capabilities.attention_backends)
    models = [(b,) for b in backends] + list(itertools.combinations(backends, 2))
    for model, requested in itertools.product(models, CONFIG_MODES):
        names = tuple(name for name, _ in model)
        want = expected.resolution(runtime, requested, names, spec)
        case = f"mode {requested}, backends {names} (weakest {weakest(level for _, level in model)}), q={1 + spec}"
        if want.value == "error":
            check.rejects(lambda: engines.get(mode=requested, attention=names, spec=spec, fresh=True, capture=False),
                          what="an engine whose mode its attention cannot honour must be rejected at build",
                          source=want.source, case=case)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine = engines.get(mode=requested, attention=names, spec=spec, fresh=True, capture=False)
        if want.value is not None:
            check.equal(engine.resolution.resolved, want.value, what="mode resolved at build time", source=want.source,
                        case=case)
        if engine.resolution.resolved != requested:
            check.that(bool(engine.resolution.warnings) and bool(caught), case=case, source=OBSERVED,
                       what="a downgrade at build time must warn (in the resolution and as a Python warning)",
                       resolution=engine.resolution, warnings=[str(w.message) for w in caught])
