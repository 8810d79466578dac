"""Padding (docs/spec.md section 4): a batch runs at the smallest capture size that holds it;
above the largest it runs eager and unpadded; at a size nothing is padded.

These hold for any runtime with a bucket policy: the expected padded sizes come from the
runtime's own declared sizes. Only the waste examples need vLLM's grid.
"""
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.expectations.expected import vllm_rules
from harness.protocol import PolicyConfig
from harness.reports.records import Grid
from harness.scenarios.strategies import plain_configs
from harness.vocabulary import FDO, OWN_POLICY, SPEC, padded

INVARIANT = "padding"

CONFIGS = [
    PolicyConfig(max_num_seqs=1),
    PolicyConfig(max_num_seqs=8),
    PolicyConfig(max_num_seqs=64),
    PolicyConfig(max_num_seqs=100),
    PolicyConfig(max_num_seqs=256),
    PolicyConfig(max_num_seqs=264),
    PolicyConfig(max_num_seqs=1024, platform_max=1024),
    PolicyConfig(max_num_seqs=64, max_num_batched_tokens=100),
    PolicyConfig(max_num_seqs=16, capture_sizes=(3, 7, 30)),
]
IDS = ["seqs1", "seqs8", "seqs64", "seqs100", "seqs256", "seqs264", "D1024", "tokens100", "user-sizes"]


def sizes_of(check, runtime, config) -> tuple[PolicyConfig, list[int]]:
    """(config, the runtime's sizes for it), in the first graph mode that has sizes: a policy with
    graphs only under FULL_DECODE_ONLY, say, has none under the default FULL_AND_PIECEWISE, and
    an empty grid would check nothing. Only ordinary configs must be answered: a policy of its own
    may reject user-given sizes (the test then skips); under vllm_rules they are vLLM's."""
    try:
        for mode in (config.mode, "FULL", FDO, "PIECEWISE"):
            sizes = runtime.capture_sizes(replace(config, mode=mode))
            if sizes:
                return replace(config, mode=mode), sizes
    except ValueError as exc:
        if config.capture_sizes is None or runtime.capabilities.has("vllm_rules"):
            raise
        check.skip(f"it rejects user-given capture sizes {config.capture_sizes}, as a policy of its own may: {exc}")
    check.skip(f"no graph mode has capture sizes for {config}")


@pytest.mark.requires("capture_sizes")
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_batch_pads_to_the_smallest_size_that_holds_it(check, runtime, config):
    config, sizes = sizes_of(check, runtime, config)
    top = max(sizes)
    actual = [runtime.padded_size(config, n) for n in range(1, top + 1)]
    expected = [padded(sizes, n) for n in range(1, top + 1)]
    check.equal(actual, expected, what="padded size for every batch 1..max (index i is batch i+1)",
                source=OWN_POLICY, case=config)


@pytest.mark.requires("capture_sizes")
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_above_the_max_runs_eager_and_at_the_max_pads_nothing(check, runtime, config):
    config, sizes = sizes_of(check, runtime, config)
    largest = max(sizes)
    cases = [(largest, largest), (largest + 1, None), (largest + 17, None), (4 * largest + 3, None)]
    for batch, expected in cases:
        check.equal(runtime.padded_size(config, batch), expected, source=OWN_POLICY, case=config,
                    what=f"padded size of batch {batch} (max capture size {largest}; None = eager)")


@pytest.mark.requires("capture_sizes")
@given(config=plain_configs(), data=st.data())
def test_padding_is_monotone_and_lands_on_a_size(check, runtime, config, data):
    """Drawn configs and batches: padded(n) >= n and is a size, padded is monotone in n, a size
    pads to itself, and above the largest size nothing is padded (None)."""
    sizes = runtime.capture_sizes(config)
    largest = max(sizes, default=0)
    a, b = sorted(data.draw(st.lists(st.integers(1, 2 * largest + 8), min_size=2, max_size=2), label="batches"))
    pa, pb = runtime.padded_size(config, a), runtime.padded_size(config, b)
    for n, p in ((a, pa), (b, pb)):
        if n > largest:
            check.equal(p, None, what=f"batch {n} is above the largest size {largest}: it runs eager",
                        source=OWN_POLICY, case=config)
        else:
            check.that(p is not None and p >= n and p in sizes, what=f"batch {n} pads to a size that holds it",
                       source=OWN_POLICY, case=config, padded=p, sizes=sizes)
            check.that(n not in sizes or p == n, what=f"batch {n} is a size: it pads nothing", source=OWN_POLICY,
                       case=config, padded=p)
    if pb is not None:
        check.that(pa is not None and pa <= pb, what=f"padding is monotone: padded({a}) <= padded({b})",
                   source=OWN_POLICY, case=config, padded=(pa, pb))


@pytest.mark.requires("capture_sizes", "vllm_rules")
@pytest.mark.parametrize("seqs,batch,count,padded_to,waste,pct", [
    (64, 5, 19, 8, 3, 37.50),
    (256, 500, 51, 512, 12, 2.34),
], ids=["b=5-pad=8", "b=500-pad=512"])
def test_spec_waste_examples(check, runtime, record, seqs, batch, count, padded_to, waste, pct):
    config = vllm_rules(runtime, PolicyConfig(max_num_seqs=seqs))
    sizes = runtime.capture_sizes(config)
    record(Grid(config=f"max_num_seqs={seqs}", sizes=sizes))
    check.equal(len(sizes), count, what="number of sizes", source=SPEC, case=config)
    got = runtime.padded_size(config, batch)
    check.equal(got, padded_to, what=f"padded size of batch {batch}", source=SPEC, case=config)
    check.equal((got - batch, round(100 * (got - batch) / got, 2)), (waste, pct), source=SPEC, case=config,
                what="waste tokens and percent")
