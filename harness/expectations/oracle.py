"""Independent oracles for the graph policy, written from docs/spec.md and docs/runners.md and not
from any runtime.

They are deliberately shaped differently from the reference runtime: sizes are a membership
predicate over 1..cap instead of a generated list, keys are enumerated sets, a V2 dispatch is a
search of those sets, and resolution is the spec table as data (in harness.vocabulary). When a
runtime and an oracle disagree, one of them is wrong; the policy suites say which number the
spec asks for. `PolicyConfig.rules` ("vllm-0.33/v2") picks vLLM's release and its V1 or V2 model runner rules
(`vllm_release`, `vllm_runner`): 0.33 is the spec; 0.25's V2 runner differs in three rules
(docs/spec.md section 11), each marked `OLD` below. 0.25's V1 runner shares the two that are its
sizes (no decode sizes appended, the 512 cap), then rounds them to whole requests and keys and
dispatches them as 0.33's V1 does (its CudagraphDispatcher is 0.33's); under dynamic speculative
decoding its FULL graphs give way to PIECEWISE (`dynamic_sd_mode`).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from functools import lru_cache

from harness.protocol import Descriptor, Dispatch, PolicyConfig
from harness.vocabulary import ROUTINES, RUNTIME_MODES, lowest, padded

DEFAULT_BATCHED_TOKENS = 8192
OLD = "0.25"  # vLLM 0.25: no appended decode sizes, a fixed 512 cap, one candidate table across modes
OLD_PLATFORM_MAX = 512  # vLLM 0.25's cap whatever the device (config/vllm.py _set_cudagraph_sizes)


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
        return ()  # nothing is captured (a max of 0 says the same)
    if config.max_capture_size is not None and config.max_capture_size < 1:
        raise ValueError("a max capture size of 0 captures nothing, which only mode NONE allows")
    if config.capture_sizes is not None:
        if not config.capture_sizes:
            raise ValueError("an empty list of user sizes")
        chosen = {s for s in config.capture_sizes if s <= tokens}
        if not chosen:
            return ()  # every given size is above the token budget: no graphs
        if config.max_capture_size is not None and config.max_capture_size != max(chosen):
            raise ValueError("user max inconsistent with user sizes")
    else:
        old = config.vllm_release == OLD
        if config.max_capture_size is not None:
            limit = min(config.max_capture_size, tokens)
        else:
            limit = min(2 * q * config.max_num_seqs, OLD_PLATFORM_MAX if old else config.platform_max, tokens)
        chosen = {s for s in range(1, limit + 1) if on_grid(s)}
        if tokens <= limit:
            chosen.add(tokens)
        if config.max_capture_size is None and not old:  # OLD: no decode sizes appended
            if q == 1 and config.max_num_seqs <= limit:
                chosen.add(config.max_num_seqs)
            if q > 1:
                most = min(config.max_num_seqs, config.platform_max)
                chosen |= {n * q for n in range(1, most + 1) if (on_grid(n) or n == most) and n * q <= limit}
    if q > 1 and decode_is_full(config.mode) and config.vllm_runner == "v1":  # V2 rounds keys, not sizes
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
    if not config.specialize_lora:  # V2 keeps graphs for batches without adapters too
        return [everything] if config.vllm_runner == "v1" else [0, everything]
    if not config.specialize_active_loras:
        return [0, everything]
    powers = [2**i for i in range(0, 20) if 2**i <= config.max_loras]
    return [0] + sorted(set(powers) | {everything})


def graph_keys(config: PolicyConfig, decode_query_lens: tuple[int, ...] | None = None) -> dict[str, set[Descriptor]]:
    """Every key each runtime mode should hold: {"FULL": {...}, "PIECEWISE": {...}}.

    decode_query_lens: the q of every uniform-decode graph where there are several (vLLM 0.25's
    dynamic speculative decoding: `speculative_decode_query_lens`); None is the config's one q.
    Under 0.25's V1 runner they leave no decode graph: the mode is `dynamic_sd_mode`'s."""
    if decode_query_lens is not None and config.vllm_runner == "v1":
        config, decode_query_lens = replace(config, mode=dynamic_sd_mode(config)), None
    return {mode: set(keys) for mode, keys in _graph_keys(config, decode_query_lens).items()}


def dynamic_sd_mode(config: PolicyConfig) -> str:
    """The config mode vLLM 0.25 keeps under dynamic speculative decoding: its V1 runner turns every
    mode with FULL graphs into PIECEWISE (docs/spec.md section 11); its V2 runner keeps the mode.
    ValueError for 0.33's V1 runner, whose dynamic speculative decoding is not modelled."""
    if config.vllm_runner == "v2":
        return config.mode
    if config.vllm_release != OLD:
        raise ValueError("decode graphs of several q are modelled for vLLM 0.25's V1 runner and the V2 runner only")
    return "PIECEWISE" if config.mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") else config.mode


def speculative_decode_query_lens(schedule, new_tokens_per_step: int = 1) -> tuple[int, ...]:
    """vLLM 0.25's V2 CudaGraphManager._init_candidates under dynamic speculative decoding: a
    uniform-decode q for every (first, last, speculative tokens) entry of the schedule, its count
    plus the tokens a step samples anew, whatever batch sizes the entry covers."""
    return tuple(sorted({tokens + new_tokens_per_step for _, _, tokens in schedule}))


@lru_cache(maxsize=1024)
def _graph_keys(config: PolicyConfig, decode_query_lens: tuple[int, ...] | None = None) -> dict[str, frozenset[Descriptor]]:
    mode, q, seqs = config.mode, config.query_len, config.max_num_seqs
    keys: dict[str, set[Descriptor]] = {"FULL": set(), "PIECEWISE": set()}
    if mode == "NONE":
        return {m: frozenset() for m in keys}
    sizes = capture_sizes(config)
    decode_most = min(q * seqs, max(sizes, default=0))  # V2: decode keys up to q x max_num_seqs and the largest size
    mixed = {"PIECEWISE": "PIECEWISE", "FULL": "FULL", "FULL_AND_PIECEWISE": "PIECEWISE"}.get(mode)
    for loras in lora_cases(config):
        for s in sizes:
            if mixed == "FULL":
                keys["FULL"].add(Descriptor(s, min(s, seqs), False, loras > 0, loras))
            elif mixed == "PIECEWISE":
                keys["PIECEWISE"].add(Descriptor(s, None, False, loras > 0, loras))
            if mode not in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
                continue
            if config.vllm_runner == "v1" and q <= s <= q * seqs and s % q == 0:
                keys["FULL"].add(Descriptor(s, s // q, True, loras > 0, loras))
            for tier_q in decode_query_lens or (q,):
                whole = tier_q * ((s + tier_q - 1) // tier_q)  # V2: the size rounded up to whole requests
                if config.vllm_runner == "v2" and whole <= decode_most and whole // tier_q <= seqs:
                    keys["FULL"].add(Descriptor(whole, whole // tier_q, True, loras > 0, loras))
    return {mode: frozenset(found) for mode, found in keys.items()}


@lru_cache(maxsize=256)
def _keys_by_size(config: PolicyConfig, decode_query_lens: tuple[int, ...] | None) -> tuple[list[int], dict]:
    """The keys of both modes by token count, and the token counts in order: a V2 search walks them upward."""
    found: dict[int, list[tuple[str, Descriptor]]] = {}
    for mode, keys in _graph_keys(config, decode_query_lens).items():
        for key in keys:
            found.setdefault(key.num_padded_tokens, []).append((mode, key))
    return sorted(found), found


def active_lora_case(config: PolicyConfig, num_active_loras: int) -> int:
    if num_active_loras == 0 or config.max_loras == 0:
        return num_active_loras
    cases = [c for c in lora_cases(config) if c >= num_active_loras and c > 0]
    if not config.specialize_lora or not config.specialize_active_loras:
        return config.max_loras + 1
    return min(cases)


def dispatch(config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
             num_active_loras: int = 0, allowed: frozenset[str] = frozenset(RUNTIME_MODES),
             decode_query_lens: tuple[int, ...] | None = None) -> Dispatch:
    """spec section 4: above the max or under NONE run eager unpadded; else exact FULL key, relaxed PIECEWISE key, NONE.
    decode_query_lens: as graph_keys takes it (0.25's V1 runner: the mode `dynamic_sd_mode` keeps)."""
    if config.vllm_runner == "v2":
        return dispatch_v2(config, num_real_tokens, num_real_rows, uniform, num_active_loras, decode_query_lens)
    if decode_query_lens is not None:
        config, decode_query_lens = replace(config, mode=dynamic_sd_mode(config)), None
    eager = Dispatch("NONE", Descriptor(num_real_tokens))  # eager steps are not keyed: only the size counts
    if config.mode == "NONE":
        return eager
    sizes = capture_sizes(config)
    p = padded(sizes, num_real_tokens)
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


def dispatch_v2(config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
                num_active_loras: int = 0, decode_query_lens: tuple[int, ...] | None = None) -> Dispatch:
    """docs/runners.md, V2: for FULL, then PIECEWISE, the keys of that mode at the smallest size that
    holds the batch; the first one the batch fits (a uniform key takes only uniform batches, and no
    more requests than it has) wins. Eager keeps the request and adapter counts. OLD: one search over
    both modes' keys, at the smallest size any of them has (docs/spec.md section 11). With several
    decode q (decode_query_lens), a uniform key takes only a batch of its own q."""
    q = config.query_len
    if num_real_rows is None:
        num_real_rows = num_real_tokens // q if uniform else min(num_real_tokens, config.max_num_seqs)
    loras = active_lora_case(config, num_active_loras)

    def takes(key: Descriptor) -> bool:
        if not key.uniform:
            return True
        return uniform and (decode_query_lens is None
                            or key.num_padded_tokens * num_real_rows == num_real_tokens * key.num_padded_rows)

    if config.mode != "NONE" and num_real_tokens <= max(_capture_sizes(config), default=0):
        order, by_size = _keys_by_size(config, decode_query_lens)
        searches = [("FULL", "PIECEWISE")] if config.vllm_release == OLD else [("FULL",), ("PIECEWISE",)]
        for modes in searches:
            holding = next((found for size in order[bisect_left(order, num_real_tokens):]
                            if (found := [(mode, k) for mode, k in by_size[size]
                                          if mode in modes and k.num_active_loras == loras])), [])
            fits = [(mode, k) for mode, k in holding
                    if takes(k) and (k.num_padded_rows is None or k.num_padded_rows >= num_real_rows)]
            if fits:
                return Dispatch(*min(fits, key=lambda fit: modes.index(fit[0])))
    return Dispatch("NONE", Descriptor(num_real_tokens, num_real_rows, False, loras > 0, loras))


def dp_dispatch(config: PolicyConfig, ranks) -> list[Dispatch]:
    """spec section 4, data parallel: the lowest mode, one size, never a higher mode. V1 ranks share
    padded sizes and keep their own on eager; V2 ranks share unpadded sizes (and are uniform only
    if all are) and run their own unpadded size on eager (docs/runners.md)."""
    if config.vllm_release == OLD:
        raise ValueError(f"the harness does not model vLLM {OLD}'s data-parallel agreement (harness.vocabulary.VLLM_RELEASES)")
    local = [dispatch(config, r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
    if len(ranks) == 1:
        return local
    agreed = lowest(d.runtime_mode for d in local)
    if config.vllm_runner == "v2":
        if agreed == "NONE":  # each rank eager at its own unpadded size
            return [dispatch_v2(replace(config, mode="NONE"), r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
        size = max(r.num_real_tokens for r in ranks)
        together = all(r.uniform for r in ranks)
        return [dispatch_v2(config, size, r.num_real_rows, together) for r in ranks]
    if agreed == "NONE":  # no data-parallel padding; each rank runs eager at its own dispatched size
        return [Dispatch("NONE", Descriptor(d.descriptor.num_padded_tokens)) for d in local]
    size = max(d.descriptor.num_padded_tokens for d in local)
    return [dispatch(config, size, None, r.uniform and size % config.query_len == 0, allowed=frozenset({agreed}))
            for r in ranks]
