"""Compiling is its own axis (spec section 2): Inductor fuses each piece; graphs still submit them."""
from __future__ import annotations

import types

import torch


def compiled_pieces(model):
    """The model's three piece functions under torch.compile, without Inductor's own graphs."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * model.num_layers)
    options = {"triton.cudagraphs": False}
    return types.SimpleNamespace(**{
        name: torch.compile(getattr(model, name), dynamic=False, options=options)
        for name in ("first_piece", "middle_piece", "last_piece")
    })
