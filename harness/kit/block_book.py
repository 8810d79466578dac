"""The scheduler's books for a runtime that drives a real engine's model runner with the suites'
exact batches (plugins/vllm-engine, plugins/lmdeploy-engine): which requests are live, the tokens
whose KV each one holds, and its KV blocks. Pure Python, so it is tested on any machine.

`plan(requests)` checks a step as the engine's own scheduler would have made it (or refuses it)
and gives each request the blocks its tokens need, taking them back if the step is refused;
`commit(placed)` records the KV the step wrote; `release(request_id)` frees a request's blocks.
A runtime subclasses it for what its engine names differently: the record of a placed request
(`placed`; `Placed` where the engine needs nothing more), the record of a live one (`new_live`),
and, where it numbers them otherwise, the slot a position is written to.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.protocol import KVCacheFull


DEFAULT_KV_TOKENS = 4096  # the KV cache's size in tokens where EngineConfig.kv_tokens leaves it to the runtime


def num_blocks_for(kv_tokens: int | None, block_size: int, max_seqs: int, reserved: int) -> int:
    """A KV cache of a fixed number of blocks (the harness inspects every slot, so not what memory
    leaves): the engine's reserved blocks, the blocks `kv_tokens` need, and one partly filled block
    a request."""
    return reserved + -(-(kv_tokens or DEFAULT_KV_TOKENS) // block_size) + max_seqs


@dataclass
class Live:
    tokens: list[int] = field(default_factory=list)  # positions 0..len-1, KV written for all of them
    blocks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Placed:
    """One request of a step, checked and placed: this step's tokens after `context_len` cached ones,
    in these blocks."""

    request_id: int
    new_tokens: tuple[int, ...]
    context_len: int
    blocks: tuple[int, ...]

    @property
    def num_new(self) -> int:
        return len(self.new_tokens)


class BlockBook:
    TOKEN_LIMIT = "max_num_batched_tokens"  # how the engine calls its limits, for refusals
    SEQ_LIMIT = "max_num_seqs"

    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, max_seqs: int, max_tokens: int,
                 first_block: int = 1):
        self.free = list(range(num_blocks - 1, first_block - 1, -1))  # popped from the end: lowest first
        self.block_size, self.vocab, self.max_len = block_size, vocab, max_len
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.live: dict[int, Live] = {}

    def new_live(self, request_id: int) -> Live:
        return Live()

    def placed(self, request, live: Live, tokens: tuple[int, ...]):
        """The record of one placed request that the runtime hands its engine: it has at least
        `request_id`, `context_len` and `new_tokens` (this step's), which `commit` reads."""
        return Placed(request.request_id, tokens, request.context_len, tuple(live.blocks))

    def plan(self, requests) -> list:
        """Check a step's requests and give each the blocks its tokens need. Raises ValueError for
        a step the engine's scheduler could never produce, KVCacheFull (a RuntimeError) when the KV
        cache is full."""
        if not requests:
            raise ValueError("a step needs at least one request")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a request appears twice in one step: {sorted({i for i in ids if ids.count(i) > 1})}")
        total = sum(len(r.token_ids) for r in requests)
        if total > self.max_tokens:
            raise ValueError(f"the step has {total} tokens; {self.TOKEN_LIMIT} is {self.max_tokens}")
        running = set(self.live) | set(ids)
        if len(running) > self.max_seqs:
            raise ValueError(f"{len(running)} requests would be live; {self.SEQ_LIMIT} is {self.max_seqs} "
                             "(release finished requests first)")
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

    def _place(self, request, grown, created):
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
            live = self.live[request.request_id] = self.new_live(request.request_id)
            created.append(request.request_id)
        need = -(-end // self.block_size) - len(live.blocks)
        if need > len(self.free):
            raise KVCacheFull(f"the KV cache is full: request {request.request_id} needs {need} more blocks of "
                               f"{self.block_size} tokens and {len(self.free)} are free")
        if need > 0:
            live.blocks += [self.free.pop() for _ in range(need)]
            grown.append((live, need))
        return self.placed(request, live, tokens)

    def commit(self, planned) -> None:
        """After the step ran: each request holds KV for its history and this step's tokens."""
        for q in planned:
            live = self.live[q.request_id]
            live.tokens = live.tokens[:q.context_len] + list(q.new_tokens)

    def release(self, request_id: int) -> Live | None:
        live = self.live.pop(request_id, None)
        if live is not None:
            self.free.extend(reversed(live.blocks))
        return live

    def slot(self, request_id: int, position: int, kernel_block_size: int | None = None) -> int:
        """The KV slot a position of a live request is written to: its blocks expanded to the attention
        kernel's blocks where those are smaller (`kernel_block_size`, a divisor of `block_size`)."""
        live = self.held(request_id, position)
        kernel_block_size = kernel_block_size or self.block_size
        per_block = self.block_size // kernel_block_size
        kernel_block = position // kernel_block_size
        block = live.blocks[kernel_block // per_block] * per_block + kernel_block % per_block
        return block * kernel_block_size + position % kernel_block_size

    def misplaced(self, slots, rows, kernel_block_size: int | None = None) -> list[str]:
        """What differs where an engine computed KV `slots` (one a token row) for `rows` ((placed
        request, its token rows)) from the slots these books give each of their tokens: a line each."""
        found = []
        for q, span in rows:
            want = [self.slot(q.request_id, q.context_len + j, kernel_block_size) for j in range(q.num_new)]
            got = list(slots[span.start:span.stop])
            if got != want:
                found.append(f"request {q.request_id}'s tokens in KV slots {got}; the block bookkeeping says {want}")
        return found

    def held(self, request_id: int, position: int) -> Live:
        """The live request whose blocks hold `position`; ValueError where none does."""
        live = self.live.get(request_id)
        if live is None:
            raise ValueError(f"request {request_id} is not live in this engine")
        if not 0 <= position < len(live.blocks) * self.block_size:
            raise ValueError(f"request {request_id} holds blocks for positions 0..{len(live.blocks) * self.block_size - 1}"
                             f", not {position}")
        return live


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "Live", "Placed", "BlockBook", "num_blocks_for",
]
