"""Padding fills: a plan with other values in its padded rows, for one step. Real rows must not
change (spec section 7). Not on the path a step takes in service.

"zeros": token id 0 and position 0. "random": random valid token ids and positions. "nan" and
"inf": random ids and positions, and the KV that only padded rows read (the null block and the
scratch slot) holds NaN or inf for the step (`KVCache.poisoned`). The slot mapping stays -1:
padded rows must still write nothing. The fill goes into the plan, not the buffers: a FULL graph
copies its inputs in itself.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only to fill: the adapter reads FILLS in policy-only runs
    from .plan import StepPlan

FILLS = ("zeros", "random", "nan", "inf")
POISONS = {"nan": float("nan"), "inf": float("inf")}  # what the padded rows' KV holds meanwhile


def fill_padding(plan: StepPlan, fill: str, vocab: int, max_model_len: int) -> StepPlan:
    """A copy of the plan whose padded token rows hold `fill`'s ids and positions (seeded by the
    padded size, so a step is repeatable)."""
    if fill not in FILLS:
        raise ValueError(f"padding_fill must be one of {', '.join(FILLS)}, got {fill!r}")
    num_real_tokens, num_padded_tokens = plan.num_real_tokens, plan.num_padded_tokens
    pad = num_padded_tokens - num_real_tokens
    if fill == "zeros":
        ids = positions = [0] * pad
    else:
        import torch

        generator = torch.Generator().manual_seed(num_padded_tokens)
        ids = torch.randint(0, vocab, (pad,), generator=generator).tolist()
        positions = torch.randint(0, max_model_len, (pad,), generator=generator).tolist()
    return replace(plan, input_ids=plan.input_ids[:num_real_tokens] + ids, positions=plan.positions[:num_real_tokens] + positions)
