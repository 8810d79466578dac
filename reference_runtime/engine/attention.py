"""Attention backends at every graph-support level (SPEC 5), over the paged KV cache.

Every backend writes the step's keys and values into the cache, then attends. What differs is
which batches it can run with static shapes, which is what a FULL graph needs:

- `static` (ALWAYS): one kernel for any batch; each token gathers a fixed window of context.
- `uniform` (UNIFORM_BATCH): requests of q tokens each, laid out as [requests, q].
- `decode` (UNIFORM_SINGLE_TOKEN_DECODE): one token per request; masks by seq_lens, so it is
  only right when q == 1.
- `varlen` (NEVER): loops over requests with lengths read back to the CPU (`.tolist()`), like
  a variable-length kernel whose launch depends on the data; it cannot be captured.

Outside a FULL graph (eager or between PIECEWISE pieces) a backend may use its general path
for batches its graph kernel cannot take. The kernel is chosen from the batch layout, a Python
value that a captured graph freezes, never from tensor data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policy import AttentionCGSupport
from .kv_cache import KVCache


@dataclass
class Metadata:
    """Views of the static buffers for one step, plus the layout that picks kernels."""

    num_padded_tokens: int  # token rows the step runs at
    uniform_q: int | None  # tokens per request when the layout is uniform, else None
    num_padded_rows: int  # request rows in use (dummy rows for padding included)
    host_seq_lens: list[int]  # the plan's context lengths after this step, on the host (frozen in a graph)
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T], -1 for padded rows
    token_req: torch.Tensor  # [T] request row of each token
    block_tables: torch.Tensor  # [rows, max_blocks]
    seq_lens: torch.Tensor  # [rows] context length after this step
    query_start_loc: torch.Tensor  # [rows + 1]
    context_window: torch.Tensor  # arange(max_model_len), static

    @property
    def max_seq_len(self) -> int:
        """The longest context after this step, a host value: what a kernel sized on the host reads
        (computed only where asked: the reference backends size nothing on the host)."""
        return max(self.host_seq_lens)


def attend(q, k, v, mask, scale):
    """q [B, Tq, H, D], k/v [B, C, KVH, D], mask [B, Tq, C] -> [B, Tq, H * D]."""
    b, tq, heads, d = q.shape
    c, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # Slots no query may see can hold anything (NaN from a poisoned or uninitialised block):
    # zero them, since a zero probability times NaN is still NaN. (torch.where, not masked_fill:
    # one kernel each, where masked_fill copies the tensor first.)
    v = torch.where(mask.any(dim=1)[:, :, None, None], v, 0)
    # Two batched matmuls, one batch entry per (row, KV head), its query group's tokens as the matrix
    # rows: what einsum would launch, without its equation parsing and a dozen views on the host.
    q = q.view(b, tq, kv_heads, group, d).transpose(1, 2).reshape(b * kv_heads, tq * group, d)
    k = k.permute(0, 2, 3, 1).reshape(b * kv_heads, d, c)
    scores = (torch.bmm(q, k) * scale).view(b, kv_heads, tq, group, c)
    scores = torch.where(mask[:, None, :, None, :], scores, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype).view(b * kv_heads, tq * group, c)
    out = torch.bmm(probs, v.transpose(1, 2).reshape(b * kv_heads, c, d))
    return out.view(b, kv_heads, tq, group, d).transpose(1, 2).reshape(b, tq, heads * d)


def gather_context(cache: KVCache, layer: int, block_tables: torch.Tensor, window: torch.Tensor):
    """Keys and values of context positions `window` for each row of block_tables: [R, C, KVH, D]."""
    size = cache.block_size
    blocks = block_tables.gather(1, (window // size).expand(block_tables.shape[0], -1))
    slots = (blocks * size + window % size).flatten()
    rows, width = blocks.shape
    keys, values = cache.keys(layer), cache.values(layer)
    k = keys.index_select(0, slots).view(rows, width, *keys.shape[1:])
    v = values.index_select(0, slots).view(rows, width, *values.shape[1:])
    return k, v


class Backend:
    name = "base"
    support = AttentionCGSupport.NEVER

    def __init__(self, cache: KVCache, scale: float):
        self.cache = cache
        self.scale = scale

    def __call__(self, layer: int, q, k, v, meta: Metadata) -> torch.Tensor:
        self.cache.write(layer, k, v, meta.slot_mapping)
        return self.forward(layer, q, meta)

    def forward(self, layer: int, q, meta: Metadata) -> torch.Tensor:
        raise NotImplementedError

    # Shared kernels -----------------------------------------------------------------------
    def per_token(self, layer, q, meta):
        """Any batch: token t sees context positions <= its own position in its request."""
        k, v = gather_context(self.cache, layer, meta.block_tables.index_select(0, meta.token_req),
                              meta.context_window[None, :])
        mask = meta.context_window[None, :] <= meta.positions[:, None]
        return attend(q[:, None], k, v, mask[:, None, :], self.scale)[:, 0]

    def per_request(self, layer, q, meta, mask_by_seq_lens: bool = False):
        """Uniform batches: [requests, q] tokens against each request's context window."""
        rows, width = meta.num_padded_rows, meta.uniform_q
        k, v = gather_context(self.cache, layer, meta.block_tables[:rows], meta.context_window[None, :])
        if mask_by_seq_lens:  # single-token decode: the token is the last position
            mask = (meta.context_window[None, :] < meta.seq_lens[:rows, None])[:, None, :].expand(rows, width, -1)
        else:
            mask = meta.context_window[None, None, :] <= meta.positions.view(rows, width)[:, :, None]
        out = attend(q.view(rows, width, *q.shape[1:]), k, v, mask, self.scale)
        return out.reshape(rows * width, -1)

    def varlen(self, layer, q, meta):
        """Request by request with lengths read back from the device: data-dependent, eager only."""
        out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
        rows = meta.num_padded_rows
        starts = meta.query_start_loc[: rows + 1].tolist()
        lengths = meta.seq_lens[:rows].tolist()
        for row in range(rows):
            begin, end = starts[row], starts[row + 1]
            if end <= begin:
                continue
            window = meta.context_window[: lengths[row]]
            k, v = gather_context(self.cache, layer, meta.block_tables[row:row + 1], window[None, :])
            mask = window[None, :] <= meta.positions[begin:end, None]
            out[begin:end] = attend(q[None, begin:end], k, v, mask[None], self.scale)[0]
        return out


class StaticBackend(Backend):
    name = "static"
    support = AttentionCGSupport.ALWAYS

    def forward(self, layer, q, meta):
        return self.per_token(layer, q, meta)


class UniformBackend(Backend):
    name = "uniform"
    support = AttentionCGSupport.UNIFORM_BATCH

    def forward(self, layer, q, meta):
        if meta.uniform_q is not None:
            return self.per_request(layer, q, meta)
        return self.varlen(layer, q, meta)


class DecodeBackend(Backend):
    name = "decode"
    support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def forward(self, layer, q, meta):
        if meta.uniform_q == 1:
            return self.per_request(layer, q, meta, mask_by_seq_lens=True)
        return self.varlen(layer, q, meta)


class VarlenBackend(Backend):
    name = "varlen"
    support = AttentionCGSupport.NEVER

    def forward(self, layer, q, meta):
        return self.varlen(layer, q, meta)


BACKENDS = {cls.name: cls for cls in (StaticBackend, UniformBackend, DecodeBackend, VarlenBackend)}


def make_backends(names, num_layers: int, cache: KVCache, scale: float, classes=BACKENDS) -> list[Backend]:
    """One backend per layer: one name for all layers, or one name per layer (a hybrid model);
    `classes` maps each name to its backend class."""
    names = tuple(names) or ("static",)
    if len(names) == 1:
        names = names * num_layers
    if len(names) != num_layers:
        raise ValueError(f"attention_backends needs 1 or {num_layers} names (one per layer), got {len(names)}")
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise ValueError(f"unknown attention backend {unknown[0]!r}; expected one of {', '.join(classes)}")
    return [classes[name](cache, scale) for name in names]
