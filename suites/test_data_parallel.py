"""Data-parallel consensus, as policy (docs/spec.md section 4; invariant 9 of section 7).

- Any runtime with `data_parallel` and `dispatch`: ranks agree on one mode and, under a graph
  mode, one padded size; no rank moves above the lowest mode any rank dispatched alone (the
  runtime's own dispatch()).
- vLLM conformance (`vllm_rules`): the spec's examples, and drawn rank batches against the oracle,
  for vLLM's V1 and V2 model runners (docs/runners.md says how they differ).

Ranks in separate processes are tested by test_data_parallel_execution.py.
"""
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.expectations import oracle
from harness.protocol import Descriptor, Dispatch, PolicyConfig, RankBatch
from harness.vocabulary import CONFIG_MODES, FAP, ORACLE, OWN_POLICY, RUNTIME_MODES, SPEC, lowest

INVARIANT = "data-parallel consensus"


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
    ("decode-and-mixed-agree-on-piecewise", "v1", [RankBatch(5, 5, True), RankBatch(20, 3, False)],
     [Dispatch("PIECEWISE", Descriptor(24, None, False))] * 2),
    ("decode-and-mixed-agree-on-piecewise", "v2", [RankBatch(5, 5, True), RankBatch(20, 3, False)],
     [Dispatch("PIECEWISE", Descriptor(24, None, False))] * 2),
    ("two-decodes-pad-to-the-larger", "v1", [RankBatch(5, 5, True), RankBatch(17, 17, True)],
     [Dispatch("FULL", Descriptor(24, 24, True))] * 2),
    ("two-decodes-pad-to-the-larger", "v2", [RankBatch(5, 5, True), RankBatch(17, 17, True)],
     [Dispatch("FULL", Descriptor(24, 24, True))] * 2),
    # Agreed on eager: no padding across ranks. V1: each keeps the size its own dispatch chose
    # (3 -> 4); V2: each runs its own unpadded size, keyed with its request count.
    ("one-rank-above-max-all-eager", "v1", [RankBatch(3, 3, True), RankBatch(200, 10, False)],
     [Dispatch("NONE", Descriptor(4)), Dispatch("NONE", Descriptor(200))]),
    ("one-rank-above-max-all-eager", "v2", [RankBatch(3, 3, True), RankBatch(200, 10, False)],
     [Dispatch("NONE", Descriptor(3, 3)), Dispatch("NONE", Descriptor(200, 10))]),
]


@pytest.mark.requires("data_parallel", "vllm_rules")
@pytest.mark.parametrize("runner,ranks,expected", [e[1:] for e in EXAMPLES], ids=[f"{e[1]}-{e[0]}" for e in EXAMPLES])
def test_spec_examples(check, runtime, runner, ranks, expected):
    config = PolicyConfig(max_num_seqs=64, mode=FAP, rules=f"vllm-0.33/{runner}")
    check.equal(runtime.dp_dispatch(config, ranks), expected, source=SPEC, case=config,
                what=f"what each rank runs for {ranks}")


@pytest.mark.requires("data_parallel", "dispatch")
@given(seqs=st.sampled_from([8, 64, 264]), data=st.data())
def test_ranks_agree_and_never_move_up(check, runtime, seqs, data):
    """Every config mode is asked about each drawn set of rank batches."""
    ranks = data.draw(rank_batches(seqs), label="ranks")
    for mode in CONFIG_MODES:
        _agree_and_never_move_up(check, runtime, PolicyConfig(max_num_seqs=seqs, mode=mode), ranks)


def _agree_and_never_move_up(check, runtime, config, ranks):
    agreed = runtime.dp_dispatch(config, ranks)
    alone = [runtime.dispatch(config, r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
    check.that(len({d.runtime_mode for d in agreed}) == 1, what="every rank runs the same mode", case=config,
               ranks=ranks, agreed=agreed)
    if agreed[0].runtime_mode == "NONE":
        check.that(all(d.descriptor.num_padded_tokens in (r.num_real_tokens, a.descriptor.num_padded_tokens)
                       for d, r, a in zip(agreed, ranks, alone)), source=OWN_POLICY, case=config,
                   what="agreed on eager, a rank runs at its own size (as its own dispatch chose)", ranks=ranks,
                   agreed=agreed)
    else:
        check.that(len({d.descriptor.num_padded_tokens for d in agreed}) == 1, what="every rank runs the same padded size",
                   case=config, ranks=ranks, agreed=agreed)
        check.that(all(d.descriptor.num_padded_tokens >= r.num_real_tokens for d, r in zip(agreed, ranks)), case=config,
                   what="no rank is padded below its batch", ranks=ranks, agreed=agreed)
    floor = lowest(d.runtime_mode for d in alone)
    check.that(RUNTIME_MODES.index(agreed[0].runtime_mode) <= RUNTIME_MODES.index(floor), source=OWN_POLICY,
               case=config, what=f"ranks must not move above the lowest mode a rank dispatched alone ({floor})",
               ranks=ranks, agreed=agreed, alone=alone)


@pytest.mark.requires("data_parallel", "vllm_rules")
@given(seqs=st.sampled_from([8, 64, 264]), data=st.data())
def test_matches_the_oracle(check, runtime, seqs, data):
    """Every config mode and both of vLLM's runners are asked about each drawn set of rank batches."""
    ranks = data.draw(rank_batches(seqs), label="ranks")
    for mode, runner in itertools.product(CONFIG_MODES, ("v1", "v2")):
        config = PolicyConfig(max_num_seqs=seqs, mode=mode, rules=f"vllm-0.33/{runner}")
        check.equal(runtime.dp_dispatch(config, ranks), oracle.dp_dispatch(config, ranks), source=ORACLE, case=config,
                    what=f"what each rank runs for {ranks}")
