"""A full KV cache: every block an engine holds taken, with requests that can still decode.

`fill()` admits `decoders` requests of one token each (each holds one block, with room for
block_size - 1 more tokens) beside a filler, then grows fillers by as many whole blocks a step as
the token budget allows, each up to max_model_len before another is admitted (a real scheduler
seats only max_num_seqs requests), then, once a step is refused, by one block a step until one is
refused too: the step that ends the fill asked for exactly one block more than the cache had. Admission steps are as large as the budget allows, so they run eager where the grid
ends below them, and the first padded graph step comes after the cache is full.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.protocol import Request
from harness.scenarios.batches import Sequence, prompt


@dataclass
class Filled:
    """What `fill()` left: the decoders, the fillers and the tokens each holds, and how the engine
    refused the step that found the cache full (None: it never refused, within `most_blocks`)."""

    decoders: list[Sequence]
    block_size: int
    fillers: dict[int, int] = field(default_factory=dict)  # request id -> tokens it holds
    refusal: BaseException | None = None

    @property
    def blocks(self) -> int:
        return len(self.decoders) + sum(-(-tokens // self.block_size) for tokens in self.fillers.values())

    def request_ids(self) -> list[int]:
        return [s.request_id for s in self.decoders] + list(self.fillers)


def fill(engine, new_id, block_size: int, budget: int, max_model_len: int, decoders: int,
         most_blocks: int) -> Filled:
    """Take every block of `engine` (module docstring); `new_id()` gives request ids."""
    filled = Filled([], block_size)
    longest = max(block_size, max_model_len // block_size * block_size)  # a filler's whole blocks
    chunk = max(block_size, min(longest, budget) // block_size * block_size)  # one step's, whole blocks
    first = new_id()  # a filler rides with the decoders: a step as large as the budget
    ahead = min((budget - decoders) // block_size * block_size, longest)
    admitting = [Request(i, prompt(i, 1), 0) for i in (new_id() for _ in range(decoders))]
    riding = [Request(first, prompt(first, ahead), 0)] if ahead > 0 else []
    try:
        engine.step(admitting + riding)
    except Exception as exc:  # noqa: BLE001 - the refusal is the fill's answer; the suite judges its kind
        filled.refusal = exc
        return filled
    filled.decoders = [Sequence(r.request_id, list(r.token_ids)) for r in admitting]
    filled.fillers.update({r.request_id: len(r.token_ids) for r in riding})
    for size in (chunk, block_size):  # as many blocks a step as fit, then single blocks
        while filled.blocks < most_blocks:
            # A filler grows to max_model_len before another is admitted: the seats are few.
            request_id = next((i for i, held in filled.fillers.items() if held + size <= longest), None)
            admitted = request_id is None
            request_id = new_id() if admitted else request_id
            held = filled.fillers.get(request_id, 0)
            try:
                engine.step([Request(request_id, prompt(request_id, held + size)[held:], held)])
            except Exception as exc:  # noqa: BLE001 - as above
                if admitted:
                    engine.release(request_id)  # a refused step took nothing
                if size == block_size:
                    filled.refusal = exc
                    return filled
                break
            filled.fillers[request_id] = held + size
    return filled


def release(engine, filled: Filled) -> None:
    """Release every request the fill admitted."""
    for request_id in filled.request_ids():
        engine.release(request_id)
