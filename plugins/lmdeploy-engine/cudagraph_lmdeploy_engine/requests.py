"""This runtime's scheduler state: which requests are live, the tokens whose KV each one holds,
and its KV blocks. Pure Python (no LMDeploy, no torch), so it is tested on any machine.

LMDeploy's own scheduler (lmdeploy/pytorch/paging/) hands its model agent one batch a step as
`ModelInputs`: every request's new tokens, its history length and its block table, and whether
the step is decoding. This runtime plays that scheduler with the harness's exact batches: a step
is decoding when every request brings one token (then LMDeploy's graph runner may replay a
decode graph), otherwise it is a prefill step (eager), whatever the requests' histories.

Blocks: LMDeploy reserves block 0 for dummy inputs and padding (`num_reserved_gpu_blocks=1`,
engine/config_builder.py; its allocator starts after it), and so does this runtime. A KV slot is
numbered as `kv_snapshot()` lists them, reserved block left out: slot = (block - 1) x block size +
offset. Writes into the reserved block are LMDeploy's sink and have no slot.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .settings import RESERVED_BLOCKS

PADDING_SLOT = -1  # what a row writing into the reserved block reports (it owns no slot)


@dataclass
class Live:
    tokens: list[int] = field(default_factory=list)  # positions 0..len-1, KV written for all of them
    blocks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Planned:
    """One request of a step, checked and placed."""

    request_id: int
    new_tokens: tuple[int, ...]
    context_len: int
    blocks: tuple[int, ...]

    @property
    def num_new(self) -> int:
        return len(self.new_tokens)


class Requests:
    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, max_seqs: int, max_tokens: int):
        self.free = list(range(num_blocks - 1, RESERVED_BLOCKS - 1, -1))  # popped from the end: lowest first
        self.block_size, self.vocab, self.max_len = block_size, vocab, max_len
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.live: dict[int, Live] = {}

    def plan(self, requests) -> list[Planned]:
        """Check a step's requests and give each the blocks its tokens need. Raises ValueError
        for a step LMDeploy's scheduler could never produce, RuntimeError when the KV cache is full."""
        if not requests:
            raise ValueError("a step needs at least one request")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a request appears twice in one step: {sorted({i for i in ids if ids.count(i) > 1})}")
        total = sum(len(r.token_ids) for r in requests)
        if total > self.max_tokens:
            raise ValueError(f"the step has {total} tokens; max_num_batched_tokens (max_prefill_token_num) is "
                             f"{self.max_tokens}")
        running = set(self.live) | set(ids)
        if len(running) > self.max_seqs:
            raise ValueError(f"{len(running)} requests would be live; max_num_seqs (max_batch_size) is "
                             f"{self.max_seqs} (release finished requests first)")
        planned, grown, created = [], [], []
        try:
            for r in requests:
                planned.append(self._place(r, grown, created))
        except Exception:
            for live, count in grown:  # give back what this failed step took
                self.free.extend(reversed(live.blocks[len(live.blocks) - count:]))
                del live.blocks[len(live.blocks) - count:]
            for request_id in created:
                del self.live[request_id]
            raise
        return planned

    def _place(self, request, grown, created) -> Planned:
        tokens = tuple(int(t) for t in request.token_ids)
        if not tokens:
            raise ValueError(f"request {request.request_id} brings no tokens")
        bad = [t for t in tokens if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"request {request.request_id} has token ids outside the vocabulary 0..{self.vocab - 1}: "
                             f"{bad[:5]}")
        live = self.live.get(request.request_id)
        known = len(live.tokens) if live else 0
        if request.context_len < 0 or request.context_len > known:
            raise ValueError(f"request {request.request_id} says {request.context_len} tokens are cached; the engine "
                             f"holds {known} for it")
        end = request.context_len + len(tokens)
        if end > self.max_len:
            raise ValueError(f"request {request.request_id} would reach {end} tokens; max_model_len is {self.max_len}")
        if live is None:
            live = self.live[request.request_id] = Live()
            created.append(request.request_id)
        need = -(-end // self.block_size) - len(live.blocks)
        if need > len(self.free):
            raise RuntimeError(f"the KV cache is full: request {request.request_id} needs {need} more blocks of "
                               f"{self.block_size} tokens and {len(self.free)} are free")
        if need > 0:
            live.blocks += [self.free.pop() for _ in range(need)]
            grown.append((live, need))
        return Planned(request.request_id, tokens, request.context_len, tuple(live.blocks))

    def commit(self, planned: list[Planned]) -> None:
        """After the step ran: each request holds KV for its history and this step's tokens."""
        for q in planned:
            live = self.live[q.request_id]
            live.tokens = live.tokens[:q.context_len] + list(q.new_tokens)

    def release(self, request_id: int) -> None:
        live = self.live.pop(request_id, None)
        if live is not None:
            self.free.extend(reversed(live.blocks))

    def slot(self, request_id: int, position: int) -> int:
        """The slot a position of a live request is written to."""
        live = self.live.get(request_id)
        if live is None:
            raise ValueError(f"request {request_id} is not live in this engine")
        if not 0 <= position < len(live.blocks) * self.block_size:
            raise ValueError(f"request {request_id} holds blocks for positions 0..{len(live.blocks) * self.block_size - 1}"
                             f", not {position}")
        return slot_number(live.blocks[position // self.block_size], position % self.block_size, self.block_size)


def slot_number(block: int, offset: int, block_size: int) -> int:
    """A (block, offset) LMDeploy writes, as a kv_snapshot() slot; the reserved block has none."""
    return PADDING_SLOT if block < RESERVED_BLOCKS else (block - RESERVED_BLOCKS) * block_size + offset


def is_decoding(planned: list[Planned]) -> bool:
    """The step LMDeploy's graph runner may put in a decode graph: one token a request."""
    return all(q.num_new == 1 for q in planned)
