"""This runtime's scheduler state, on the harness's books (harness/kit/block_book.py): which requests
are live, the tokens whose KV each one holds, and its KV blocks.

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

from harness.kit.block_book import BlockBook, Placed as Planned  # one request of a step, checked and placed

from .settings import RESERVED_BLOCKS

PADDING_SLOT = -1  # what a row writing into the reserved block reports (it owns no slot)


class Requests(BlockBook):
    TOKEN_LIMIT = "max_num_batched_tokens (max_prefill_token_num)"
    SEQ_LIMIT = "max_num_seqs (max_batch_size)"

    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, max_seqs: int, max_tokens: int):
        super().__init__(num_blocks, block_size, vocab, max_len, max_seqs, max_tokens, first_block=RESERVED_BLOCKS)

    def slot(self, request_id: int, position: int, kernel_block_size: int | None = None) -> int:
        """The slot a position of a live request is written to (LMDeploy's kernel blocks are its blocks:
        checked at build)."""
        live = self.held(request_id, position)
        return slot_number(live.blocks[position // self.block_size], position % self.block_size, self.block_size)


def slot_number(block: int, offset: int, block_size: int) -> int:
    """A (block, offset) LMDeploy writes, as a kv_snapshot() slot; the reserved block has none."""
    return PADDING_SLOT if block < RESERVED_BLOCKS else (block - RESERVED_BLOCKS) * block_size + offset


def is_decoding(planned: list[Planned]) -> bool:
    """The step LMDeploy's graph runner may put in a decode graph: one token a request."""
    return all(q.num_new == 1 for q in planned)
