"""Dispatch (docs/spec.md section 4; vLLM's two model runners in docs/runners.md): graph keys and
the FULL > PIECEWISE > NONE choice.

- vLLM conformance (`vllm_rules`): the spec's examples, and every token count of drawn configs
  against the oracle, for every q and vLLM's V1 and V2 model runners; LoRA counts. An example that holds
  for one runner only names it (rules "vllm-0.33/v1" or "/v2"); the V2 values come from V2's own code
  (vllm 0.33.0, CudaGraphManager.dispatch). A runtime declaring vLLM 0.25's rules is asked in its
  release and held to the spec's 0.25 values where they differ (docs/spec.md section 11).
- Any runtime with `dispatch`: the mode is one its config mode can run (a mixed batch never runs
  the decode routine), an eager dispatch is unpadded, a graph dispatch pads up, and where the
  runtime also declares its sizes, a key's num_real_tokens is its own padded_size(), for every batch
  size of drawn configs, every q it declares and both runners; with `lora`, a batch with adapters
  never runs a graph captured without them or for fewer.
"""
import itertools
from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.expectations import expected
from harness.expectations import oracle
from harness.expectations.expected import by_release, vllm_rules
from harness.protocol import Descriptor, Dispatch, PolicyConfig
from harness.scenarios.strategies import LARGE_SWEEP_CONFIGS, QUERY_LENS, RUNNERS, sweep_configs
from harness.vocabulary import CONFIG_MODES, CONTRACT, FAP, FDO, ORACLE, OWN_POLICY, ROUTINES, SPEC, padded

INVARIANT = "dispatch"


def _config(mode, seqs=64, **kw):
    return PolicyConfig(max_num_seqs=seqs, mode=mode, **kw)


# (config, num_real_tokens, num_real_rows, uniform, expected) written from spec section 4.
EXAMPLES = [
    ("fap-uniform-b5", _config(FAP), 5, 5, True, Dispatch("FULL", Descriptor(8, 8, True))),
    ("fap-mixed-b5", _config(FAP), 5, 2, False, Dispatch("PIECEWISE", Descriptor(8, None, False))),
    ("full-uniform-uses-mixed-key", _config("FULL"), 5, 5, True, Dispatch("FULL", Descriptor(8, 8, False))),
    ("full-mixed", _config("FULL"), 100, 3, False, Dispatch("FULL", Descriptor(104, 64, False))),
    ("fdo-uniform", _config(FDO), 17, 17, True, Dispatch("FULL", Descriptor(24, 24, True))),
    ("piecewise-uniform", _config("PIECEWISE"), 17, 17, True, Dispatch("PIECEWISE", Descriptor(24, None, False))),
    ("at-max", _config(FAP), 128, 64, False, Dispatch("PIECEWISE", Descriptor(128, None, False))),
    # max_num_seqs=264 is off the grid and appended: a full 264-request decode pads to 264, not 272.
    ("offgrid-264", _config(FAP, seqs=264), 264, 264, True, Dispatch("FULL", Descriptor(264, 264, True))),
    ("offgrid-263", _config(FAP, seqs=264), 263, 263, True, Dispatch("FULL", Descriptor(264, 264, True))),
    ("offgrid-265", _config(FAP, seqs=264), 265, 100, False, Dispatch("PIECEWISE", Descriptor(272, None, False))),
    # Uniform keys stop at q * max_num_seqs: 5 requests pad to 8 > 1 * 6, which has no decode key.
    ("fap-uniform-above-q-seqs", _config(FAP, seqs=6, capture_sizes=(4, 8)), 5, 5, True,
     Dispatch("PIECEWISE", Descriptor(8, None, False))),
    # An eager step: V1 keys it by its size alone; V2 keeps its request count (and adapter case).
    ("v1-fdo-mixed-eager", _config(FDO, rules="vllm-0.33/v1"), 5, 2, False, Dispatch("NONE", Descriptor(5))),
    ("v1-none", _config("NONE", rules="vllm-0.33/v1"), 5, 5, True, Dispatch("NONE", Descriptor(5))),
    ("v1-above-max-eager-unpadded", _config(FAP, rules="vllm-0.33/v1"), 129, 64, False, Dispatch("NONE", Descriptor(129))),
    ("v2-fdo-mixed-eager", _config(FDO, rules="vllm-0.33/v2"), 5, 2, False, Dispatch("NONE", Descriptor(5, 2))),
    ("v2-none", _config("NONE", rules="vllm-0.33/v2"), 5, 5, True, Dispatch("NONE", Descriptor(5, 5))),
    ("v2-above-max-eager-unpadded", _config(FAP, rules="vllm-0.33/v2"), 129, 64, False, Dispatch("NONE", Descriptor(129, 64))),
    # q > 1: V1 rounds every size to a multiple of q; V2 rounds only its uniform-decode keys, so a
    # mixed batch pads to the unrounded grid (7 -> 8, 30 -> 32) while decode pads alike (30 -> 33).
    ("v1-q2-uniform", _config(FAP, num_speculative_tokens=1, rules="vllm-0.33/v1"), 6, 3, True, Dispatch("FULL", Descriptor(8, 4, True))),
    ("v1-q3-uniform", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v1"), 9, 3, True, Dispatch("FULL", Descriptor(9, 3, True))),
    ("v1-q3-uniform-30", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v1"), 30, 10, True,
     Dispatch("FULL", Descriptor(33, 11, True))),
    ("v1-q3-mixed-7", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v1"), 7, 3, False,
     Dispatch("PIECEWISE", Descriptor(9, None, False))),
    ("v1-q3-mixed-30", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v1"), 30, 10, False,
     Dispatch("PIECEWISE", Descriptor(33, None, False))),
    ("v2-q2-uniform", _config(FAP, num_speculative_tokens=1, rules="vllm-0.33/v2"), 6, 3, True, Dispatch("FULL", Descriptor(8, 4, True))),
    ("v2-q3-uniform", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v2"), 9, 3, True, Dispatch("FULL", Descriptor(9, 3, True))),
    ("v2-q3-uniform-30", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v2"), 30, 10, True,
     Dispatch("FULL", Descriptor(33, 11, True))),
    ("v2-q3-mixed-7", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v2"), 7, 3, False,
     Dispatch("PIECEWISE", Descriptor(8, None, False))),
    ("v2-q3-mixed-30", _config(FAP, num_speculative_tokens=2, rules="vllm-0.33/v2"), 30, 10, False,
     Dispatch("PIECEWISE", Descriptor(32, None, False))),
]


# vLLM 0.25 (docs/spec.md section 11): max_num_seqs=264 is not appended, so a 264-request decode
# finds no FULL graph (272 is above 264 decode tokens) and runs PIECEWISE at 272; and one search over
# both modes' keys takes the smallest that holds a batch: 30 uniform tokens at q = 3 meet PIECEWISE 32
# before FULL 33. The V1 examples hold for 0.25's V1 runner as written: its dispatcher is 0.33's,
# and every size they pad to is on both releases' grids.
EXAMPLES_0_25 = {
    "offgrid-264": Dispatch("PIECEWISE", Descriptor(272, None, False)),
    "offgrid-263": Dispatch("PIECEWISE", Descriptor(272, None, False)),
    "v2-q3-uniform-30": Dispatch("PIECEWISE", Descriptor(32, None, False)),
}


@pytest.mark.requires("dispatch", "vllm_rules")
@pytest.mark.parametrize("case,config,tokens,reqs,uniform,expected", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_spec_examples(check, runtime, case, config, tokens, reqs, uniform, expected):
    config = vllm_rules(runtime, config)
    expected = by_release(runtime, expected, {"0.25": EXAMPLES_0_25.get(case)}, config)
    got = runtime.dispatch(config, tokens, reqs, uniform)
    check.equal(got, expected, source=SPEC, case=config,
                what=f"dispatch of {tokens} tokens, {reqs} requests, {'uniform' if uniform else 'mixed'}")


# One config for every q and runner, its grid capped below q x max_num_seqs by the token budget, so
# its top decode sizes are where rounding to whole requests meets the largest graph.
EVERY_Q_AND_RUNNER = [_config(FAP, 60, max_num_batched_tokens=100, num_speculative_tokens=q - 1, rules=f"vllm-0.33/{r}")
                      for q in QUERY_LENS for r in RUNNERS]


def every_q_and_runner(test):
    """The configs every sweep asks besides the drawn ones: each q and runner near the budget's
    edge, and vLLM's defaults and largest grids (strategies.LARGE_SWEEP_CONFIGS)."""
    for config in EVERY_Q_AND_RUNNER + list(LARGE_SWEEP_CONFIGS):
        test = example(config=config)(test)
    return test


def sweep(runtime, config) -> tuple[list[int], range, list[tuple], list[tuple]] | None:
    """(its sizes, every batch size from 1 to past the largest, the uniform batches and the mixed
    batches it dispatches as (num_real_tokens, num_real_rows)); None where it declares no such q."""
    if config.num_speculative_tokens and not runtime.capabilities.speculative:
        return None
    sizes, q, seqs = runtime.capture_sizes(config), config.query_len, config.max_num_seqs
    counts = range(1, max(sizes, default=8) + q + 2)
    uniform = [(n, n // q) for n in counts if n % q == 0 and n // q <= seqs]
    mixed = [(n, max(1, min(n // 2, seqs))) for n in counts]
    return sizes, counts, uniform, mixed


def holds_whole_requests(config, sizes, num_real_tokens: int, key: int) -> bool:
    """A decode graph of q > 1 tokens a request may be keyed by whole requests instead of a size
    (vLLM's V2 rounds its decode keys up to multiples of q): at least the batch, at most
    max_num_seqs requests, never past the largest size."""
    q = config.query_len
    return q > 1 and key % q == 0 and num_real_tokens <= key <= min(max(sizes), q * config.max_num_seqs)


@pytest.mark.requires("dispatch", "capture_sizes")
@every_q_and_runner
@given(config=sweep_configs())
def test_every_batch_size_pads_and_dispatches_by_its_own_policy(check, runtime, config):
    """Every batch size from 1 to past the largest graph, for each q the runtime declares and each
    runner, as a uniform batch and a mixed one: padded_size() is the smallest of its own sizes that
    holds it; a uniform batch's graph is its padded_size() (or, q > 1, a key of whole requests no
    larger than its largest size); a mixed batch's graph is one of its sizes that holds it; the
    routine is one the config mode has; eager is unpadded. Pure functions: the whole space of a
    config is cheap."""
    config = replace(config, mode=own_resolved(runtime, config.mode) or config.mode)
    try:
        swept = sweep(runtime, config)
    except ValueError:  # only ordinary configs must be answered (test_capture_sizes.py); whether the rest are is
        if config.capture_sizes is None and config.max_capture_size is None and config.query_len == 1:  # its policy's
            raise
        return
    if swept is None:
        return
    sizes, counts, uniform, mixed = swept
    case = f"{config} (sizes {sizes[:6]}{' ...' if len(sizes) > 6 else ''} {sizes[-1:] if len(sizes) > 6 else ''})"
    padded_sizes = {n: runtime.padded_size(config, n) for n in counts}
    check.equal([padded_sizes[n] for n in counts], [padded(sizes, n) for n in counts], source=OWN_POLICY, case=case,
                what=f"padded_size() of every batch 1..{counts[-1]} (index i is batch i+1) vs its own capture_sizes()")
    decode, other = ROUTINES[config.mode]
    for kind, batches, allowed in (("uniform", uniform, {"NONE", decode, other}), ("mixed", mixed, {"NONE", other})):
        got = [(n, reqs, runtime.dispatch(config, n, reqs, kind == "uniform")) for n, reqs in batches]
        bad_mode = [(n, d.runtime_mode) for n, _, d in got if d.runtime_mode not in allowed]
        check.that(not bad_mode, source=CONTRACT, case=case, batches=bad_mode[:5],
                   what=f"{kind} batches under {config.mode} run one of {sorted(allowed)}")
        ran = [(n, d.runtime_mode, d.descriptor.num_padded_tokens) for n, _, d in got]
        if kind == "uniform":  # eager unpadded, a graph at its own padded_size() or, q > 1, whole requests
            want = [(n, m, n if m == "NONE" else t if t == padded_sizes[n] or holds_whole_requests(config, sizes, n, t)
                     else padded_sizes[n]) for n, m, t in ran]
        else:  # eager unpadded, a graph at one of its sizes that holds the batch (else: the smallest)
            want = [(n, m, n if m == "NONE" else t if t in sizes and t >= n else padded(sizes, n)) for n, m, t in ran]
        check.equal(ran, want, source=OWN_POLICY, case=case,
                    what=f"(num_real_tokens, mode, padded) of every {kind} batch 1..{counts[-1]}")


@pytest.mark.requires("dispatch", "capture_sizes", "vllm_rules")
@every_q_and_runner
@given(config=sweep_configs())
def test_every_batch_size_matches_the_oracle(check, runtime, config):
    """The same sweep against the harness's oracle: its sizes, and the dispatch of every uniform and
    mixed batch from 1 to past the largest graph, by the rules of the vLLM release it declares."""
    config = vllm_rules(runtime, config)
    try:
        expected_sizes = oracle.capture_sizes(config)
    except ValueError as exc:
        check.rejects(lambda: runtime.capture_sizes(config), source=ORACLE, case=config,
                      what=f"a config the spec rejects must be rejected ({exc})")
        return
    swept = sweep(runtime, config)
    if swept is None:
        return
    sizes, counts, uniform, mixed = swept
    check.equal(sizes, expected_sizes, source=ORACLE, case=config, what="capture sizes")
    for kind, batches in (("uniform", uniform), ("mixed", mixed)):
        got = [(n, reqs, runtime.dispatch(config, n, reqs, kind == "uniform")) for n, reqs in batches]
        check.equal(got, [(n, reqs, oracle.dispatch(config, n, reqs, kind == "uniform")) for n, reqs in batches],
                    source=ORACLE, case=config, what=f"dispatch of every {kind} batch 1..{counts[-1]} "
                                                     "as (num_real_tokens, num_real_rows, dispatch)")


def own_resolved(runtime, mode: str) -> str | None:
    """The mode dispatch() is asked about: for a policy of its own that resolves modes, where it
    resolves `mode` over its first attention backend (None: it rejects it), since an engine never
    dispatches under a mode it does not run (a PIECEWISE-only engine has no FULL); under vLLM's
    policy, or without a resolution to ask, the mode as given."""
    caps = runtime.capabilities
    if caps.has("vllm_rules") or not (caps.mode_resolution and caps.attention_backends):
        return mode
    want = expected.resolution(runtime, mode, (caps.attention_backends[0][0],), 0)
    return None if want.value == "error" else want.value


def modes_asked(runtime) -> list[str]:
    """Every config mode, each as dispatch() is asked about it (own_resolved), once. A property
    test asks all of them about each drawn batch: a bug in one mode's routine is not left to a
    one-in-five draw of the mode."""
    return [mode for mode in dict.fromkeys(own_resolved(runtime, m) for m in CONFIG_MODES) if mode]


@pytest.mark.requires("dispatch")
@given(seqs=st.integers(1, 300), data=st.data())
def test_runtime_mode_is_one_the_config_mode_can_run(check, runtime, seqs, data):
    """A uniform batch may run the decode or the mixed routine (or eager); any other batch only
    the mixed routine (or eager). Eager is unpadded; a graph pads up, never down. The drawn token
    count is asked as a mixed batch and, where it fits, as a uniform decode batch too."""
    modes = modes_asked(runtime)
    if not modes:
        check.skip("its own resolution rejects every config mode: it dispatches under none")
    tokens = data.draw(st.integers(1, 3 * seqs + 8), label="num_real_tokens")
    reqs = data.draw(st.integers(1, min(tokens, seqs)), label="num_real_rows")
    batches = [(reqs, False)] + ([(tokens, True)] if tokens <= seqs else [])
    for mode, (num_real_rows, uniform) in itertools.product(modes, batches):
        config = _config(mode, seqs)
        got = runtime.dispatch(config, tokens, num_real_rows, uniform)
        decode, mixed = ROUTINES[mode]
        allowed = {"NONE", mixed} | ({decode} if uniform else set())
        kind = f"a {'uniform' if uniform else 'mixed'} batch of {tokens} tokens, {num_real_rows} requests"
        check.that(got.runtime_mode in allowed, what=f"{kind} under {mode} runs one of {sorted(allowed)}",
                   source=CONTRACT, case=config, got=got)
        if got.runtime_mode == "NONE":
            check.equal(got.descriptor.num_padded_tokens, tokens, what=f"an eager step is not padded ({kind})", source=CONTRACT,
                        case=config)
        else:
            check.that(got.descriptor.num_padded_tokens >= tokens, what=f"a graph step is padded up, never down ({kind})",
                       source=CONTRACT, case=config, got=got)


@pytest.mark.requires("dispatch", "capture_sizes")
@given(seqs=st.integers(1, 300), data=st.data())
def test_a_decode_graph_key_is_the_runtimes_own_padded_size(check, runtime, seqs, data):
    """padded_size() answers for a decode step, so only uniform batches are held to it: an engine
    may pad a mixed (prefill) batch by other buckets, as SGLang pads by token count."""
    tokens = data.draw(st.integers(1, seqs), label="num_real_tokens")
    for mode in CONFIG_MODES:
        config = _config(mode, seqs)
        got = runtime.dispatch(config, tokens, tokens, True)
        if got.runtime_mode != "NONE":
            check.equal(got.descriptor.num_padded_tokens, runtime.padded_size(config, tokens), source=OWN_POLICY, case=config,
                        what=f"the key of a {got.runtime_mode} dispatch of a uniform decode batch of {tokens} vs padded_size()")


@pytest.mark.requires("dispatch", "vllm_rules")
@given(seqs=st.integers(1, 300), data=st.data())
def test_piecewise_keys_are_relaxed(check, runtime, seqs, data):
    """vLLM's PIECEWISE graphs serve any request count and batch kind: num_real_rows None, not uniform."""
    tokens = data.draw(st.integers(1, 2 * seqs + 8), label="num_real_tokens")
    reqs = data.draw(st.integers(1, min(tokens, seqs)), label="num_real_rows")
    for mode in CONFIG_MODES:
        config = _config(mode, seqs)
        got = runtime.dispatch(config, tokens, reqs, False)
        if got.runtime_mode == "PIECEWISE":
            check.that(got.descriptor.num_padded_rows is None and not got.descriptor.uniform, source=SPEC, case=config,
                       what="PIECEWISE keys are relaxed (num_real_rows None, not uniform)", got=got)


# LoRA (spec section 4): counts are powers of two up to max_loras plus max_loras + 1.
LORA = [
    ("spec-3-of-4", dict(max_loras=4, specialize_active_loras=True), 3, 4),
    ("spec-1-of-4", dict(max_loras=4, specialize_active_loras=True), 1, 1),
    ("spec-4-of-4", dict(max_loras=4, specialize_active_loras=True), 4, 4),
    ("spec-5-of-6", dict(max_loras=6, specialize_active_loras=True), 5, 7),
    ("unspec-2-of-4", dict(max_loras=4, specialize_active_loras=False), 2, 5),
    ("no-lora-specialisation", dict(max_loras=4, specialize_lora=False), 1, 5),
]


@pytest.mark.requires("dispatch", "lora", "vllm_rules")
@pytest.mark.parametrize("options,active,captured", [c[1:] for c in LORA], ids=[c[0] for c in LORA])
def test_lora_counts_round_up_to_a_captured_case(check, runtime, options, active, captured):
    config = vllm_rules(runtime, _config(FAP, **options))
    got = runtime.dispatch(config, 5, 5, True, num_active_loras=active)
    check.equal(got, Dispatch("FULL", Descriptor(8, 8, True, True, captured)), source=SPEC, case=config,
                what=f"dispatch of a decode batch with {active} active adapters")


LORA_OPTIONS = [("per-count", dict(max_loras=4, specialize_active_loras=True)),
                ("one-lora-case", dict(max_loras=4)), ("no-lora-specialisation", dict(max_loras=3, specialize_lora=False))]


@pytest.mark.requires("dispatch", "lora")
@pytest.mark.parametrize("mode", ["FULL", FAP])
@pytest.mark.parametrize("options", [o for _, o in LORA_OPTIONS], ids=[name for name, _ in LORA_OPTIONS])
def test_a_batch_with_adapters_runs_eager_or_in_a_graph_that_holds_them(check, runtime, mode, options):
    """Any policy: a graph captured without LoRA kernels, or for fewer adapters than the batch has
    active, would leave adapters out. So a batch with k active adapters runs eager, or in a graph
    whose key says LoRA (has_lora) for at least k (num_active_loras >= k)."""
    config = _config(mode, seqs=8, max_num_batched_tokens=64, **options)
    for tokens in range(1, 65):
        for reqs, uniform in ((tokens, True), (min(8, max(1, tokens // 3)), False)):
            if uniform and tokens > 8:
                continue
            for active in range(1, options["max_loras"] + 1):
                got = runtime.dispatch(config, tokens, reqs, uniform, num_active_loras=active)
                key = got.descriptor
                check.that(got.runtime_mode == "NONE" or (key.has_lora and key.num_active_loras >= active),
                           source=OWN_POLICY, case=f"{config}; {tokens} tokens, {reqs} requests, uniform={uniform}",
                           what=f"a batch with {active} active adapters runs in a graph without LoRA or for fewer "
                                "adapters (it would leave adapters out)", dispatch=got)


@pytest.mark.requires("dispatch", "lora", "vllm_rules")
@pytest.mark.vllm_runner("v1")
def test_v1_without_specialisation_a_batch_without_lora_has_no_graph(check, runtime):
    """V1 captures only max_loras + 1, so a batch with no adapter finds no key and runs eager."""
    config = _config(FAP, max_loras=2, specialize_lora=False, rules="vllm-0.33/v1")
    got = runtime.dispatch(config, 5, 5, True, num_active_loras=0)
    check.equal(got.runtime_mode, "NONE", source=SPEC, case=config,
                what="dispatch of a no-LoRA batch when only LoRA graphs exist")


@pytest.mark.requires("dispatch", "lora", "vllm_rules")
@pytest.mark.vllm_runner("v2")
def test_v2_without_specialisation_a_batch_without_lora_keeps_its_graph(check, runtime):
    """V2 captures the no-LoRA case beside max_loras + 1 (lora_utils.get_lora_capture_cases)."""
    config = vllm_rules(runtime, _config(FAP, max_loras=2, specialize_lora=False, rules="vllm-0.33/v2"))
    got = runtime.dispatch(config, 5, 5, True, num_active_loras=0)
    check.equal(got, Dispatch("FULL", Descriptor(8, 8, True)), source=SPEC, case=config,
                what="dispatch of a no-LoRA batch under V2 without LoRA specialisation")
