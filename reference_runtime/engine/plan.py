"""Planning a step: requests in, a StepPlan out, before anything touches the device.

The planner decides what the step runs (the dispatcher's answer for the batch's shape, agreed
with the other data-parallel ranks where there are some) and lays the batch out at its padded
size in host arrays: one token row per token, one request row per request, then padding. Padded
rows are token 0 at position 0 with slot -1 (no KV write), in dummy requests whose block table
is the null block.

A uniform decode step of the shape the last one had updates that step's plan in place, as vLLM's
persistent batch does: each request's tokens, positions, slots and length, and its block table
row only where the table grew or another request took the row. Planning the whole step again
costs more host time than the rest of a FULL step before its launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..policy import BatchDescriptor, CUDAGraphMode, Dispatcher
from .kv_cache import NULL_BLOCK, BlockAllocator
from .lora import active_adapters

NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


@dataclass
class StepPlan:
    """One step, decided and laid out. Token rows: `num_padded_tokens` (the real ones first);
    request rows: `num_rows` laid out (the requests, then dummy rows of padding), of which the
    static buffers get `staged_rows` (a FULL graph copies a fixed number; rows past the layout
    are empty: length 0, the null block)."""

    mode: CUDAGraphMode
    key: BatchDescriptor | None  # the graph the step replays; None: eager
    num_real_tokens: int
    num_padded_tokens: int
    num_real_rows: int
    staged_rows: int
    uniform_q: int | None  # tokens per request row when the layout is [rows, q], else None
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    token_req: list[int]  # the request row of each token row
    block_tables: list[list[int]]  # per request row
    seq_lens: list[int]  # per request row: its context after this step
    query_start_loc: list[int]  # per request row and one past the last
    # per token row: its request's adapter id (0: none, padded rows too; lora.py)
    lora_ids: list[int] = field(default_factory=list)
    # the adapter count the forward runs with: the key's, or an eager step's batch's (0: no LoRA op)
    num_active_loras: int = 0
    # The persistent batch: a plan the planner updates in place counts its updates (`revision`) and
    # the update at which each real row's block table last changed, so that what staged an earlier
    # revision writes only those rows again. `owners`: the allocator's table object of each real row.
    revision: int = 0
    table_revisions: list[int] = field(default_factory=list, repr=False)
    owners: list = field(default_factory=list, repr=False)

    @property
    def num_rows(self) -> int:
        return len(self.seq_lens)


def query_len_if_uniform(requests, q: int) -> int | None:
    """q when every request brings exactly q tokens (a uniform decode batch), else None."""
    for request in requests:  # a loop, not all(): this runs twice a step, and decode batches are small
        if len(request.token_ids) != q:
            return None
    return q if requests else None


class Planner:
    """Requests -> StepPlan. Holds the KV block allocator (it hands out blocks as a scheduler
    would), the dispatcher's answers by batch shape, and the persistent batch.

    `consensus` (data_parallel.DataParallel) agrees the step with the other ranks first."""

    def __init__(self, dispatcher: Dispatcher, allocator: BlockAllocator, max_rows: int, consensus=None):
        self.dispatcher, self.allocator, self.max_rows, self.consensus = dispatcher, allocator, max_rows, consensus
        self.q = dispatcher.config.query_len
        self.persistent: StepPlan | None = None  # the persistent batch
        self._answers: dict[tuple[int, int, bool], tuple] = {}

    # -- what the step runs -------------------------------------------------------------------
    def _is_uniform(self, requests) -> bool:
        """A uniform decode batch: every request brings exactly q tokens."""
        return query_len_if_uniform(requests, self.q) is not None

    def decide(self, num_real_tokens: int, num_real_rows: int, uniform: bool, captured: bool,
               num_active_loras: int = 0) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """The mode and graph key of a batch of this shape (and adapter count); eager and unpadded
        until graphs are captured. The dispatcher's keys are fixed once built, so each shape is asked once."""
        if self.consensus is not None:  # an idle rank (no tokens) joins too, and runs padding rows only
            return self.consensus.dispatch(self.dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        shape = (num_real_tokens, num_real_rows, uniform, num_active_loras)
        answer = self._answers.get(shape)
        if answer is None:
            answer = self.dispatcher.dispatch(num_real_tokens, num_real_rows, uniform, num_active_loras)
            if len(self._answers) < 4096:  # a bound for long services of mixed batches
                self._answers[shape] = answer
        mode, key = answer
        if mode is not NONE and not captured:
            return NONE, BatchDescriptor(num_real_tokens, num_real_rows)
        return answer

    def plan(self, requests, captured: bool) -> StepPlan:
        """The step as served: dispatched, then laid out at the size its graph takes."""
        loras = active_adapters(requests)
        mode, key = self.decide(sum(len(r.token_ids) for r in requests), len(requests), self._is_uniform(requests),
                                captured, loras)
        if mode is NONE:
            return self.lay_out(requests, NONE, None, key.num_padded_tokens)
        return self.lay_out(requests, mode, key, key.num_padded_tokens, uniform=key.uniform if mode is FULL else None)

    def plan_eager(self, requests, num_padded_tokens: int) -> StepPlan:
        """The step run eagerly at a given size, laid out as a FULL graph of that size would be."""
        mode, key = self.dispatcher.dispatch(sum(len(r.token_ids) for r in requests), len(requests),
                                             self._is_uniform(requests), active_adapters(requests))
        same_shape = mode is FULL and key.num_padded_tokens == num_padded_tokens
        return self.lay_out(requests, NONE, None, num_padded_tokens, uniform=key.uniform if same_shape else None)

    def dummy(self, mode: CUDAGraphMode, key: BatchDescriptor) -> StepPlan:
        """A batch of padding rows only, at a graph's size: what warm-up and capture run."""
        return self.lay_out([], mode, key, key.num_padded_tokens, uniform=key.uniform if mode is FULL else False)

    def _staged_rows(self, mode: CUDAGraphMode, key: BatchDescriptor | None, num_rows: int) -> int:
        """Request rows the static buffers get. A FULL graph copies a fixed number, set at capture:
        num_padded_tokens / q in a uniform layout; in a mixed one at most a row per token and the padding's row."""
        if mode is not FULL:
            return num_rows
        num_padded_tokens = key.num_padded_tokens
        return num_padded_tokens // self.q if key.uniform else min(num_padded_tokens + 1, self.max_rows)

    # -- laying it out ------------------------------------------------------------------------
    def lay_out(self, requests, mode, key, num_padded_tokens: int, uniform: bool | None = None) -> StepPlan:
        """The requests laid out at num_padded_tokens token rows. A uniform layout is [requests, q]
        (padding: dummy requests of q tokens); a mixed one puts every padded row in one dummy
        request. `uniform=None`: uniform whenever the batch is and the size divides evenly."""
        fits = num_padded_tokens % self.q == 0 and num_padded_tokens // self.q <= self.max_rows
        batch_uniform = not requests or query_len_if_uniform(requests, self.q) is not None
        if uniform is None:
            uniform = bool(requests) and fits and batch_uniform
        elif uniform and not (fits and batch_uniform):
            raise ValueError(f"a uniform layout needs requests of {self.q} tokens and a size divisible by {self.q}")
        if uniform and mode is FULL and requests:
            kept = self._update_persistent(requests, key, num_padded_tokens)
            if kept is not None:
                return kept
        plan = self.fresh(requests, mode, key, num_padded_tokens, self.q if uniform else None)
        if uniform and mode is FULL and requests:
            self.persistent = plan
        return plan

    def fresh(self, requests, mode, key, num_padded_tokens: int, uniform_q: int | None) -> StepPlan:
        """A new plan: every request's rows from the allocator's tables, then the padding."""
        real = sum(len(r.token_ids) for r in requests)
        if num_padded_tokens < real:
            raise ValueError(f"cannot pad {real} tokens down to {num_padded_tokens}")
        allocator = self.allocator
        ids, positions, slots, token_req, tables, owners, seq_lens, starts = [], [], [], [], [], [], [], [0]
        lora_ids = []
        for row, request in enumerate(requests):
            tokens, start = request.token_ids, request.context_len
            lora_ids += [getattr(request, "lora", None) or 0] * len(tokens)
            total = start + len(tokens)
            table = allocator.ensure(request.request_id, total)
            tables.append(list(table))
            owners.append(table)
            for position, token in enumerate(tokens, start):  # most steps are decode: one token a request
                ids.append(token)
                positions.append(position)
                slots.append(allocator.slot(request.request_id, position))
                token_req.append(row)
            seq_lens.append(total)
            starts.append(starts[-1] + len(tokens))
        pad = num_padded_tokens - real
        dummy_sizes = [uniform_q] * (pad // uniform_q) if uniform_q is not None else ([pad] if pad else [])
        for size in dummy_sizes:
            row = len(seq_lens)
            ids += [0] * size
            lora_ids += [0] * size
            positions += list(range(size)) if uniform_q is not None else [0] * size
            slots += [-1] * size
            token_req += [row] * size
            tables.append([NULL_BLOCK])
            seq_lens.append(size if uniform_q is not None else 1)
            starts.append(starts[-1] + size)
        if len(seq_lens) > self.max_rows:
            raise ValueError(f"{len(seq_lens)} request rows do not fit the {self.max_rows} rows of the static buffers")
        loras = key.num_active_loras if key is not None else active_adapters(requests)
        return StepPlan(mode, key, real, num_padded_tokens, len(requests), self._staged_rows(mode, key, len(seq_lens)),
                        uniform_q, ids, positions, slots, token_req, tables, seq_lens, starts, lora_ids, loras,
                        table_revisions=[0] * len(requests), owners=owners)

    def _update_persistent(self, requests, key, num_padded_tokens: int) -> StepPlan | None:
        """The persistent batch's plan, updated in place to what `fresh` would give, if the last
        uniform step had this size and as many requests; else None."""
        kept = self.persistent
        if kept is None or kept.num_padded_tokens != num_padded_tokens or kept.num_real_rows != len(requests) \
                or kept.key != key:
            return None
        q, allocator = self.q, self.allocator
        ids, positions, slots, seq_lens, owners = kept.input_ids, kept.positions, kept.slot_mapping, kept.seq_lens, kept.owners
        kept.revision += 1
        for row, request in enumerate(requests):
            start = request.context_len
            table = allocator.ensure(request.request_id, start + q)
            if owners[row] is not table or len(kept.block_tables[row]) != len(table):  # another's, or grown
                kept.block_tables[row] = list(table)
                owners[row] = table
                kept.table_revisions[row] = kept.revision
            lora = getattr(request, "lora", None) or 0
            for j, token in enumerate(request.token_ids):
                t, position = row * q + j, start + j
                kept.lora_ids[t] = lora
                ids[t] = token
                positions[t] = position
                slots[t] = allocator.slot(request.request_id, position)
            seq_lens[row] = start + q
        return kept

    def release(self, request_id: int) -> None:
        self.allocator.release(request_id)
