"""The inputs a forward read, taken from LMDeploy's own tensors: the static buffers of the graph
(or fake-capture runner) that ran, or the eager forward's arguments. From them, the KV slot each
token's row writes, as LMDeploy's `fill_kv_cache` kernel addresses it (kernels/cuda/
fill_kv_cache.py): batch row b writes its q_len[b] new tokens at positions kv_len[b] - q_len[b] ..
kv_len[b] - 1, each in block block_offsets[b][position // block_size]. Token t belongs to row b
when it is among row b's tokens in query order (cu_seqlens_q, as the attention reads them).
"""
from __future__ import annotations

from dataclasses import dataclass

from .requests import slot_number
from .settings import RESERVED_BLOCKS

# LMDeploy's kernels take query offsets from cu_seqlens, which it builds from q_seqlens per version
# (its q_start_loc buffer holds 0 in padded rows, and is not what they read): not exposed until
# checked against a run on a GPU.
QUERY_STARTS_NOT_EXPOSED = ("LMDeploy's kernels read cu_seqlens, built per version from q_seqlens; its q_start_loc "
                            "buffer is not their offsets: not exposed until checked on a GPU")


@dataclass
class Seen:
    token_ids: object  # [tokens] tensor (a view of LMDeploy's buffer: clone before the next step)
    positions: object
    q_len: list[int]  # per batch row, padded rows included
    kv_len: list[int]
    block_offsets: list[list[int]]
    block_size: int  # tokens a KV block

    def slot_mapping(self) -> list[int]:
        size, slots = self.block_size, []
        for q, kv, blocks in zip(self.q_len, self.kv_len, self.block_offsets):
            for position in range(kv - q, kv):
                slots.append(slot_number(blocks[position // size], position % size, size))
        return slots

    def request_rows(self) -> dict:
        """The request rows as StepInputs carries them: lengths (kv_len) and block tables numbered as
        slot_of() and kv_snapshot() number them (LMDeploy's block minus the reserved ones, so the
        reserved block padded rows read is -1, the padding_block)."""
        import torch

        tables = torch.tensor(self.block_offsets, dtype=torch.long).reshape(len(self.kv_len), -1) - RESERVED_BLOCKS
        return {"seq_lens": torch.tensor(self.kv_len, dtype=torch.long), "block_tables": tables,
                "block_size": self.block_size, "padding_block": -1,
                "not_exposed": {"query_start_loc": QUERY_STARTS_NOT_EXPOSED}}


def from_graph(graph_meta, block_size: int, cut: bool = False) -> Seen:
    """A graph's static inputs (CudaGraphMixin.make_buffers_cudagraph): input_ids and position_ids
    of its token capacity, qkv_lens = (q_start_loc, q_seqlens, kv_seqlens) and block_offsets of its
    batch capacity, padded rows included (fill_graph_common_inputs gives them q_len 1, kv_len 1 and
    block 0). With `cut`, only the block columns the rows' kv lengths reach (all that attention
    reads): the whole table is a row per graph row and a column per KV block, and copying it back took
    a batch-256 step longer than the step (reports/h100/engines/README.md)."""
    buffers, tokens, rows = graph_meta.input_buffers, int(graph_meta.max_tokens), int(graph_meta.max_batchs)
    _, q_len, kv_len = buffers["qkv_lens"][:, :rows].tolist()
    columns = max(1, -(-max(kv_len, default=1) // block_size)) if cut else None
    return Seen(buffers["input_ids"][0, :tokens], buffers["position_ids"][0, :tokens], q_len, kv_len,
                buffers["block_offsets"][:rows, :columns].tolist(), block_size)


def from_eager(kwargs, block_size: int) -> Seen:
    """An eager forward's own arguments (no padding): its attention metadata has the same fields."""
    meta = kwargs["attn_metadata"]
    return Seen(kwargs["input_ids"][0], kwargs["position_ids"][0], meta.q_seqlens.tolist(), meta.kv_seqlens.tolist(),
                meta.block_offsets.tolist(), block_size)


def from_record(record, block_size: int, cut: bool = False) -> Seen:
    """The step's inputs; with `cut`, a graph step's block table cut to the columns read (from_graph)."""
    if record.graph_inputs is not None:
        return from_graph(record.graph_inputs[0], block_size, cut)
    if record.eager_inputs is not None:
        return from_eager(record.eager_inputs, block_size)
    raise RuntimeError("the step left no inputs to read: LMDeploy's forward filled no graph buffers and ran no eager "
                       "forward this runtime saw")
