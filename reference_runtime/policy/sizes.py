"""Capture sizes: which padded token counts get a graph (SPEC 3, vLLM's default grid)."""
from __future__ import annotations

from .config import PolicyConfig
from .modes import CUDAGraphMode
from .speculation import decode_tiers


def grid(cap: int) -> list[int]:
    """The base grid up to `cap`: dense where small batches are common, coarse above 256."""
    small = [s for s in (1, 2, 4) if s <= cap]
    return small + list(range(8, min(cap, 248) + 1, 8)) + list(range(256, cap + 1, 16))


def default_cap(config: PolicyConfig) -> int:
    """min(max_num_seqs * q * 2, platform max), then clamped to max_num_batched_tokens."""
    cap = min(config.max_num_seqs * config.query_len * 2, config.platform_max)
    cap = min(cap, config.batched_tokens)
    if cap < 1:
        raise ValueError(f"the largest capture size must be >= 1, got {cap}")
    return cap


def capture_sizes(config: PolicyConfig) -> list[int]:
    """The sorted, unique token counts that get a graph; the last one is the max capture size.

    Mode NONE captures nothing, so it has no sizes (vLLM leaves the list empty too). Under the
    V2 runner these are the mixed routine's sizes; its uniform-decode graphs sit at each size
    rounded up to a multiple of q (Dispatcher.initialize_keys).
    """
    if config.mode is CUDAGraphMode.NONE:
        return []
    if config.capture_sizes is not None:
        sizes = _user_sizes(config)
    elif config.max_capture_size is not None:
        sizes = _sizes_below_user_max(config)
    else:
        sizes = _default_sizes(config)
    # Only the V1 runner rounds the sizes themselves; V2 rounds its decode keys instead (dispatch.py).
    if sizes and config.rules.rounds_sizes_to_q and config.mode.decode_mode() is CUDAGraphMode.FULL \
            and config.query_len > 1:
        sizes = _round_to_query_len(sizes, config.query_len)
    return sizes


def max_capture_size(config: PolicyConfig) -> int:
    """The largest size; 0 when nothing is captured."""
    return max(capture_sizes(config), default=0)


def _default_sizes(config: PolicyConfig) -> list[int]:
    cap = default_cap(config)
    sizes = set(grid(cap))
    tokens = config.batched_tokens
    if tokens <= cap:
        sizes.add(tokens)
    q = config.query_len
    if q == 1:
        if config.max_num_seqs <= cap:
            sizes.add(config.max_num_seqs)  # the off-grid append
    else:
        # Speculative decoding: a uniform step of n requests has n * q tokens, for n on the
        # request-count grid up to max_num_seqs; under a dynamic schedule, for each q it has, up to
        # the widest batch that runs at that q.
        for tier_q, widest in decode_tiers(config.speculative_schedule, config.max_num_seqs,
                                           config.num_speculative_tokens):
            most = min(widest, config.platform_max)
            requests = set(grid(most)) | {most}
            sizes.update(n * tier_q for n in requests if n * tier_q <= cap)
    return sorted(sizes)


def _user_sizes(config: PolicyConfig) -> list[int]:
    tokens = config.batched_tokens
    if not config.capture_sizes:
        raise ValueError("capture_sizes is empty; give at least one size, or leave it unset for the default grid")
    # Sizes above max_num_batched_tokens are dropped; if none is left, nothing is captured (as vLLM does).
    sizes = sorted({s for s in config.capture_sizes if s <= tokens})
    if not sizes:
        return []
    if config.max_capture_size is not None and config.max_capture_size != sizes[-1]:
        raise ValueError(
            f"max_capture_size ({config.max_capture_size}) must equal the largest of capture_sizes "
            f"({sizes[-1]}); give one of the two, or make them agree"
        )
    return sizes


def _sizes_below_user_max(config: PolicyConfig) -> list[int]:
    """A user max alone: the grid up to it, truncated to the largest grid size <= it (257 -> 256)."""
    cap = min(config.max_capture_size, config.batched_tokens)
    sizes = set(grid(cap))
    if config.batched_tokens <= cap:
        sizes.add(config.batched_tokens)
    return sorted(sizes)


def _round_to_query_len(sizes: list[int], q: int) -> list[int]:
    """FULL decode graphs need every size to hold whole requests of q tokens."""
    largest = sizes[-1]
    rounded = sorted({s for s in (-(-size // q) * q for size in sizes) if s <= largest})
    if rounded:
        return rounded
    if q <= largest:
        return [q]
    raise ValueError(
        f"no capture size can hold a uniform decode step of {q} tokens (1 + num_speculative_tokens): "
        f"the largest size is {largest}; raise the max capture size to >= {q} or use a PIECEWISE decode mode"
    )
