"""Independent oracles for the graph policy, written from docs/spec.md and not from any runtime.

They are deliberately shaped differently from the reference runtime: sizes are a membership
predicate over 1..cap instead of a generated list, keys are enumerated sets, and resolution is
the spec table as data (in harness.vocabulary). When a runtime and an oracle disagree, one of them is wrong; the
policy suites say which number the spec asks for.
"""
from __future__ import annotations

from functools import lru_cache

from .protocol import Descriptor, Dispatch, PolicyConfig
from .vocabulary import ROUTINES, RUNTIME_MODES, lowest, padded

DEFAULT_BATCHED_TOKENS = 8192


def on_grid(size: int) -> bool:
    """vLLM's default grid as a predicate: 1, 2, 4; multiples of 8 to 248; multiples of 16 from 256."""
    return size in (1, 2, 4) or (8 <= size <= 248 and size % 8 == 0) or (size >= 256 and size % 16 == 0)


def batched_tokens(config: PolicyConfig) -> int:
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    return max(DEFAULT_BATCHED_TOKENS, config.max_num_seqs)


def decode_is_full(mode: str) -> bool:
    return ROUTINES[mode][0] == "FULL"


def capture_sizes(config: PolicyConfig) -> list[int]:
    """The sizes spec section 3 asks for. Raises ValueError where the spec says the config is an error."""
    return list(_capture_sizes(config))


@lru_cache(maxsize=1024)
def _capture_sizes(config: PolicyConfig) -> tuple[int, ...]:
    q = config.query_len
    tokens = batched_tokens(config)
    if tokens < config.max_num_seqs:
        raise ValueError("max_num_batched_tokens below max_num_seqs")
    if config.mode == "NONE":
        return []  # nothing is captured
    if config.capture_sizes is not None:
        if not config.capture_sizes:
            raise ValueError("an empty list of user sizes")
        chosen = {s for s in config.capture_sizes if s <= tokens}
        if not chosen:
            return []  # every given size is above the token budget: no graphs
        if config.max_capture_size is not None and config.max_capture_size != max(chosen):
            raise ValueError("user max inconsistent with user sizes")
    else:
        if config.max_capture_size is not None:
            limit = min(config.max_capture_size, tokens)
        else:
            limit = min(2 * q * config.max_num_seqs, config.platform_max, tokens)
        chosen = {s for s in range(1, limit + 1) if on_grid(s)}
        if tokens <= limit:
            chosen.add(tokens)
        if config.max_capture_size is None:
            if q == 1 and config.max_num_seqs <= limit:
                chosen.add(config.max_num_seqs)
            if q > 1:
                most = min(config.max_num_seqs, config.platform_max)
                chosen |= {n * q for n in range(1, most + 1) if (on_grid(n) or n == most) and n * q <= limit}
    if q > 1 and decode_is_full(config.mode):
        top = max(chosen)
        chosen = {s for s in (q * ((x + q - 1) // q) for x in chosen) if s <= top}
        if not chosen:
            if q > top:
                raise ValueError("no size holds q tokens")
            chosen = {q}
    return tuple(sorted(chosen))


def lora_cases(config: PolicyConfig) -> list[int]:
    if config.max_loras == 0:
        return [0]
    everything = config.max_loras + 1
    if not config.specialize_lora:
        return [everything]
    if not config.specialize_active_loras:
        return [0, everything]
    powers = [2**i for i in range(0, 20) if 2**i <= config.max_loras]
    return [0] + sorted(set(powers) | {everything})


def graph_keys(config: PolicyConfig) -> dict[str, set[Descriptor]]:
    """Every key each runtime mode should hold: {"FULL": {...}, "PIECEWISE": {...}}."""
    return {mode: set(keys) for mode, keys in _graph_keys(config).items()}


@lru_cache(maxsize=1024)
def _graph_keys(config: PolicyConfig) -> dict[str, frozenset[Descriptor]]:
    mode, q, seqs = config.mode, config.query_len, config.max_num_seqs
    keys: dict[str, set[Descriptor]] = {"FULL": set(), "PIECEWISE": set()}
    if mode == "NONE":
        return {m: frozenset() for m in keys}
    sizes = capture_sizes(config)
    mixed = {"PIECEWISE": "PIECEWISE", "FULL": "FULL", "FULL_AND_PIECEWISE": "PIECEWISE"}.get(mode)
    for loras in lora_cases(config):
        for s in sizes:
            if mixed == "FULL":
                keys["FULL"].add(Descriptor(s, min(s, seqs), False, loras > 0, loras))
            elif mixed == "PIECEWISE":
                keys["PIECEWISE"].add(Descriptor(s, None, False, loras > 0, loras))
            if mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") and q <= s <= q * seqs and s % q == 0:
                keys["FULL"].add(Descriptor(s, s // q, True, loras > 0, loras))
    return {mode: frozenset(found) for mode, found in keys.items()}


def active_lora_case(config: PolicyConfig, num_active_loras: int) -> int:
    if num_active_loras == 0 or config.max_loras == 0:
        return num_active_loras
    cases = [c for c in lora_cases(config) if c >= num_active_loras and c > 0]
    if not config.specialize_lora or not config.specialize_active_loras:
        return config.max_loras + 1
    return min(cases)


def dispatch(config: PolicyConfig, num_tokens: int, num_reqs: int | None = None, uniform: bool = False,
             num_active_loras: int = 0, allowed: frozenset[str] = frozenset(RUNTIME_MODES)) -> Dispatch:
    """spec section 4: above the max or under NONE run eager unpadded; else exact FULL key, relaxed PIECEWISE key, NONE."""
    eager = Dispatch("NONE", Descriptor(num_tokens))  # eager steps are not keyed: only the size counts
    if config.mode == "NONE":
        return eager
    sizes = capture_sizes(config)
    p = padded(sizes, num_tokens)
    if p is None or allowed <= {"NONE"}:
        return eager
    keys = _graph_keys(config)
    loras = active_lora_case(config, num_active_loras)
    q, seqs = config.query_len, config.max_num_seqs
    pair_mode = config.mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    if uniform and pair_mode:
        key = Descriptor(p, min(p // q, seqs), True, loras > 0, loras)
    else:
        key = Descriptor(p, min(p, seqs), False, loras > 0, loras)
    relaxed = Descriptor(p, None, False, loras > 0, loras)
    if "FULL" in allowed and key in keys["FULL"]:
        return Dispatch("FULL", key)
    if "PIECEWISE" in allowed and relaxed in keys["PIECEWISE"]:
        return Dispatch("PIECEWISE", relaxed)
    return eager


def dp_dispatch(config: PolicyConfig, ranks) -> list[Dispatch]:
    """spec section 4, data parallel: the lowest mode, the largest padded size, never a higher mode."""
    local = [dispatch(config, r.num_tokens, r.num_reqs, r.uniform) for r in ranks]
    if len(ranks) == 1:
        return local
    agreed = lowest(d.runtime_mode for d in local)
    if agreed == "NONE":  # no data-parallel padding; each rank runs eager at its own dispatched size
        return [Dispatch("NONE", Descriptor(d.descriptor.num_tokens)) for d in local]
    size = max(d.descriptor.num_tokens for d in local)
    return [dispatch(config, size, None, r.uniform and size % config.query_len == 0, allowed=frozenset({agreed}))
            for r in ranks]
