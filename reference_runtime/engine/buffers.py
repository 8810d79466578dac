"""Static buffers and the layout of one step in them.

Every step, eager or graph, reads its inputs from the same preallocated buffers: a graph was
captured against their addresses, so a step copies its data in and never swaps a tensor. Rows
past the real tokens are padding: token 0, position 0, slot -1 (no KV write), in dummy
requests whose block table points at the null block.
"""
from __future__ import annotations

from dataclasses import dataclass

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
        total = request.context_len + len(request.token_ids)
        tables.append(list(allocator.ensure(request.request_id, total)))
        for offset, token in enumerate(request.token_ids):
            position = request.context_len + offset
            ids.append(token)
            positions.append(position)
            slots.append(allocator.slot(request.request_id, position))
            token_req.append(row)
        seq_lens.append(total)
        starts.append(starts[-1] + len(request.token_ids))
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


class StaticBuffers:
    """Inputs of every step at fixed addresses, sized for the largest step."""

    NAMES = ("input_ids", "positions", "slot_mapping", "token_req", "block_tables", "seq_lens", "query_start_loc")

    def __init__(self, max_tokens: int, max_rows: int, max_blocks: int, max_model_len: int, device):
        long = dict(dtype=torch.long, device=device)
        self.max_tokens, self.max_rows, self.max_blocks = max_tokens, max_rows, max_blocks
        self.input_ids = torch.zeros(max_tokens, **long)
        self.positions = torch.zeros(max_tokens, **long)
        self.slot_mapping = torch.full((max_tokens,), -1, **long)
        self.token_req = torch.zeros(max_tokens, **long)
        self.block_tables = torch.zeros(max_rows, max_blocks, **long)
        self.seq_lens = torch.zeros(max_rows, **long)
        self.query_start_loc = torch.zeros(max_rows + 1, **long)
        self.context_window = torch.arange(max_model_len, **long)
        packed_max = 4 * max_tokens + 2 * max_rows + 1 + max_rows * max_blocks
        cuda = torch.device(device).type == "cuda"
        self._host_staging = torch.zeros(packed_max, dtype=torch.long, pin_memory=cuda)
        self._device_staging = torch.zeros(packed_max, **long)
        self._copy_done = torch.cuda.Event() if cuda else None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.NAMES}

    def addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.tensors().items()}

    def load(self, layout: Layout) -> None:
        """Copy a step's layout into the buffers (in place: the addresses never change).

        Everything travels in one packed host tensor and one host-to-device copy; the device
        then scatters it into the named buffers.
        """
        n, rows = layout.num_tokens, layout.num_reqs
        if n > self.max_tokens or rows > self.max_rows:
            raise ValueError(f"a step of {n} tokens in {rows} rows does not fit static buffers of "
                             f"{self.max_tokens} tokens and {self.max_rows} rows")
        tables = []
        for table in layout.block_tables:
            if len(table) > self.max_blocks:
                raise ValueError(f"a request needs {len(table)} blocks; max_model_len allows {self.max_blocks}")
            tables += table + [0] * (self.max_blocks - len(table))
        parts = (layout.input_ids, layout.positions, layout.slot_mapping, layout.token_req, layout.seq_lens,
                 layout.query_start_loc, tables)
        packed = [value for part in parts for value in part]
        staging = self._staging(len(packed))
        staging.copy_(torch.tensor(packed, dtype=torch.long), non_blocking=False)
        device = self._device_staging[: len(packed)]
        device.copy_(staging, non_blocking=True)
        if self._copy_done is not None:
            self._copy_done.record()
        offset = 0
        for name, part in zip(("input_ids", "positions", "slot_mapping", "token_req", "seq_lens",
                               "query_start_loc"), parts):
            getattr(self, name)[: len(part)].copy_(device[offset: offset + len(part)])
            offset += len(part)
        self.block_tables[:rows].view(-1).copy_(device[offset:])

    def _staging(self, size: int) -> torch.Tensor:
        """The host side of the packed copy; pinned on CUDA, and not reused before its copy is done."""
        if self._copy_done is not None:
            self._copy_done.synchronize()
        return self._host_staging[:size]

    def metadata(self, layout_or_key) -> Metadata:
        """Views for a step of num_tokens with the layout's (frozen) shape decisions."""
        n, rows, q = layout_or_key.num_tokens, layout_or_key.num_reqs, layout_or_key.uniform_q
        return Metadata(
            num_tokens=n, uniform_q=q, num_reqs=rows, positions=self.positions[:n],
            slot_mapping=self.slot_mapping[:n], token_req=self.token_req[:n], block_tables=self.block_tables,
            seq_lens=self.seq_lens, query_start_loc=self.query_start_loc, context_window=self.context_window,
        )
