"""A full KV cache: every block an engine holds taken, with requests that can still decode.

`fill()` admits `decoders` requests of one token each (each holds one block, with room for
block_size - 1 more tokens), then filler requests of one block each, in steps within the
engine's token budget and seats, until the engine refuses a step. A refused step of several
requests is released and its requests admitted one at a time, so the step that ends the fill
asked for exactly one block more than the cache had. Admission steps are as large as the budget
allows: they run eager where the grid ends below them, and the first padded graph step comes
after the cache is full.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.protocol import Request
from harness.scenarios.batches import Sequence, prompt


@dataclass
class Filled:
    """What `fill()` left: the decoders, the fillers, the blocks they hold, and how the engine
    refused the step that found the cache full (None: it never refused, within `most_blocks`)."""

    decoders: list[Sequence]
    fillers: list[int] = field(default_factory=list)
    refusal: BaseException | None = None

    @property
    def blocks(self) -> int:
        return len(self.decoders) + len(self.fillers)

    def request_ids(self) -> list[int]:
        return [s.request_id for s in self.decoders] + self.fillers


def fill(engine, new_id, block_size: int, budget: int, seats: int, decoders: int, most_blocks: int) -> Filled:
    """Take every block of `engine` (module docstring); `new_id()` gives request ids."""
    filled = Filled([])
    waiting = [Request(i, prompt(i, 1), 0) for i in (new_id() for _ in range(decoders))]
    decoder_ids = {r.request_id for r in waiting}
    one_at_a_time = False
    while filled.blocks < most_blocks:
        while len(waiting) < seats and sum(len(r.token_ids) for r in waiting) + block_size <= budget:
            request_id = new_id()
            waiting.append(Request(request_id, prompt(request_id, block_size), 0))
        step = waiting[:1] if one_at_a_time else _within(waiting, budget, seats)
        try:
            engine.step(step)
        except Exception as exc:  # noqa: BLE001 - the refusal is the fill's answer; the suite judges its kind
            for request in step:
                engine.release(request.request_id)
            if one_at_a_time or len(step) == 1:
                filled.refusal = exc
                return filled
            one_at_a_time = True
            continue
        for request in step:
            if request.request_id in decoder_ids:
                filled.decoders.append(Sequence(request.request_id, list(request.token_ids)))
            else:
                filled.fillers.append(request.request_id)
        waiting = waiting[len(step):]
    return filled


def _within(waiting: list[Request], budget: int, seats: int) -> list[Request]:
    """The first requests that fit one step's token budget and seats."""
    step, tokens = [], 0
    for request in waiting[:seats]:
        if step and tokens + len(request.token_ids) > budget:
            break
        step.append(request)
        tokens += len(request.token_ids)
    return step


def release(engine, filled: Filled) -> None:
    """Release every request the fill admitted."""
    for request_id in filled.request_ids():
        engine.release(request_id)
