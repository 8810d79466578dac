"""The part of a step observer every runtime that drives a real engine writes the same way: a
fresh record for each step, the eager size and padding fill a step asked for, and the padded rows
of the engine's static inputs filled on request. The observer itself (which of its engine's
methods it wraps, what its record holds) is the engine's own.

`step(padding_fill=...)` asks for "zeros" or "random": random rows are valid token ids and
positions, drawn anew on every call from a generator seeded by the call's number, so that two
calls fill different values and a run repeats exactly.
"""
from __future__ import annotations


class ObserverBase:
    """A subclass sets `record_type` (its step record, made with no arguments) and calls
    `fill_padded` where its engine has filled the static inputs and the forward has not read them."""

    record_type: type = None

    def __init__(self, vocab_size: int, max_model_len: int):
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.record = self.record_type()
        self.eager_size: int | None = None  # set by eager_step: run eager at this many tokens
        self.fill: str | None = None  # set by step(padding_fill=...)
        self._fills = 0

    def start(self, eager_size: int | None = None, fill: str | None = None):
        self.record, self.eager_size, self.fill = self.record_type(), eager_size, fill
        return self.record

    def stop(self) -> None:
        self.eager_size = self.fill = None

    def fill_padded(self, ids, positions) -> None:
        """Fill the padded rows' token ids and positions (views of the static inputs) as `fill` says."""
        import torch

        if self.fill == "zeros":
            ids.zero_()
            positions.zero_()
            return
        self._fills += 1  # "random": valid ids and positions, other ones on every call
        generator = torch.Generator(device=ids.device).manual_seed(self._fills)
        ids.copy_(torch.randint(0, self.vocab_size, tuple(ids.shape), generator=generator,
                                device=ids.device).to(ids.dtype))
        positions.copy_(torch.randint(0, self.max_model_len, tuple(positions.shape), generator=generator,
                                      device=positions.device).to(positions.dtype))


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "ObserverBase",
]
