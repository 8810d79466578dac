"""Static buffers and the layout of one step in them.

Every step, eager or graph, reads its inputs from the same preallocated buffers: a graph was
captured against their addresses, so a step copies its data in and never swaps a tensor. Rows
past the real tokens are padding: token 0, position 0, slot -1 (no KV write), in dummy
requests whose block table points at the null block.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import Metadata
from .kv_cache import NULL_BLOCK, BlockAllocator


@dataclass(frozen=True)
class Request:
    request_id: int
    token_ids: tuple[int, ...]
    context_len: int


@dataclass
class Layout:
    """Host-side arrays of one step at padded size num_tokens, ready to copy into the buffers."""

    num_tokens: int  # padded
    num_real_tokens: int
    uniform_q: int | None
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    token_req: list[int]
    block_tables: list[list[int]]
    seq_lens: list[int]
    query_start_loc: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)


def query_len_if_uniform(requests, q: int) -> int | None:
    return q if requests and all(len(r.token_ids) == q for r in requests) else None


def plan_layout(requests: list[Request], allocator: BlockAllocator, num_tokens: int, q: int,
                max_rows: int, uniform: bool | None = None) -> Layout:
    """Lay the real requests out, then pad to num_tokens with dummy rows.

    A uniform layout is [requests, q] (padding = dummy requests of q tokens); a mixed layout
    puts all padded rows in one dummy request. `uniform=None` picks uniform whenever the batch
    is uniform and divides evenly; a captured graph passes the layout it was captured with.
    """
    real = sum(len(r.token_ids) for r in requests)
    if num_tokens < real:
        raise ValueError(f"cannot pad {real} tokens down to {num_tokens}")
    fits = num_tokens % q == 0 and num_tokens // q <= max_rows
    batch_uniform = not requests or query_len_if_uniform(requests, q) is not None
    if uniform is None:
        uniform = bool(requests) and fits and batch_uniform
    elif uniform and not (fits and batch_uniform):
        raise ValueError(f"a uniform layout needs requests of {q} tokens and a size divisible by {q}")
    uniform = q if uniform else None
    ids, positions, slots, token_req, tables, seq_lens, starts = [], [], [], [], [], [], [0]
    for row, request in enumerate(requests):
        tokens, start = request.token_ids, request.context_len
        total = start + len(tokens)
        tables.append(list(allocator.ensure(request.request_id, total)))
        for position, token in enumerate(tokens, start):  # most steps are decode: one token a request
            ids.append(token)
            positions.append(position)
            slots.append(allocator.slot(request.request_id, position))
            token_req.append(row)
        seq_lens.append(total)
        starts.append(starts[-1] + len(tokens))
    pad = num_tokens - real
    dummy_sizes = [q] * (pad // q) if uniform is not None else ([pad] if pad else [])
    for size in dummy_sizes:
        row = len(seq_lens)
        ids += [0] * size
        positions += list(range(size)) if uniform is not None else [0] * size
        slots += [-1] * size
        token_req += [row] * size
        tables.append([NULL_BLOCK])
        seq_lens.append(size if uniform is not None else 1)
        starts.append(starts[-1] + size)
    if len(seq_lens) > max_rows:
        raise ValueError(f"{len(seq_lens)} request rows do not fit the {max_rows} rows of the static buffers")
    return Layout(num_tokens, real, uniform, ids, positions, slots, token_req, tables,
                  seq_lens, starts)


@dataclass
class KeptRows:
    """A uniform step's layout, kept with what it left in the pinned buffer for the next step of its
    shape, and per request row the allocator's block table written there (the list itself, so that
    another request's table of the same length is never taken for it; None: not known)."""

    layout: Layout
    destinations: np.ndarray
    tables: list


class StaticBuffers:
    """Inputs of every step at fixed addresses, sized for the largest step.

    All of them are views into one device tensor, so a step's data travels in one host-to-device
    copy (values and their destinations, from a pinned host buffer) and lands in one scatter
    kernel. `stage` writes a step into the pinned buffer; `transfer` is the copy and the scatter.
    An eager or PIECEWISE step does both (`load`). A FULL graph records `transfer` as its first
    nodes, so a FULL step only stages and replays: the device starts the step as soon as the
    graph is launched, instead of after two more submissions (on the H200, `small` at batch 1,
    1057 -> 995 us with the host waiting for the step). The extent a graph copies is fixed at
    capture, so a FULL step stages the graph's row count, rows past its layout as padding.

    A uniform step leaves its layout and rows for the next step of the same shape and request
    count, as vLLM's persistent batch does: `restage` updates only each request's tokens,
    positions, slots and length, and its block table row when the table grew or another request
    took the row, in the layout and the pinned buffer alike. Any other staging forgets them. (On
    the H200 at batch 1, planning and staging were 16 of the ~20 us of host time before a FULL
    step's launch.)
    """

    NAMES = ("input_ids", "positions", "slot_mapping", "token_req", "block_tables", "seq_lens", "query_start_loc")

    def __init__(self, max_tokens: int, max_rows: int, max_blocks: int, max_model_len: int, device):
        self.max_tokens, self.max_rows, self.max_blocks = max_tokens, max_rows, max_blocks
        lengths = {"input_ids": max_tokens, "positions": max_tokens, "slot_mapping": max_tokens,
                   "token_req": max_tokens, "seq_lens": max_rows, "query_start_loc": max_rows + 1,
                   "block_tables": max_rows * max_blocks}
        self.offsets, total = {}, 0
        for name, length in lengths.items():
            self.offsets[name] = total
            total += length
        long = dict(dtype=torch.long, device=device)
        self.packed = torch.zeros(total, **long)
        for name, length in lengths.items():
            setattr(self, name, self.packed[self.offsets[name]: self.offsets[name] + length])
        self.block_tables = self.block_tables.view(max_rows, max_blocks)
        self.slot_mapping.fill_(-1)
        self.context_window = torch.arange(max_model_len, **long)
        cuda = torch.device(device).type == "cuda"
        # A step's values, then their destinations, side by side: one contiguous run, so the copy
        # is one DMA from pinned memory (a strided host view would be staged through pageable memory).
        self._host = torch.zeros(2 * total, dtype=torch.long, pin_memory=cuda)
        self._host_np = self._host.numpy()
        self._host_items = memoryview(self._host_np)  # one value at a time, cheaper than numpy's indexing
        self._device_staging = torch.zeros(2 * total, **long)
        # Recorded when a copy has left the pinned buffer; external, so that inside a graph it is a
        # node of its own and the host knows when a replay has read the buffer.
        self._copy_done = torch.cuda.Event(external=True) if cuda else None
        self._destinations: dict[tuple[int, int], np.ndarray] = {}
        self._staged_for: np.ndarray | None = None  # whose destinations the pinned buffer holds
        self._kept: KeptRows | None = None  # what restage may reuse

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.NAMES}

    def addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.tensors().items()}

    def _where(self, tokens: int, rows: int) -> np.ndarray:
        """Where a step of `tokens` token rows and `rows` request rows writes in the packed tensor."""
        key = (tokens, rows)
        if key not in self._destinations:
            sizes = {"input_ids": tokens, "positions": tokens, "slot_mapping": tokens, "token_req": tokens,
                     "seq_lens": rows, "query_start_loc": rows + 1, "block_tables": rows * self.max_blocks}
            self._destinations[key] = np.concatenate([self.offsets[name] + np.arange(size)
                                                      for name, size in sizes.items()])
        return self._destinations[key]

    def stage(self, layout: Layout, rows: int | None = None) -> int:
        """Write a step's layout into the pinned host buffer; return how many values `transfer`
        moves. `rows` request rows are written (the layout's by default); rows past the layout's
        are padding: length 0, no tokens, the null block. A uniform layout is kept for `restage`
        (`forget` it when it is not what planning gives, as a padding fill is not)."""
        n, real_rows = layout.num_tokens, layout.num_reqs
        rows = real_rows if rows is None else rows
        if n > self.max_tokens or rows > self.max_rows:
            raise ValueError(f"a step of {n} tokens in {rows} rows does not fit static buffers of "
                             f"{self.max_tokens} tokens and {self.max_rows} rows")
        if real_rows > rows:
            raise ValueError(f"a step of {real_rows} request rows does not fit the {rows} rows staged for it")
        width = self.max_blocks
        destinations = self._where(n, rows)
        m = len(destinations)
        self._kept = None
        self._wait_for_last_copy()
        # The token rows and the request rows' lengths and starts in one assignment (numpy's cost is
        # per call at a small batch), padded rows as length 0 starting at the end; the block tables
        # row by row (the most of the values, and mostly null).
        pad = rows - real_rows
        head = (layout.input_ids + layout.positions + layout.slot_mapping + layout.token_req + layout.seq_lens
                + [0] * pad + layout.query_start_loc + [n] * pad)
        at = m - rows * width  # where the block tables start (they come last, see _where)
        if len(head) != at:
            raise ValueError(f"a layout of {n} tokens in {real_rows} rows needs {n} token ids, positions, slots and "
                             f"token rows, {real_rows} sequence lengths and {real_rows + 1} query starts")
        host = self._host_np
        host[:at] = head
        tables = host[at:m].reshape(rows, width)
        tables.fill(NULL_BLOCK)
        for row, table in enumerate(layout.block_tables):
            if len(table) > width:
                raise ValueError(f"a request needs {len(table)} blocks; max_model_len allows {width}")
            tables[row, : len(table)] = table
        if self._staged_for is not destinations:  # the destinations of the last step of this shape are still there
            host[m: 2 * m] = destinations
            self._staged_for = destinations
        if layout.uniform_q is not None:
            self._kept = KeptRows(layout, destinations, [None] * (layout.num_real_tokens // layout.uniform_q))
        return m

    def forget(self) -> None:
        """Let no later step restage over what is staged now."""
        self._kept = None

    def restage(self, requests, allocator: BlockAllocator, num_tokens: int, rows: int) -> Layout | None:
        """Stage a uniform step over the layout and rows the last step kept, updated in place to what
        plan_layout and `stage` would give; None, with nothing written, unless the last staging
        kept a layout of this shape for as many requests of its query length."""
        kept = self._kept
        if kept is None or len(kept.tables) != len(requests) or kept.destinations is not self._where(num_tokens, rows):
            return None
        layout = kept.layout
        n, q, width = num_tokens, layout.uniform_q, self.max_blocks
        if requests and query_len_if_uniform(requests, q) is None:
            return None
        self._wait_for_last_copy()
        values, tables_at = self._host_items, len(kept.destinations) - rows * width
        ids, positions, slots, seq_lens = layout.input_ids, layout.positions, layout.slot_mapping, layout.seq_lens
        for row, request in enumerate(requests):
            start = request.context_len
            table = allocator.ensure(request.request_id, start + q)
            if kept.tables[row] is not table or len(layout.block_tables[row]) != len(table):  # another's, or grown
                if len(table) > width:
                    raise ValueError(f"a request needs {len(table)} blocks; max_model_len allows {width}")
                at = tables_at + row * width
                self._host_np[at: at + width] = NULL_BLOCK
                self._host_np[at: at + len(table)] = table
                layout.block_tables[row] = list(table)
                kept.tables[row] = table
            for j, token in enumerate(request.token_ids):  # the token rows' values (see _where for the order)
                t, position = row * q + j, start + j
                ids[t] = values[t] = token
                positions[t] = values[n + t] = position
                slots[t] = values[2 * n + t] = allocator.slot(request.request_id, position)
            seq_lens[row] = values[4 * n + row] = start + q
        return layout

    def _wait_for_last_copy(self) -> None:
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the last copy (eager, or a replay's first node) has read the buffer

    def transfer(self, m: int) -> None:
        """Copy the `m` staged values and their destinations to the device and scatter them into
        the buffers (in place: the addresses never change). Runs eagerly or inside a capture."""
        staging = self._device_staging[: 2 * m]
        staging.copy_(self._host[: 2 * m], non_blocking=True)
        if self._copy_done is not None:
            self._copy_done.record()
        self.packed.index_copy_(0, staging[m:], staging[:m])

    def load(self, layout: Layout) -> None:
        """Stage and transfer a step's layout: the static buffers hold it when the device gets there."""
        self.transfer(self.stage(layout))

    def metadata(self, layout_or_key) -> Metadata:
        """Views for a step of num_tokens with the layout's (frozen) shape decisions."""
        n, rows, q = layout_or_key.num_tokens, layout_or_key.num_reqs, layout_or_key.uniform_q
        return Metadata(
            num_tokens=n, uniform_q=q, num_reqs=rows, positions=self.positions[:n],
            slot_mapping=self.slot_mapping[:n], token_req=self.token_req[:n], block_tables=self.block_tables,
            seq_lens=self.seq_lens, query_start_loc=self.query_start_loc, context_window=self.context_window,
        )
