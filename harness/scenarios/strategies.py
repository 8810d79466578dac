"""Hypothesis strategies for policy inputs, shared by the suites.

Each strategy is built once, here or (where it depends on what was drawn before) once per value,
and drawn from many times: building one (validation, its repr, the properties hypothesis derives
for it) costs more than a policy suite's check of the config it draws.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from harness.protocol import PolicyConfig
from harness.vocabulary import CONFIG_MODES, SPEC_RELEASE, rules_name

_sampled_from = functools.lru_cache(maxsize=None)(st.sampled_from)  # of a tuple: one strategy per tuple

_SEQS = st.one_of(st.integers(1, 40), st.integers(41, 1100), st.sampled_from([256, 264, 300, 512, 1024]))
_SPEC = st.integers(0, 4)
_PLATFORM_MAX = st.sampled_from([512, 1024])
_SIZES_CHOICE = st.sampled_from(["default", "default", "user_sizes", "user_max"])
_USER_SIZES = st.lists(st.integers(1, 600), min_size=1, max_size=12)
_USER_MAX = st.integers(1, 1100)


@functools.lru_cache(maxsize=None)
def _token_budgets(seqs: int):
    return st.one_of(st.none(), st.integers(seqs, seqs + 600), st.sampled_from([2048, 8192])).filter(
        lambda t: t is None or t >= seqs)


def _vllm_rules(runner: str) -> str:
    """The spec release's rules for one of vLLM's runners (the harness asks in a runtime's declared release)."""
    return rules_name("vllm", SPEC_RELEASE, runner)


@st.composite
def policy_configs(draw, *, speculative: bool = True, user_sizes: bool = True, modes=CONFIG_MODES,
                   runners=("v1", "v2")):
    """Configs across vLLM's interesting ranges: small and off-grid max_num_seqs, both platform
    maxima, a binding max_num_batched_tokens, speculative q, user sizes and a user max."""
    seqs = draw(_SEQS)
    tokens = draw(_token_budgets(seqs))
    spec = draw(_SPEC) if speculative else 0
    platform = draw(_PLATFORM_MAX)
    mode = draw(_sampled_from(tuple(modes)))
    sizes = user_max = None
    choice = draw(_SIZES_CHOICE) if user_sizes else "default"
    if choice == "user_sizes":
        sizes = tuple(draw(_USER_SIZES))
    elif choice == "user_max":
        user_max = draw(_USER_MAX)
    return PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=spec,
                        platform_max=platform, capture_sizes=sizes, max_capture_size=user_max, mode=mode,
                        rules=_vllm_rules(draw(_sampled_from(tuple(runners)))))


def plain_configs(modes=CONFIG_MODES):
    """Ordinary configs any bucket policy must answer: no user sizes, no speculation, a token
    budget of at least one token per seat."""
    return policy_configs(speculative=False, user_sizes=False, modes=modes)


# Every q a speculative runtime is asked about (1 + num_speculative_tokens), and vLLM's model runners.
QUERY_LENS = (1, 2, 3, 4, 5)
RUNNERS = ("v1", "v2")

# Mostly small configs (a sweep asks about every batch size, so the grid's length is its cost), and
# now and then vLLM's own sizes: max_num_seqs up to 1024 and token budgets up to 8192, where the
# grid runs past 256 in steps of 16 and a 1024 platform maximum binds.
_SWEEP_SMALL_SEQS = st.integers(1, 32)
_SWEEP_SEQS = st.one_of(_SWEEP_SMALL_SEQS, _SWEEP_SMALL_SEQS, _SWEEP_SMALL_SEQS, _SWEEP_SMALL_SEQS,
                        st.one_of(st.integers(33, 1024), st.sampled_from([256, 264, 300, 512, 1000, 1024])))
_SWEEP_SIZES_CHOICE = st.sampled_from(["default", "default", "default", "user_sizes", "user_max"])
_SWEEP_USER_SIZES = st.lists(st.integers(1, 1100), min_size=1, max_size=8)
_SWEEP_USER_MAX = st.integers(1, 1100)
MAX_SWEEP_TOKENS = 8192  # vLLM's default max_num_batched_tokens


@functools.lru_cache(maxsize=None)
def _sweep_token_budgets(seqs: int):
    return st.one_of(st.none(), st.integers(seqs, seqs + 64),
                     st.integers(seqs, max(seqs, MAX_SWEEP_TOKENS)), st.sampled_from([2048, MAX_SWEEP_TOKENS])).filter(
        lambda t: t is None or t >= seqs)


@st.composite
def sweep_configs(draw, *, modes=CONFIG_MODES):
    """Configs to ask about every batch size: mostly max_num_seqs up to 32, so grids stop at a few
    hundred tokens, and one draw in five up to vLLM's largest (1024 sequences, 8192 tokens), with a
    binding token budget, user sizes or a user max now and then, every q, every mode and both runners.
    LARGE_SWEEP_CONFIGS are always asked besides."""
    seqs = draw(_SWEEP_SEQS)
    tokens = draw(_sweep_token_budgets(seqs))
    sizes = user_max = None
    choice = draw(_SWEEP_SIZES_CHOICE)
    if choice == "user_sizes":
        sizes = tuple(draw(_SWEEP_USER_SIZES))
    elif choice == "user_max":
        user_max = draw(_SWEEP_USER_MAX)
    return PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=draw(
        _sampled_from(QUERY_LENS)) - 1, platform_max=draw(_PLATFORM_MAX), capture_sizes=sizes,
        max_capture_size=user_max, mode=draw(_sampled_from(tuple(modes))),
        rules=_vllm_rules(draw(_sampled_from(RUNNERS))))


# Always swept, whatever is drawn: vLLM's defaults and largest grids (256 and 1024 sequences, an
# off-grid count above 256, both platform maxima, the 8192-token default budget), without and with
# speculative decoding (q = 3), under both runners. The drawn configs reach every q.
LARGE_SWEEP_CONFIGS = tuple(
    PolicyConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens, platform_max=platform,
                 num_speculative_tokens=q - 1, mode=mode, rules=_vllm_rules(runner))
    for (seqs, tokens, platform, mode), q, runner in (
        (row, q, runner)
        for row in ((256, None, 512, "FULL_AND_PIECEWISE"), (1024, 8192, 1024, "FULL_AND_PIECEWISE"),
                    (300, 8192, 1024, "FULL_DECODE_ONLY"), (1000, 2048, 1024, "FULL"))
        for q in (1, 3) for runner in RUNNERS)
)
