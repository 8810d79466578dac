"""Data-parallel consensus (SPEC 4, invariant 9): ranks agree on mode and padded size, on the
lowest mode any rank dispatched, and never move up."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import oracle
from harness.compare import expect, expect_equal
from harness.protocol import CONFIG_MODES, Descriptor, Dispatch, PolicyConfig, RankBatch

INVARIANT = "data-parallel consensus"
ORDER = ["NONE", "PIECEWISE", "FULL"]
FAP = "FULL_AND_PIECEWISE"


@st.composite
def rank_batches(draw, seqs):
    ranks = []
    for _ in range(draw(st.integers(1, 4), label="ranks")):
        uniform = draw(st.booleans())
        if uniform:
            reqs = draw(st.integers(1, seqs))
            ranks.append(RankBatch(reqs, reqs, True))
        else:
            tokens = draw(st.integers(1, 3 * seqs + 4))
            ranks.append(RankBatch(tokens, draw(st.integers(1, min(tokens, seqs))), False))
    return ranks


EXAMPLES = [
    ("decode-and-mixed-agree-on-piecewise", [RankBatch(5, 5, True), RankBatch(20, 3, False)],
     [Dispatch("PIECEWISE", Descriptor(24, None, False))] * 2),
    ("two-decodes-pad-to-the-larger", [RankBatch(5, 5, True), RankBatch(17, 17, True)],
     [Dispatch("FULL", Descriptor(24, 24, True))] * 2),
    # Agreed on eager: no padding across ranks; each keeps the size its own dispatch chose (3 -> 4).
    ("one-rank-above-max-all-eager", [RankBatch(3, 3, True), RankBatch(200, 10, False)],
     [Dispatch("NONE", Descriptor(4)), Dispatch("NONE", Descriptor(200))]),
]


@pytest.mark.requires("data_parallel", "vllm_policy")
@pytest.mark.parametrize("ranks,expected", [e[1:] for e in EXAMPLES], ids=[e[0] for e in EXAMPLES])
def test_spec_examples(runtime, ranks, expected):
    config = PolicyConfig(max_num_seqs=64, mode=FAP)
    expect_equal(list(runtime.dp_dispatch(config, ranks)), expected, invariant=INVARIANT, runtime=runtime,
                 case=config, what=f"what each rank runs for {ranks}")


@pytest.mark.requires("data_parallel")
@given(mode=st.sampled_from(CONFIG_MODES), seqs=st.sampled_from([8, 64, 264]), data=st.data())
def test_ranks_agree_and_never_move_up(runtime, mode, seqs, data):
    config = PolicyConfig(max_num_seqs=seqs, mode=mode)
    ranks = data.draw(rank_batches(seqs), label="ranks")
    agreed = list(runtime.dp_dispatch(config, ranks))
    alone = [runtime.dispatch(config, r.num_tokens, r.num_reqs, r.uniform) for r in ranks]
    expect(len(agreed) == len(ranks), invariant=INVARIANT, runtime=runtime, case=config,
           what="one answer per rank", ranks=ranks, agreed=agreed)
    expect(len({d.runtime_mode for d in agreed}) == 1, invariant=INVARIANT, runtime=runtime, case=config,
           what="every rank runs the same mode", ranks=ranks, agreed=agreed)
    if agreed[0].runtime_mode == "NONE":
        expect(all(d.descriptor.num_tokens in (r.num_tokens, a.descriptor.num_tokens) for d, r, a in
                   zip(agreed, ranks, alone)), invariant=INVARIANT, runtime=runtime, case=config,
               what="agreed on eager, a rank runs at its own size (as its own dispatch chose)", ranks=ranks,
               agreed=agreed)
    else:
        expect(len({d.descriptor.num_tokens for d in agreed}) == 1, invariant=INVARIANT, runtime=runtime,
               case=config, what="every rank runs the same padded size", ranks=ranks, agreed=agreed)
        expect(all(d.descriptor.num_tokens >= r.num_tokens for d, r in zip(agreed, ranks)), invariant=INVARIANT,
               runtime=runtime, case=config, what="no rank is padded below its batch", ranks=ranks, agreed=agreed)
    lowest = min((d.runtime_mode for d in alone), key=ORDER.index)
    expect(ORDER.index(agreed[0].runtime_mode) <= ORDER.index(lowest), invariant=INVARIANT, runtime=runtime,
           case=config, what=f"ranks must not move above the lowest local mode ({lowest})", ranks=ranks,
           agreed=agreed)


@pytest.mark.requires("data_parallel", "vllm_policy")
@given(mode=st.sampled_from(CONFIG_MODES), seqs=st.sampled_from([8, 64, 264]), data=st.data())
def test_matches_the_oracle(runtime, mode, seqs, data):
    config = PolicyConfig(max_num_seqs=seqs, mode=mode)
    ranks = data.draw(rank_batches(seqs), label="ranks")
    expect_equal(list(runtime.dp_dispatch(config, ranks)), oracle.dp_dispatch(config, ranks), invariant=INVARIANT,
                 runtime=runtime, case=config, what=f"what each rank runs for {ranks}")
