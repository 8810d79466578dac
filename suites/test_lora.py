"""LoRA steps (docs/spec.md section 4, LoRA): an engine that executes adapters keys its graphs by
the number of adapters a batch has active, as its own declared policy says; it has a graph for
every key it dispatches to; a graph step with the adapter active for some rows and not for others
equals an eager step at the same shape bit for bit; and the adapter changes its own rows' outputs
and no other row's.

The engines load the harness's LoRA adapters (harness/expectations/lora_adapters.py: PEFT's
layout, random and seeded, B drawn nonzero), adapter ids 1 and 2 (max_loras = 2, a key per
captured count).

Expected values: the runtime's own dispatch() for the adapter count of each batch (the key the
step reports having run, StepResult.key, is the runtime's word); the graph captures the harness
counted; an eager step of the same runtime at the same padded shape (the same batch, or the same
tokens as new requests naming no adapter); and, for padded rows, the static inputs the engine exposes.
"""
import pytest

from harness.graphs.log import LOG
from harness.protocol import Request
from harness.scenarios.batches import describe_batch
from harness.vocabulary import EAGER, OBSERVED, OWN_POLICY

INVARIANT = "LoRA steps"
pytestmark = pytest.mark.requires("execution", "lora", "lora_steps")
MAX_LORAS = 2
MODES = ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"]
# The adapter of each live request: some rows with adapter 1, some with 2, some with none.
ADAPTERS = [1, None, 2, None, 1, None]
LENGTHS = [5, 3, 7, 4, 6, 2]
NO_ADAPTER = ("an eager step of the same runtime at the same padded shape: the same tokens as new requests "
              "naming no adapter")


def lora_dtypes(engines) -> tuple[str, ...] | None:
    """The only dtypes the runtime declares it runs adapters in (Capabilities.declarations), or None."""
    declared = engines.runtime.capabilities.declarations.get("lora_dtypes")
    return tuple(declared) if declared else None


def lora_engine(engines, mode, **kw):
    """An engine with the harness's adapters, in the suites' dtype, or the first the runtime declares
    it runs adapters in where the suites' is not one."""
    declared = lora_dtypes(engines)
    dtype = declared[0] if declared and engines.dtype not in declared else None
    return engines.for_mode(mode, max_loras=MAX_LORAS, specialize_active_loras=True, dtype=dtype, **kw)


def test_a_lora_build_outside_its_declared_dtypes_is_refused(check, engines):
    """A runtime that declares lora_dtypes refuses (ValueError, before building) an engine with
    adapters in any other dtype, rather than failing inside its kernels at capture."""
    declared = lora_dtypes(engines)
    if not declared:
        check.skip("declares no lora_dtypes: it runs adapters in whatever dtype it is built in")
    other = next(d for d in ("float32", "bfloat16", "float16") if d not in declared)
    try:  # a fresh engine: the factory closes it after the test
        engines.get(fresh=True, capture=False, mode="FULL_DECODE_ONLY", max_loras=MAX_LORAS,
                    specialize_active_loras=True, dtype=other)
    except ValueError:
        return
    check.that(False, source="the runtime's declared lora_dtypes (Capabilities.declarations)",
               what=f"it built an engine with LoRA adapters in {other}, which its declared lora_dtypes {declared} "
                    "leave out", declared=declared, dtype=other)


def live(engines, engine, adapters=ADAPTERS):
    """Requests prefilled with their adapters: [(request id, tokens so far, adapter)]."""
    ids = [engines.new_id() for _ in adapters]
    requests = [Request(i, tuple((7 * i + j) % 200 + 1 for j in range(n)), 0, lora=a)
                for i, n, a in zip(ids, LENGTHS, adapters)]
    engine.step(requests)
    return [[r.request_id, list(r.token_ids), r.lora] for r in requests]


def decode(seqs, with_adapters: bool = True) -> list[Request]:
    """One decode step for each sequence (its next token), with its adapter or none."""
    return [Request(i, ((tokens[-1] * 5 + 3) % 200 + 1,), len(tokens), lora=lora if with_adapters else None)
            for i, tokens, lora in seqs]


def advance(seqs, requests) -> None:
    for seq, request in zip(seqs, requests):
        seq[1] += list(request.token_ids)


def adapters_of(requests) -> str:
    return "adapters by row " + str([r.lora for r in requests])


def release(engine, seqs) -> None:
    for request_id, _, _ in seqs:
        engine.release(request_id)


@pytest.mark.parametrize("mode", MODES)
def test_dispatch_follows_the_active_adapter_count(check, runtime, engines, mode):
    """Batches with 0, 1 and 2 distinct adapters: the key each step ran (its word) has the adapter
    count the runtime's own dispatch() gives for the batch."""
    engine = lora_engine(engines, mode)
    for adapters in ([None, None, None, None], [1, None, 1, None], [1, 2, None, 2]):
        seqs = live(engines, engine, adapters)
        requests = decode(seqs)
        result = engine.step(requests)
        active = len({a for a in adapters if a is not None})
        own = runtime.dispatch(engine.policy, len(requests), len(requests), True, num_active_loras=active)
        case = f"{describe_batch(requests)}, {adapters_of(requests)}; ran {result.runtime_mode} at {result.num_padded_tokens}"
        check.that(getattr(result, "key", None) is not None, source=OBSERVED, case=case,
                   what="a runtime that declares lora_steps says which key each step ran (StepResult.key): none was given")
        if result.key is not None and result.runtime_mode != "NONE":
            check.equal((result.key.has_lora, result.key.num_active_loras),
                        (own.descriptor.has_lora, own.descriptor.num_active_loras), source=OWN_POLICY, case=case,
                        what=f"the key's (has_lora, num_active_loras) for a batch with {active} active adapters vs "
                             "the runtime's own dispatch()")
        release(engine, seqs)


def test_a_graph_for_every_adapter_key(check, runtime, engines):
    """FULL_DECODE_ONLY: the graphs the harness saw captured are at least the distinct FULL keys the
    runtime's own dispatch() names for uniform decode batches at its sizes with 0..max_loras adapters;
    and a batch of each adapter count runs one graph launch."""
    engine = lora_engine(engines, "FULL_DECODE_ONLY")  # the shared one: what the harness saw at its capture is kept
    policy = engine.policy
    keys = set()
    for size in runtime.capture_sizes(policy):
        if size <= policy.max_num_seqs:
            for active in range(MAX_LORAS + 1):
                got = runtime.dispatch(policy, size, size, True, num_active_loras=active)
                if got.runtime_mode == "FULL":
                    keys.add(got.descriptor)
    check.that(engine.seen_at_capture.captures >= len(keys), source=OWN_POLICY,
               what=f"graphs captured ({engine.seen_at_capture.captures}, counted by the harness) vs the FULL keys "
                    f"the runtime's own dispatch() names with 0..{MAX_LORAS} active adapters ({len(keys)}): a graph "
                    "per key", keys=sorted(keys, key=lambda k: (k.num_padded_tokens, k.num_active_loras)))
    for adapters in ([None, None], [1, None], [1, 2]):
        seqs = live(engines, engine, adapters)
        before = LOG.snapshot()
        result = engine.step(decode(seqs))
        check.equal((result.runtime_mode, LOG.since(before).replays), ("FULL", 1), source=OBSERVED,
                    case=adapters_of(decode(seqs)), what="a decode batch with adapters replays one FULL graph")
        release(engine, seqs)


@pytest.mark.parametrize("mode", MODES)
def test_graph_equals_eager_with_adapters_on_some_rows(check, engines, mode):
    """Decode batches of 1 to 6 rows, the adapters active on some rows and not on others: the graph
    step equals an eager step at the same padded shape, bit for bit."""
    engine = lora_engine(engines, mode)
    seqs = live(engines, engine)
    ran = set()
    for rows in range(len(seqs), 0, -1):
        requests = decode(seqs[:rows])
        graph = engine.step(requests)
        eager = engine.eager_step(requests, graph.num_padded_tokens)
        ran.add(graph.runtime_mode)
        check.same_bits(graph.logits, eager.logits, what="graph step vs eager at the same padded shape, adapters active "
                        "on some rows", source=EAGER,
                        case=f"{describe_batch(requests)}, {adapters_of(requests)}; ran {graph.runtime_mode} at "
                             f"{graph.num_padded_tokens}")
        advance(seqs[:rows], requests)
    check.that(ran - {"NONE"}, what=f"mode {mode} ran no LoRA batch in a graph", ran=sorted(ran))
    release(engine, seqs)


@pytest.mark.parametrize("mode", MODES)
def test_the_adapter_changes_its_own_rows_alone(check, engines, mode):
    """The same decode batch run eagerly at its served padded shape with its adapters, and as twins:
    new requests with the same tokens and no adapter, prefilled and decoded the same way (an engine
    keeps a request's adapter for the request's life, as vLLM's LoRARequest is, so a live request is
    never asked to drop it). Eager both, so that only the adapters differ; the graph step is held to
    the eager one by test_graph_equals_eager_with_adapters_on_some_rows. A row whose request names an
    adapter differs from its twin; a row whose request names none is its twin's bits."""
    engine = lora_engine(engines, mode)
    seqs = live(engines, engine)
    requests = decode(seqs)
    served = engine.step(requests)
    adapted = engine.eager_step(requests, served.num_padded_tokens)
    release(engine, seqs)
    twins = [[engines.new_id(), list(tokens), None] for _, tokens, _ in seqs]
    engine.step([Request(i, tuple(tokens), 0) for i, tokens, _ in twins])  # the same prefill, no adapter
    without = engine.eager_step(decode(twins), served.num_padded_tokens)
    case = f"{describe_batch(requests)}, {adapters_of(requests)}; eager at {served.num_padded_tokens}"
    scale = float(without.logits.abs().max())
    for row, request in enumerate(requests):
        difference = float((adapted.logits[row] - without.logits[row]).abs().max())
        if request.lora is None:
            check.same_bits(adapted.logits[row], without.logits[row], source=NO_ADAPTER, case=case,
                            what=f"row {row} names no adapter: the step with adapters on other rows left it as it was")
        else:
            check.that(difference > 1e-3 * scale, source=NO_ADAPTER, case=case,
                       what=f"row {row} names adapter {request.lora}: its logits must differ from the same row without "
                            f"an adapter (largest difference {difference:.3g}, logits up to {scale:.3g})")
    release(engine, twins)


@pytest.mark.requires("input_inspection")
@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "PIECEWISE"])
def test_padded_rows_carry_no_adapter(check, engines, mode):
    """A padded graph step's static inputs: each real token row holds its request's adapter id, and
    every padded row holds none (0)."""
    engine = lora_engine(engines, mode)
    seqs = live(engines, engine, [2, 1, None])  # 3 rows: padded to 4 on every grid of powers of two
    requests = decode(seqs)
    result = engine.step(requests)
    inputs = engine.last_step_inputs()
    case = f"{describe_batch(requests)}, {adapters_of(requests)}; ran {result.runtime_mode} at {result.num_padded_tokens}"
    lora_ids = getattr(inputs, "lora_ids", None)
    if lora_ids is None:
        why = dict(inputs.not_exposed or {}).get("lora_ids", "no reason given in not_exposed")
        check.skip(f"exposes no adapter per token row in last_step_inputs() (lora_ids: {why})")
    got = [int(x) for x in lora_ids]
    want = [r.lora or 0 for r in requests] + [0] * (result.num_padded_tokens - len(requests))
    check.equal(got, want, source=OBSERVED, case=case,
                what="each token row's adapter id in the step's static inputs (real rows: their request's; "
                     "padded rows: 0, no adapter)")
    check.that(result.num_padded_tokens > len(requests) or result.runtime_mode == "NONE", source=OBSERVED, case=case,
               what="the batch was meant to be padded")
    release(engine, seqs)
