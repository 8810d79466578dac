"""Capture sizes (SPEC 3): vLLM's default grid, its appends, speculative decoding, user sizes.

Expected numbers are the SPEC's, written here literally; property tests compare with the
independent oracle in `harness.oracle`.
"""
import pytest
from hypothesis import given

from harness import oracle
from harness.compare import expect, expect_equal, expect_error
from harness.protocol import PolicyConfig
from harness.strategies import policy_configs

INVARIANT = "capture sizes"

# (config, expected count, expected max) from SPEC 3.
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
    ("q2-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=1), 50, 512),
    ("q3-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2), 56, 504),
    ("q4-full", PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=3), 49, 512),
]


@pytest.mark.requires("capture_sizes", "vllm_policy")
@pytest.mark.parametrize("config,count,largest", [c[1:] for c in SPEC_COUNTS], ids=[c[0] for c in SPEC_COUNTS])
def test_spec_counts(runtime, config, count, largest):
    sizes = list(runtime.capture_sizes(config))
    expect_equal(len(sizes), count, invariant=INVARIANT, runtime=runtime, what="number of capture sizes", case=config)
    expect_equal(sizes[-1], largest, invariant=INVARIANT, runtime=runtime, what="max capture size", case=config)


@pytest.mark.requires("capture_sizes", "vllm_policy")
@pytest.mark.parametrize("config,expected", [
    (PolicyConfig(max_num_seqs=8), [1, 2, 4, 8, 16]),
    (PolicyConfig(max_num_seqs=3), [1, 2, 3, 4]),  # cap 6: grid [1, 2, 4], then 3 off-grid
    (PolicyConfig(max_num_seqs=64, max_num_batched_tokens=100),
     [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]),
    (PolicyConfig(max_num_seqs=8, capture_sizes=(8, 4, 4, 1, 9000)), [1, 4, 8]),
    (PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 3, 5), num_speculative_tokens=1), [2, 4]),  # 6 is above the max (5): dropped
    (PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 3, 5), num_speculative_tokens=1, mode="PIECEWISE"), [1, 2, 3, 5]),
    # Every given size above max_num_batched_tokens: nothing is captured, every batch runs eager.
    (PolicyConfig(max_num_seqs=8, max_num_batched_tokens=16, capture_sizes=(32, 64)), []),
], ids=["seqs8", "seqs3", "tokens100", "user-dedup-filter", "user-q2-rounded", "user-q2-piecewise-unrounded",
    "no-user-size-fits"])
def test_spec_examples(runtime, config, expected):
    expect_equal(list(runtime.capture_sizes(config)), expected, invariant=INVARIANT, runtime=runtime,
                 what="capture sizes", case=config)


@pytest.mark.requires("capture_sizes", "vllm_policy")
@pytest.mark.parametrize("user_max,largest", [(257, 256), (256, 256), (250, 248), (3, 2), (1, 1)])
def test_user_max_is_truncated_to_the_grid(runtime, user_max, largest):
    config = PolicyConfig(max_num_seqs=256, max_capture_size=user_max)
    sizes = list(runtime.capture_sizes(config))
    expect_equal(sizes[-1], largest, invariant=INVARIANT, runtime=runtime, what="truncated max capture size",
                 case=config)


@pytest.mark.requires("capture_sizes", "vllm_policy")
@pytest.mark.parametrize("config,mentions", [
    (PolicyConfig(max_num_seqs=8, capture_sizes=()), ("capture_sizes",)),
    (PolicyConfig(max_num_seqs=8, capture_sizes=(1, 2, 8), max_capture_size=4), ("capture_size",)),
    (PolicyConfig(max_num_seqs=64, max_num_batched_tokens=32), ("max_num_batched_tokens", "max_num_seqs")),
    (PolicyConfig(max_num_seqs=4, capture_sizes=(1, 2), num_speculative_tokens=3), ()),
], ids=["empty-user-sizes", "user-max-inconsistent", "tokens-below-seqs", "no-size-holds-q"])
def test_bad_configs_are_rejected(runtime, config, mentions):
    expect_error(lambda: runtime.capture_sizes(config), invariant=INVARIANT, runtime=runtime,
                 what="an impossible config must be rejected", case=config, mentions=mentions)


def _sizes_or_error(call):
    try:
        return list(call())
    except ValueError:
        return "error"


@pytest.mark.requires("capture_sizes", "vllm_policy")
@given(config=policy_configs())
def test_sizes_match_the_oracle(runtime, config):
    expected = _sizes_or_error(lambda: oracle.capture_sizes(config))
    actual = _sizes_or_error(lambda: runtime.capture_sizes(config))
    expect_equal(actual, expected, invariant=INVARIANT, runtime=runtime, what="capture sizes (oracle)", case=config)


@pytest.mark.requires("capture_sizes")
@given(config=policy_configs())
def test_sizes_are_sorted_unique_positive_and_fit_the_token_budget(runtime, config):
    sizes = _sizes_or_error(lambda: runtime.capture_sizes(config))
    if sizes == "error":
        return
    budget = oracle.batched_tokens(config)
    expect(config.mode != "NONE" or not sizes, invariant=INVARIANT, runtime=runtime, case=config,
           what="mode NONE captures nothing, so it has no sizes", sizes=sizes)
    expect(sizes == sorted(set(sizes)), invariant=INVARIANT, runtime=runtime, what="sorted and unique",
           case=config, sizes=sizes)
    expect(all(isinstance(s, int) and 1 <= s <= budget for s in sizes), invariant=INVARIANT, runtime=runtime,
           what=f"every size in 1..max_num_batched_tokens ({budget})", case=config, sizes=sizes)


@pytest.mark.requires("capture_sizes", "vllm_policy", "speculative")
@given(config=policy_configs(modes=("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")))
def test_full_decode_sizes_hold_whole_requests(runtime, config):
    sizes = _sizes_or_error(lambda: runtime.capture_sizes(config))
    if sizes == "error":
        return
    q = config.query_len
    expect(all(s % q == 0 for s in sizes), invariant=INVARIANT, runtime=runtime,
           what=f"with FULL decode graphs every size is a multiple of q={q}", case=config, sizes=sizes)
