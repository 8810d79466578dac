"""Hypothesis strategies for policy inputs, shared by the suites."""
from __future__ import annotations

from hypothesis import strategies as st

from harness.protocol import PolicyConfig
from harness.vocabulary import CONFIG_MODES


@st.composite
def policy_configs(draw, *, speculative: bool = True, user_sizes: bool = True, modes=CONFIG_MODES,
                   runners=("v1", "v2")):
    """Configs across vLLM's interesting ranges: small and off-grid max_num_seqs, both platform
    maxima, a binding max_num_batched_tokens, speculative q, user sizes and a user max."""
    seqs = draw(st.one_of(st.integers(1, 40), st.integers(41, 1100), st.sampled_from([256, 264, 300, 512, 1024])))
    tokens = draw(st.one_of(st.none(), st.integers(seqs, seqs + 600), st.sampled_from([2048, 8192])).filter(
        lambda t: t is None or t >= seqs))
    spec = draw(st.integers(0, 4)) if speculative else 0
    platform = draw(st.sampled_from([512, 1024]))
    mode = draw(st.sampled_from(modes))
    sizes = user_max = None
    choice = draw(st.sampled_from(["default", "default", "user_sizes", "user_max"])) if user_sizes else "default"
    if choice == "user_sizes":
        sizes = tuple(draw(st.lists(st.integers(1, 600), min_size=1, max_size=12)))
    elif choice == "user_max":
        user_max = draw(st.integers(1, 1100))
    return PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=spec,
                        platform_max=platform, capture_sizes=sizes, max_capture_size=user_max, mode=mode,
                        runner=draw(st.sampled_from(runners)))


def plain_configs(modes=CONFIG_MODES):
    """Ordinary configs any bucket policy must answer: no user sizes, no speculation, a token
    budget of at least one token per seat."""
    return policy_configs(speculative=False, user_sizes=False, modes=modes)


# Every q a speculative runtime is asked about (1 + num_speculative_tokens), and vLLM's model runners.
QUERY_LENS = (1, 2, 3, 4, 5)
RUNNERS = ("v1", "v2")


@st.composite
def sweep_configs(draw, *, modes=CONFIG_MODES):
    """Configs small enough to ask about every batch size: max_num_seqs up to 32, so grids stop at a
    few hundred tokens, with a binding token budget, user sizes or a user max now and then, every
    mode and both runners."""
    seqs = draw(st.integers(1, 32))
    tokens = draw(st.one_of(st.none(), st.integers(seqs, seqs + 64)))
    sizes = user_max = None
    choice = draw(st.sampled_from(["default", "default", "default", "user_sizes", "user_max"]))
    if choice == "user_sizes":
        sizes = tuple(draw(st.lists(st.integers(1, 200), min_size=1, max_size=8)))
    elif choice == "user_max":
        user_max = draw(st.integers(1, 300))
    return PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=draw(
        st.sampled_from(QUERY_LENS)) - 1, platform_max=draw(st.sampled_from([512, 1024])), capture_sizes=sizes,
        max_capture_size=user_max, mode=draw(st.sampled_from(modes)), runner=draw(st.sampled_from(RUNNERS)))
