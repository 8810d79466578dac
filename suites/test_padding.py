"""Padding (SPEC 4): a batch runs at the smallest capture size that holds it; above the max it
runs eager and unpadded; at the max nothing is padded.

The padding invariants hold for any runtime that exposes its sizes; only the waste examples
need vLLM's grid.
"""
import pytest

from harness import oracle
from harness.compare import expect_equal
from harness.protocol import PolicyConfig

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
    PolicyConfig(max_num_seqs=32, num_speculative_tokens=2),
    PolicyConfig(max_num_seqs=16, capture_sizes=(3, 7, 30)),
]
IDS = ["seqs1", "seqs8", "seqs64", "seqs100", "seqs256", "seqs264", "D1024", "tokens100", "q3", "user-sizes"]


@pytest.mark.requires("capture_sizes")
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_batch_pads_to_the_smallest_size_that_holds_it(runtime, config):
    sizes = list(runtime.capture_sizes(config))
    top = max(sizes, default=32)  # no sizes: no graphs, every batch runs eager
    actual = [runtime.padded_size(config, n) for n in range(1, top + 1)]
    expected = [oracle.padded(sizes, n) for n in range(1, top + 1)]
    expect_equal(actual, expected, invariant=INVARIANT, runtime=runtime, case=config,
                 what="padded size for every batch 1..max (index i is batch i+1)")


@pytest.mark.requires("capture_sizes")
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_above_the_max_runs_eager_and_at_the_max_pads_nothing(runtime, config):
    largest = max(runtime.capture_sizes(config), default=None)
    cases = [(1, None), (64, None)] if largest is None else [
        (largest, largest), (largest + 1, None), (largest + 17, None), (4 * largest + 3, None)]
    for batch, expected in cases:
        expect_equal(runtime.padded_size(config, batch), expected, invariant=INVARIANT, runtime=runtime,
                     case=config, what=f"padded size of batch {batch} (max capture size {largest}; None = eager)")


@pytest.mark.requires("capture_sizes", "vllm_policy")
@pytest.mark.parametrize("seqs,batch,count,padded,waste,pct", [
    (64, 5, 19, 8, 3, 37.50),
    (256, 500, 51, 512, 12, 2.34),
], ids=["b=5-pad=8", "b=500-pad=512"])
def test_spec_waste_examples(runtime, record_property, seqs, batch, count, padded, waste, pct):
    config = PolicyConfig(max_num_seqs=seqs)
    record_property("grid", {"config": f"max_num_seqs={seqs}", "sizes": list(runtime.capture_sizes(config))})
    expect_equal(len(runtime.capture_sizes(config)), count, invariant=INVARIANT, runtime=runtime, case=config,
                 what="number of sizes")
    got = runtime.padded_size(config, batch)
    expect_equal(got, padded, invariant=INVARIANT, runtime=runtime, case=config, what=f"padded size of batch {batch}")
    expect_equal((got - batch, round(100 * (got - batch) / got, 2)), (waste, pct), invariant=INVARIANT,
                 runtime=runtime, case=config, what="waste tokens and percent")
