"""What the harness may look at or change, beyond a step: padding fills, the KV cache, and the
inputs of the last step. None of it is on the path a step takes in service.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from harness.vocabulary import PADDING_FILLS


@contextmanager
def padding_filled(runner, layout, fill: str | None):
    """The layout with other values in its padded rows, for one step: real rows must not change
    (spec section 7).

    "zeros": token id 0 and position 0. "random": random valid token ids and positions. "nan" and
    "inf": random ids and positions, and the KV that only padded rows read (the null block and
    the scratch slot) holds NaN or inf for the step. The slot mapping stays -1: padded rows must
    still write nothing. The fill goes into the layout, not the buffers: a FULL graph copies its
    inputs in itself.
    """
    n, size = layout.num_real_tokens, layout.num_tokens
    if fill is None or size == n:
        yield layout
        return
    if fill not in PADDING_FILLS:
        raise ValueError(f"padding_fill must be one of {', '.join(PADDING_FILLS)}, got {fill!r}")
    generator = torch.Generator().manual_seed(size)
    pad = size - n
    if fill == "zeros":
        ids = positions = [0] * pad
    else:
        ids = torch.randint(0, runner.model.vocab, (pad,), generator=generator).tolist()
        positions = torch.randint(0, runner.config.max_model_len, (pad,), generator=generator).tolist()
    filled = replace(layout, input_ids=layout.input_ids[:n] + ids, positions=layout.positions[:n] + positions)
    cache = runner.cache
    null_block = cache.data[:, :, : cache.block_size]
    if fill in ("nan", "inf"):
        null_block.fill_(float(fill))
        cache.data[:, :, cache.scratch_slot].fill_(float(fill))
    try:
        yield filled
    finally:
        runner.buffers.forget()  # the next step must not keep these padded rows
        if fill in ("nan", "inf"):
            null_block.zero_()
            cache.data[:, :, cache.scratch_slot].zero_()


def kv_snapshot(runner) -> torch.Tensor:
    """Every real slot, slot first: [slots, layers, k/v, kv_heads, head_dim]."""
    return runner.cache.real_blocks().permute(2, 0, 1, 3, 4).clone()


def last_step_inputs(runner) -> dict[str, torch.Tensor]:
    """Copies of the last step's token ids, positions and slots at its padded size."""
    size = runner.last_layout.num_tokens if runner.last_layout is not None else 0
    b = runner.buffers
    return {"token_ids": b.input_ids[:size].clone(), "positions": b.positions[:size].clone(),
            "slot_mapping": b.slot_mapping[:size].clone()}
