"""The bucket engine's policy: its buckets, its dispatch and its mode resolution. Pure Python.

Buckets (not vLLM's grid). A graph holds q * 2**k tokens: 2**k requests of q tokens each (a
decode step when q = 1, a speculative verify step when q > 1). The largest batch the scheduler
can send whole, `most` = q * min(max_num_seqs, max_num_batched_tokens // q) tokens, is a bucket
too, so a full decode batch never runs eager. A batch pads up to the smallest bucket that holds
it; above the largest it runs eager, unpadded. User-given sizes replace the powers of two
(sizes above max_num_batched_tokens dropped); a user max drops the sizes above it.

Keys. A graph is keyed by its padded token count alone: the attention reads each token's own
KV row, so one graph serves any mix of decode, verify and prefill tokens of that count.

Modes. The engine captures FULL graphs only; it has no PIECEWISE graphs. A config mode is a pair
of routines (harness.vocabulary.ROUTINES: uniform decode batches, every other batch); a
PIECEWISE routine runs eager here. At build time the requested mode is resolved for the
attention's support level:

- a FULL routine survives only where the attention admits the batches it would hold: decode
  batches need UNIFORM_BATCH or better (UNIFORM_SINGLE_TOKEN_DECODE when q = 1), every other
  batch needs ALWAYS;
- FULL_AND_PIECEWISE over ALWAYS attention becomes FULL: the FULL graphs hold the mixed batches
  the PIECEWISE graphs would have (vLLM does the same when there is nothing to split at);
- so PIECEWISE becomes NONE, FULL over UNIFORM_BATCH becomes FULL_DECODE_ONLY, and anything
  over NEVER becomes NONE. Every change warns.
"""
from __future__ import annotations

import bisect

from harness.protocol import Descriptor, Dispatch, PolicyConfig, Resolution
from harness.vocabulary import FAP, FDO, ROUTINES

DEFAULT_BATCHED_TOKENS = 8192  # max_num_batched_tokens when the config leaves it out (as vLLM)
MODE_OF_ROUTINES = {("FULL", "FULL"): "FULL", ("FULL", "NONE"): FDO, ("NONE", "NONE"): "NONE"}


def batched_tokens(config: PolicyConfig) -> int:
    return config.max_num_batched_tokens or max(DEFAULT_BATCHED_TOKENS, config.max_num_seqs)


def capture_sizes(config: PolicyConfig) -> list[int]:
    """The padded token counts that get a FULL graph under config.mode ([] without a FULL routine)."""
    if config.max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
    if "FULL" not in ROUTINES[config.mode]:
        return []
    budget, q = batched_tokens(config), config.query_len
    if config.capture_sizes is not None:
        sizes = sorted({s for s in config.capture_sizes if 1 <= s <= budget})
    else:
        most = q * min(config.max_num_seqs, budget // q)
        sizes = [q << k for k in range(most.bit_length()) if q << k < most] + ([most] if most else [])
    return [s for s in sizes if config.max_capture_size is None or s <= config.max_capture_size]


def padded_size(config: PolicyConfig, num_real_tokens: int) -> int | None:
    """The smallest bucket that holds num_real_tokens; None above the largest (the batch runs eager)."""
    sizes = capture_sizes(config)
    index = bisect.bisect_left(sizes, num_real_tokens)
    return sizes[index] if index < len(sizes) else None


def dispatch(config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False) -> Dispatch:
    """FULL at the padded size where the batch's routine is FULL and a bucket holds it, else eager."""
    routine = ROUTINES[config.mode][0 if uniform else 1]
    size = padded_size(config, num_real_tokens) if routine == "FULL" else None
    if size is None:
        return Dispatch("NONE", Descriptor(num_real_tokens))
    return Dispatch("FULL", Descriptor(size))


def resolve_mode(mode: str, support: str, num_speculative_tokens: int = 0) -> Resolution:
    """What a requested config mode becomes over attention of this support level (module docstring)."""
    decode, mixed = ROUTINES[mode]
    if mode == FAP and support == "ALWAYS":
        mixed = "FULL"
    holds_decode = support in ("ALWAYS", "UNIFORM_BATCH") or (
        support == "UNIFORM_SINGLE_TOKEN_DECODE" and num_speculative_tokens == 0)
    decode = "FULL" if decode == "FULL" and holds_decode else "NONE"
    mixed = "FULL" if mixed == "FULL" and support == "ALWAYS" else "NONE"
    resolved = MODE_OF_ROUTINES[decode, mixed]
    if resolved == mode:
        return Resolution(mode, mode)
    reasons = []
    if "PIECEWISE" in ROUTINES[mode]:
        instead = "; its ALWAYS attention runs those batches in FULL graphs" if mixed == "FULL" else \
            ": those batches run eager"
        reasons.append("the bucket engine has no PIECEWISE graphs" + instead)
    if ROUTINES[mode][1] == "FULL" and mixed != "FULL" or ROUTINES[mode][0] == "FULL" and decode != "FULL":
        reasons.append(f"{support} attention (q={1 + num_speculative_tokens}) cannot run "
                       f"{'mixed batches' if decode == 'FULL' else 'any batch'} in a FULL graph")
    return Resolution(mode, resolved, (f"mode {mode} resolved to {resolved}: {'; '.join(reasons)}",))
