"""Static buffers: the inputs of every step, at fixed addresses, and how a plan gets into them.

Every step, eager or graph, reads its inputs from the same preallocated buffers: a graph was
captured against their addresses, so a step copies its data in and never swaps a tensor. All of
them are views into one device tensor, so a step's data travels in one host-to-device copy
(values and their destinations, from a pinned host buffer) and lands in one scatter kernel.

`stage` writes a plan into the pinned buffer; `transfer` is the copy and the scatter. An eager or
PIECEWISE step does both (`load`). A FULL graph records `transfer` as its first nodes, so a FULL
step only stages and replays: the device starts the step as soon as the graph is launched,
instead of after two more submissions. The extent a graph copies is fixed at capture, so a
FULL step stages the graph's row count (the plan's `staged_rows`), rows past its layout as
padding. A plan staged again after the planner updated it in place (the persistent batch)
writes only what an update changes: its real tokens, their requests' lengths, and the block
table rows that changed.
"""
from __future__ import annotations

import numpy as np
import torch

from .attention import Metadata
from .kv_cache import NULL_BLOCK
from .plan import StepPlan

TOKENS, ROWS, ROW_EDGES, TABLES = "tokens", "rows", "row edges", "tables"
# The one order of the inputs: in the packed device tensor (at their largest sizes) and in every
# staged step (at its sizes). Block tables come last: they are most of the values, written row by row.
FIELDS = (
    ("input_ids", TOKENS), ("positions", TOKENS), ("slot_mapping", TOKENS), ("token_req", TOKENS), ("lora_ids", TOKENS),
    ("seq_lens", ROWS), ("query_start_loc", ROW_EDGES), ("block_tables", TABLES),
)
NAMES = tuple(name for name, _ in FIELDS)
assert FIELDS[-1][1] == TABLES and all(kind != TABLES for _, kind in FIELDS[:-1])


def extents(tokens: int, rows: int, width: int) -> dict[str, int]:
    """How many values each input has in a step of `tokens` token rows and `rows` request rows."""
    size = {TOKENS: tokens, ROWS: rows, ROW_EDGES: rows + 1, TABLES: rows * width}
    return {name: size[kind] for name, kind in FIELDS}


def offsets(tokens: int, rows: int, width: int) -> dict[str, int]:
    """Where each input starts, inputs side by side in FIELDS order."""
    starts, at = {}, 0
    for name, length in extents(tokens, rows, width).items():
        starts[name] = at
        at += length
    return starts


class StaticBuffers:
    """Inputs of every step at fixed addresses, sized for the largest step, and the pinned buffer
    a step is staged in."""

    def __init__(self, max_tokens: int, max_rows: int, max_blocks: int, max_model_len: int, device):
        self.max_tokens, self.max_rows, self.max_blocks = max_tokens, max_rows, max_blocks
        lengths = extents(max_tokens, max_rows, max_blocks)
        self.offsets = offsets(max_tokens, max_rows, max_blocks)
        long = dict(dtype=torch.long, device=device)
        self.packed = torch.zeros(sum(lengths.values()), **long)
        for name, length in lengths.items():
            setattr(self, name, self.packed[self.offsets[name]: self.offsets[name] + length])
        self.block_tables = self.block_tables.view(max_rows, max_blocks)
        self.slot_mapping.fill_(-1)
        self.context_window = torch.arange(max_model_len, **long)
        cuda = torch.device(device).type == "cuda"
        # A step's values, then their destinations, side by side: one contiguous run, so the copy
        # is one DMA from pinned memory (a strided host view would be staged through pageable memory).
        self.host = torch.zeros(2 * len(self.packed), dtype=torch.long, pin_memory=cuda)
        self._host_values = self.host.numpy()
        self._host_items = memoryview(self._host_values)  # one value at a time, cheaper than numpy's indexing
        self._device_staging = torch.zeros(2 * len(self.packed), **long)
        # Recorded when a copy has left the pinned buffer; external, so that inside a graph it is a
        # node of its own and the host knows when a replay has read the buffer.
        self._copy_done = torch.cuda.Event(external=True) if cuda else None
        self._destinations: dict[tuple[int, int], tuple[np.ndarray, dict[str, int]]] = {}
        self._staged_destinations: np.ndarray | None = None  # whose destinations the pinned buffer holds
        self._staged_plan: StepPlan | None = None  # the plan the pinned buffer holds, at...
        self._staged_revision = -1  # ...this revision of it

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in NAMES}

    def _shape(self, tokens: int, rows: int) -> tuple[np.ndarray, dict[str, int]]:
        """(where a step of this shape goes in the packed tensor, where each input starts in it as staged)."""
        key = (tokens, rows)
        if key not in self._destinations:
            self._destinations[key] = (np.concatenate([
                self.offsets[name] + np.arange(length)
                for name, length in extents(tokens, rows, self.max_blocks).items()]),
                offsets(tokens, rows, self.max_blocks))
        return self._destinations[key]

    # -- staging ------------------------------------------------------------------------------
    def stage(self, plan: StepPlan) -> int:
        """Write a plan into the pinned host buffer; return how many values `transfer` moves."""
        num_padded_tokens, rows, real_rows = plan.num_padded_tokens, plan.staged_rows, plan.num_rows
        if num_padded_tokens > self.max_tokens or rows > self.max_rows:
            raise ValueError(f"a step of {num_padded_tokens} tokens in {rows} rows does not fit static buffers of "
                             f"{self.max_tokens} tokens and {self.max_rows} rows")
        if real_rows > rows:
            raise ValueError(f"a step of {real_rows} request rows does not fit the {rows} rows staged for it")
        destinations, starts = self._shape(num_padded_tokens, rows)
        m = len(destinations)
        self._wait_for_last_copy()
        if plan is self._staged_plan:
            self._write_updates(plan, starts)
        else:
            self._write(plan, num_padded_tokens, rows, m)
        if self._staged_destinations is not destinations:  # the last step of this shape left them there
            self._host_values[m: 2 * m] = destinations
            self._staged_destinations = destinations
        self._staged_plan, self._staged_revision = plan, plan.revision
        return m

    def _write(self, plan: StepPlan, num_padded_tokens: int, rows: int, m: int) -> None:
        """The whole plan: every input but the block tables in one assignment (numpy's cost is per
        call at a small batch), rows past the layout's as length 0 starting at the end; then the
        block tables row by row."""
        pad = rows - plan.num_rows
        head = []
        for name, kind in FIELDS[:-1]:
            head += getattr(plan, name)
            if kind is ROWS:
                head += [0] * pad
            elif kind is ROW_EDGES:
                head += [num_padded_tokens] * pad
        at = m - rows * self.max_blocks
        if len(head) != at:
            raise ValueError(f"a plan of {num_padded_tokens} tokens in {plan.num_rows} rows needs {num_padded_tokens} token ids, positions, slots "
                             f"and token rows, {plan.num_rows} sequence lengths and {plan.num_rows + 1} query starts")
        host = self._host_values
        host[:at] = head
        tables = host[at:m].reshape(rows, self.max_blocks)
        tables.fill(NULL_BLOCK)
        for row, table in enumerate(plan.block_tables):
            self._check_table(table)
            tables[row, : len(table)] = table

    def _write_updates(self, plan: StepPlan, at: dict[str, int]) -> None:
        """What the planner changes in a plan it updates: the real tokens' ids, positions and slots,
        their requests' lengths, and the block table rows changed since it was last staged. Value
        by value: at the batch sizes where host time counts, cheaper than numpy's per-call cost."""
        values, ids, positions, slots = self._host_items, at["input_ids"], at["positions"], at["slot_mapping"]
        loras = at["lora_ids"]
        for t in range(plan.num_real_tokens):
            values[loras + t] = plan.lora_ids[t]
            values[ids + t] = plan.input_ids[t]
            values[positions + t] = plan.positions[t]
            values[slots + t] = plan.slot_mapping[t]
        lengths, tables, width = at["seq_lens"], at["block_tables"], self.max_blocks
        for row in range(plan.num_real_rows):
            values[lengths + row] = plan.seq_lens[row]
            if plan.table_revisions[row] > self._staged_revision:
                table = plan.block_tables[row]
                self._check_table(table)
                start = tables + row * width
                self._host_values[start: start + width] = NULL_BLOCK
                self._host_values[start: start + len(table)] = table

    def _check_table(self, table) -> None:
        if len(table) > self.max_blocks:
            raise ValueError(f"a request needs {len(table)} blocks; max_model_len allows {self.max_blocks}")

    def _wait_for_last_copy(self) -> None:
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the last copy (eager, or a replay's first node) has read the buffer

    def transfer(self, m: int) -> None:
        """Copy the `m` staged values and their destinations to the device and scatter them into
        the buffers (in place: the addresses never change). Runs eagerly or inside a capture."""
        staging = self._device_staging[: 2 * m]
        staging.copy_(self.host[: 2 * m], non_blocking=True)
        if self._copy_done is not None:
            self._copy_done.record()
        self.packed.index_copy_(0, staging[m:], staging[:m])

    def load(self, plan: StepPlan) -> None:
        """Stage and transfer a plan: the static buffers hold it when the device gets there."""
        self.transfer(self.stage(plan))

    # -- what a step and the harness read -----------------------------------------------------
    def metadata(self, plan: StepPlan) -> Metadata:
        """Views for a step at the plan's padded size, with its (frozen) layout decisions."""
        num_padded_tokens = plan.num_padded_tokens
        return Metadata(
            num_padded_tokens=num_padded_tokens, uniform_q=plan.uniform_q, num_padded_rows=plan.num_rows, host_seq_lens=plan.seq_lens,
            positions=self.positions[:num_padded_tokens], slot_mapping=self.slot_mapping[:num_padded_tokens], token_req=self.token_req[:num_padded_tokens],
            block_tables=self.block_tables, seq_lens=self.seq_lens, query_start_loc=self.query_start_loc,
            context_window=self.context_window,
        )

    def inputs(self, num_padded_tokens: int) -> dict[str, torch.Tensor]:
        """Copies of the token ids, positions, slots and adapter ids of the first num_padded_tokens token rows."""
        return {"token_ids": self.input_ids[:num_padded_tokens].clone(), "positions": self.positions[:num_padded_tokens].clone(),
                "slot_mapping": self.slot_mapping[:num_padded_tokens].clone(),
                "lora_ids": self.lora_ids[:num_padded_tokens].clone()}

    def request_rows(self, num_rows: int) -> dict[str, torch.Tensor]:
        """Copies of the sequence lengths, query starts and block tables of the first num_rows request rows."""
        return {"seq_lens": self.seq_lens[:num_rows].clone(), "query_start_loc": self.query_start_loc[:num_rows + 1].clone(),
                "block_tables": self.block_tables[:num_rows].clone()}

    def swap(self, name: str) -> None:
        """Put a copy of one input at another address (same values): what a graph must notice."""
        if name not in NAMES:
            raise ValueError(f"no static buffer {name!r}; the buffers are {', '.join(NAMES)}")
        setattr(self, name, getattr(self, name).clone())
