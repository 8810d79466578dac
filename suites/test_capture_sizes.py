"""Capture sizes (docs/spec.md section 3; vLLM's two model runners in docs/runners.md).

- vLLM conformance (`vllm_rules`): the spec's counts and examples, written here literally, and
  every drawn config against the harness's independent oracle. Where vLLM's V1 and V2 model
  runners differ (q > 1 with FULL decode graphs) each case names the runner it holds an engine
  to; the others hold for both. A runtime declaring vLLM 0.25's rules (Capabilities.rules)
  is asked in its release and runner and held to the spec's 0.25 values where they differ
  (docs/spec.md section 11, `*_0_25` below; "0.25/v1": its V1 runner's).
- Any runtime with a bucket policy (`capture_sizes`): sizes are sorted, unique, positive and fit
  the token budget; mode NONE has none; an ordinary config is answered, not rejected.
"""
import pytest
from hypothesis import assume, given

from harness.expectations import oracle
from harness.expectations.expected import by_release, vllm_rules
from harness.protocol import PolicyConfig
from harness.scenarios.strategies import plain_configs, policy_configs
from harness.vocabulary import ORACLE, OWN_POLICY, SPEC

INVARIANT = "capture sizes"

# (id, config, expected count, expected max) from spec section 3.
SPEC_COUNTS = [
    ("cap32", PolicyConfig(max_num_seqs=16), 7, 32),
    ("cap64", PolicyConfig(max_num_seqs=32), 11, 64),
    ("cap128", PolicyConfig(max_num_seqs=64), 19, 128),
    ("cap256", PolicyConfig(max_num_seqs=128), 35, 256),
    ("cap512", PolicyConfig(max_num_seqs=256), 51, 512),
    ("cap1024", PolicyConfig(max_num_seqs=1024, platform_max=1024), 83, 1024),
    ("seqs264-offgrid", PolicyConfig(max_num_seqs=264), 52, 512),
    ("seqs100-offgrid", PolicyConfig(max_num_seqs=100), 29, 200),
    ("seqs1024-D512", PolicyConfig(max_num_seqs=1024), 51, 512),
    ("D1024-seqs264", PolicyConfig(max_num_seqs=264, platform_max=1024, max_num_batched_tokens=2048), 53, 528),
    ("D1024-seqs300", PolicyConfig(max_num_seqs=300, platform_max=1024, max_num_batched_tokens=2048), 57, 592),
    # vLLM's V1 model runner rounds sizes to multiples of q under FULL decode graphs.
    ("v1-q2-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=1, rules="vllm-0.33/v1"), 50, 512),
    ("v1-q3-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2, rules="vllm-0.33/v1"), 56, 504),
    ("v1-q4-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=3, rules="vllm-0.33/v1"), 49, 512),
    # vLLM's V2 model runner keeps the sizes unrounded (it rounds its decode keys instead:
    # test_dispatch.py); counts from V2's own code (vllm 0.33.0, CudaGraphManager).
    ("v2-q2-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=1, rules="vllm-0.33/v2"), 51, 512),
    ("v2-q3-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2, rules="vllm-0.33/v2"), 60, 512),
    ("v2-q4-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=3, rules="vllm-0.33/v2"), 51, 512),
]


# vLLM 0.25 (docs/spec.md section 11): no decode sizes appended, and a cap of 512 on any device.
SPEC_COUNTS_0_25 = {"seqs264-offgrid": (51, 512), "seqs100-offgrid": (28, 200), "cap1024": (51, 512),
                    "D1024-seqs264": (51, 512), "D1024-seqs300": (51, 512), "v2-q3-full": (51, 512),
                    # V1 rounds 0.25's grid alone to multiples of q: 1 and 2 become 3, 512 becomes 513, over the cap.
                    "0.25/v1": {"v1-q3-full": (49, 498)}}


@pytest.mark.requires("capture_sizes", "vllm_rules")
@pytest.mark.parametrize("case,config,count,largest", SPEC_COUNTS, ids=[c[0] for c in SPEC_COUNTS])
def test_spec_counts(check, runtime, case, config, count, largest):
    config = vllm_rules(runtime, config)
    count, largest = by_release(runtime, (count, largest), {"0.25": SPEC_COUNTS_0_25.get(case),
                                                            "0.25/v1": SPEC_COUNTS_0_25["0.25/v1"].get(case)}, config)
    sizes = runtime.capture_sizes(config)
    check.equal(len(sizes), count, what="number of capture sizes", source=SPEC, case=config)
    check.equal(sizes[-1], largest, what="max capture size", source=SPEC, case=config)


# (id, config, expected sizes) from spec section 3.
SPEC_EXAMPLES = [
    ("seqs8", PolicyConfig(max_num_seqs=8), [1, 2, 4, 8, 16]),
    ("seqs3", PolicyConfig(max_num_seqs=3), [1, 2, 3, 4]),  # cap 6: grid [1, 2, 4], then 3 off-grid
    ("tokens100", PolicyConfig(max_num_seqs=64, max_num_batched_tokens=100),
     [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]),
    ("user-dedup-filter", PolicyConfig(max_num_seqs=8, capture_sizes=(8, 4, 4, 1, 9000)), [1, 4, 8]),
    ("user-q2-rounded-v1",
     PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 3, 5), num_speculative_tokens=1, rules="vllm-0.33/v1"), [2, 4]),
    ("user-q2-unrounded-v2",
     PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 3, 5), num_speculative_tokens=1, rules="vllm-0.33/v2"), [1, 2, 3, 5]),
    ("user-q2-piecewise-unrounded",
     PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 3, 5), num_speculative_tokens=1, mode="PIECEWISE"), [1, 2, 3, 5]),
    # V2 accepts sizes that hold no whole request of q: they serve mixed batches, decode runs without them.
    ("no-size-holds-q-v2", PolicyConfig(max_num_seqs=4, capture_sizes=(1, 2), num_speculative_tokens=3, rules="vllm-0.33/v2"),
     [1, 2]),
    # Every given size above max_num_batched_tokens: nothing is captured, every batch runs eager.
    ("no-user-size-fits", PolicyConfig(max_num_seqs=8, max_num_batched_tokens=16, capture_sizes=(32, 64)), []),
]
SPEC_EXAMPLES_0_25 = {"seqs3": [1, 2, 4]}  # cap 6, and no off-grid append


@pytest.mark.requires("capture_sizes", "vllm_rules")
@pytest.mark.parametrize("case,config,expected", SPEC_EXAMPLES, ids=[c[0] for c in SPEC_EXAMPLES])
def test_spec_examples(check, runtime, case, config, expected):
    config = vllm_rules(runtime, config)
    expected = by_release(runtime, expected, {"0.25": SPEC_EXAMPLES_0_25.get(case)}, config)
    check.equal(runtime.capture_sizes(config), expected, what="capture sizes", source=SPEC, case=config)


@pytest.mark.requires("capture_sizes", "vllm_rules")
@pytest.mark.parametrize("user_max,largest", [(257, 256), (256, 256), (250, 248), (3, 2), (1, 1)])
def test_user_max_is_truncated_to_the_grid(check, runtime, user_max, largest):
    config = vllm_rules(runtime, PolicyConfig(max_num_seqs=256, max_capture_size=user_max))
    check.equal(runtime.capture_sizes(config)[-1], largest, what="truncated max capture size", source=SPEC, case=config)


@pytest.mark.requires("capture_sizes", "vllm_rules")
@pytest.mark.parametrize("config,mentions", [
    (PolicyConfig(max_num_seqs=8, capture_sizes=()), ("capture_sizes",)),
    (PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 8), max_capture_size=4), ("capture_size",)),
    (PolicyConfig(max_num_seqs=64, max_num_batched_tokens=32), ("max_num_batched_tokens", "max_num_seqs")),
    (PolicyConfig(max_num_seqs=4, capture_sizes=(1, 2), num_speculative_tokens=3, rules="vllm-0.33/v1"), ()),
], ids=["empty-user-sizes", "user-max-inconsistent", "tokens-below-seqs", "no-size-holds-q-v1"])
def test_bad_configs_are_rejected(check, runtime, config, mentions):
    config = vllm_rules(runtime, config)
    check.rejects(lambda: runtime.capture_sizes(config), what="an impossible config must be rejected",
                  source=SPEC, case=config, mentions=mentions)


def _answer(call):
    try:
        return call()
    except ValueError as exc:
        return f"rejected: {exc}"


@pytest.mark.requires("capture_sizes", "vllm_rules")
@given(config=policy_configs())
def test_sizes_match_the_oracle(check, runtime, config):
    """Where the oracle rejects a config the runtime must too, and elsewhere give the same sizes."""
    config = vllm_rules(runtime, config)
    expected = _answer(lambda: oracle.capture_sizes(config))
    actual = _answer(lambda: runtime.capture_sizes(config))
    if isinstance(expected, str):
        check.that(isinstance(actual, str), what="a config the spec rejects must be rejected", source=ORACLE,
                   case=config, expected=expected, actual=actual)
    else:
        check.equal(actual, expected, what="capture sizes", source=ORACLE, case=config)


@pytest.mark.requires("capture_sizes")
@given(config=plain_configs())
def test_sizes_are_sorted_unique_positive_and_fit_the_token_budget(check, runtime, config):
    """Any bucket policy: an ordinary config (no user sizes, batched tokens >= seats) is answered."""
    sizes = _answer(lambda: runtime.capture_sizes(config))
    check.that(not isinstance(sizes, str), what="an ordinary config must be answered, not rejected",
               source=OWN_POLICY, case=config, answer=sizes)
    budget = oracle.batched_tokens(config)
    check.that(config.mode != "NONE" or not sizes, what="mode NONE captures nothing, so it has no sizes",
               case=config, sizes=sizes)
    check.that(sizes == sorted(set(sizes)), what="sizes are sorted and unique", case=config, sizes=sizes)
    check.that(all(1 <= s <= budget for s in sizes), what=f"every size in 1..max_num_batched_tokens ({budget})",
               case=config, sizes=sizes)


@pytest.mark.requires("capture_sizes", "vllm_rules", "speculative")
@pytest.mark.vllm_runner("v1")
@given(config=policy_configs(modes=("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"), runners=("v1",)))
def test_v1_full_decode_sizes_hold_whole_requests(check, runtime, config):
    config = vllm_rules(runtime, config)
    assume(not isinstance(_answer(lambda: oracle.capture_sizes(config)), str))
    sizes = runtime.capture_sizes(config)
    q = config.query_len
    check.that(all(s % q == 0 for s in sizes), what=f"with FULL decode graphs every size is a multiple of q={q}",
               source=SPEC, case=config, sizes=sizes)
