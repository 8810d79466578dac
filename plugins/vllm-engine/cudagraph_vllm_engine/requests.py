"""This runtime's scheduler state on the kit's books (harness/kit/block_book.py). Each step hands the
model runner every scheduled request as vLLM's scheduler hands a resumed one (`NewRequestData`
with all its tokens and `num_computed_tokens`), so a step runs exactly the harness's tokens at its
context lengths, and re-running a step rewrites the same KV slots.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.kit.block_book import BlockBook, Live as BookLive, Placed


@dataclass
class Live(BookLive):
    vllm_id: str = ""
    placed: bool = False  # sent to vLLM at least once: its adapter is then vLLM's for the request's life
    lora: int | None = None


@dataclass(frozen=True)
class Planned(Placed):
    """One request of a step, checked and placed, as vLLM is sent it: with its whole history."""

    vllm_id: str = ""
    history: tuple[int, ...] = ()  # the tokens before context_len
    lora: int | None = None  # the adapter the request names (Request.lora), None: the base model

    @property
    def all_tokens(self) -> tuple[int, ...]:
        return self.history + self.new_tokens


class Requests(BlockBook):
    """KV slots: the kit's `slot`, vLLM's block table expanded to kernel blocks (vllm/v1/worker/gpu/block_table.py)."""

    def __init__(self, num_blocks: int, block_size: int, vocab: int, max_len: int, max_seqs: int, max_tokens: int):
        # Block 0 is vLLM's null block (its BlockPool never hands it out), so neither do we.
        super().__init__(num_blocks, block_size, vocab, max_len, max_seqs, max_tokens, first_block=1)
        self.finished: set[str] = set()  # vLLM ids released since the last step (the runner forgets them then)

    def new_live(self, request_id: int) -> Live:
        return Live(vllm_id=f"req-{request_id}")

    def placed(self, request, live, tokens) -> Planned:
        lora = getattr(request, "lora", None)
        if live.placed and lora != live.lora:
            raise ValueError(f"request {request.request_id} was admitted with LoRA adapter {live.lora} and now names "
                             f"{lora}: vLLM keeps a request's adapter for its life (a resumed request's adapter is "
                             "not read again, vllm/v1/worker/gpu_model_runner.py _update_streaming_request); release "
                             "it and admit a new request for another adapter")
        live.placed, live.lora = True, lora
        return Planned(request.request_id, tokens, request.context_len, tuple(live.blocks), live.vllm_id,
                       tuple(live.tokens[:request.context_len]), lora)

    def release(self, request_id: int) -> Live | None:
        live = super().release(request_id)
        if live is not None:
            self.finished.add(live.vllm_id)
        return live

    def take_finished(self) -> set[str]:
        finished, self.finished = self.finished, set()
        return finished
