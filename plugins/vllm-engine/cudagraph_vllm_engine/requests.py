"""This runtime's scheduler state: which requests are live, the tokens whose KV each one holds,
and its KV blocks. Pure Python (no vLLM, no torch), so it is tested on any machine.

The runtime plays vLLM's scheduler: each step it hands the model runner every scheduled request
as vLLM's scheduler hands a resumed or streaming request (`NewRequestData` with the full token
list and `num_computed_tokens`), so a step runs exactly the tokens the harness gave, at the
context lengths it gave, and re-running a step rewrites the same KV slots.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Live:
    vllm_id: str
    tokens: list[int] = field(default_factory=list)  # positions 0..len-1, KV written for all of them
    blocks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Planned:
    """One request of a step, checked and placed."""

    request_id: int
    vllm_id: str
    all_tokens: tuple[int, ...]  # history up to context_len, then this step's tokens
    context_len: int
    num_new: int
    blocks: tuple[int, ...]


class Requests:
    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, max_seqs: int, max_tokens: int):
        # Block 0 is vLLM's null block (its BlockPool never hands it out), so neither do we.
        self.free = list(range(num_blocks - 1, 0, -1))
        self.block_size, self.vocab, self.max_len = block_size, vocab, max_len
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.live: dict[int, Live] = {}
        self.finished: set[str] = set()  # vLLM ids released since the last step (the runner forgets them then)

    def plan(self, requests) -> list[Planned]:
        """Check a step's requests and give each the blocks its tokens need. Raises ValueError
        for a step vLLM's scheduler could never produce, RuntimeError when the KV cache is full."""
        if not requests:
            raise ValueError("a step needs at least one request")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a request appears twice in one step: {sorted(i for i in ids if ids.count(i) > 1)}")
        total = sum(len(r.token_ids) for r in requests)
        if total > self.max_tokens:
            raise ValueError(f"the step has {total} tokens; max_num_batched_tokens is {self.max_tokens}")
        running = set(self.live) | set(ids)
        if len(running) > self.max_seqs:
            raise ValueError(f"{len(running)} requests would be live; max_num_seqs is {self.max_seqs} "
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

    def _place(self, request, grown, created) -> Planned:
        tokens = [int(t) for t in request.token_ids]
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
            live = Live(f"req-{request.request_id}")
            self.live[request.request_id] = live
            created.append(request.request_id)
        need = -(-end // self.block_size) - len(live.blocks)
        if need > len(self.free):
            raise RuntimeError(f"the KV cache is full: request {request.request_id} needs {need} more blocks of "
                               f"{self.block_size} tokens and {len(self.free)} are free")
        if need > 0:
            live.blocks += [self.free.pop() for _ in range(need)]
            grown.append((live, need))
        history = live.tokens[:request.context_len]
        return Planned(request.request_id, live.vllm_id, tuple(history + tokens), request.context_len, len(tokens),
                       tuple(live.blocks))

    def commit(self, planned: list[Planned]) -> None:
        """After the step ran: each request holds KV for its history and this step's tokens."""
        for p in planned:
            self.live[p.request_id].tokens = list(p.all_tokens)

    def release(self, request_id: int) -> None:
        live = self.live.pop(request_id, None)
        if live is not None:
            self.free.extend(reversed(live.blocks))
            self.finished.add(live.vllm_id)

    def take_finished(self) -> set[str]:
        finished, self.finished = self.finished, set()
        return finished

    def slot(self, request_id: int, position: int, kernel_block_size: int) -> int:
        """The KV slot vLLM writes for a position: its block table expanded to kernel blocks
        (vllm/v1/worker/gpu/block_table.py: append_block_ids, _compute_slot_mappings_kernel)."""
        live = self.live.get(request_id)
        if live is None:
            raise ValueError(f"request {request_id} is not live in this engine")
        if not 0 <= position < len(live.blocks) * self.block_size:
            raise ValueError(f"request {request_id} holds blocks for positions 0..{len(live.blocks) * self.block_size - 1}"
                             f", not {position}")
        per_block = self.block_size // kernel_block_size
        kernel_block = position // kernel_block_size
        block = live.blocks[kernel_block // per_block] * per_block + kernel_block % per_block
        return block * kernel_block_size + position % kernel_block_size
