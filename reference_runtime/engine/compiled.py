"""Compiling is its own axis (spec section 2): Inductor fuses each piece; graphs still submit them."""
from __future__ import annotations

import torch

from .model import Decoder


def compiled_decoder(checkpoint: str) -> Decoder:
    """The decoder of a checkpoint with its three piece functions under torch.compile, without
    Inductor's own graphs: a `model` for ModelRunner (compiled when first called, on its device)."""
    model = Decoder.from_checkpoint(checkpoint)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * model.num_layers)
    options = {"triton.cudagraphs": False}
    for name in ("first_piece", "middle_piece", "last_piece"):
        setattr(model, name, torch.compile(getattr(model, name), dynamic=False, options=options))
    return model
