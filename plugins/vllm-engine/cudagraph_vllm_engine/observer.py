"""What vLLM itself did in one execute_model call, read from V2 model runner methods wrapped to
call straight through (vllm/v1/worker/gpu/model_runner.py, execute_model):

- `cudagraph_manager.dispatch`: the descriptor vLLM's dispatcher chose (an eager step's replaced);
- `cudagraph_manager.run_fullgraph` / `run_pw_graph`: the FULL or PIECEWISE path (eager: neither);
- `prepare_attn`: the static inputs filled, the forward not yet run: the padded rows filled on
  request, and the inputs and request rows (seq_lens, query_start_loc, block tables) copied.
"""
from __future__ import annotations

import dataclasses

from harness.kit.observer import ObserverBase


@dataclasses.dataclass
class StepRecord:
    dispatched: object | None = None  # what vLLM's dispatcher returned
    ran: object | None = None  # the descriptor execute_model used (dispatched, or the forced eager one)
    path: str = "NONE"  # FULL: run_fullgraph; PIECEWISE: run_pw_graph; NONE: neither
    token_ids: object | None = None  # [padded] copies of the static inputs as the forward saw them
    positions: object | None = None
    slot_mapping: object | None = None
    seq_lens: object | None = None  # [padded request rows], likewise
    query_start_loc: object | None = None
    block_tables: object | None = None  # the first KV cache group's


class StepObserver(ObserverBase):
    record_type = StepRecord

    def __init__(self, runner, vocab_size: int, max_model_len: int):
        self.runner = runner
        super().__init__(vocab_size, max_model_len)
        manager = runner.cudagraph_manager
        real_dispatch, real_full, real_piecewise = manager.dispatch, manager.run_fullgraph, manager.run_pw_graph
        real_prepare_attn = runner.prepare_attn

        def dispatch(*args, **kwargs):
            desc = real_dispatch(*args, **kwargs)
            self.record.dispatched = desc
            if self.eager_size is not None:
                desc = self._eager(desc)
            self.record.ran = desc
            return desc

        def run_fullgraph(desc):
            self.record.path = "FULL"
            return real_full(desc)

        def run_pw_graph(model, model_inputs):
            self.record.path = "PIECEWISE"
            return real_piecewise(model, model_inputs)

        def prepare_attn(input_batch):
            result = real_prepare_attn(input_batch)
            self._inputs(input_batch, result[1], result[0])
            return result

        manager.dispatch, manager.run_fullgraph, manager.run_pw_graph = dispatch, run_fullgraph, run_pw_graph
        runner.prepare_attn = prepare_attn

    def _eager(self, desc):
        """An eager descriptor at the requested size, with the graph of that size's request padding
        (the eager reference runs the graph step's exact shape)."""
        eager = type(desc.cg_mode).NONE  # vLLM's CUDAGraphMode, taken from the descriptor itself
        size = self.eager_size
        # None: no request padding (the model runner then uses the real request count).
        rows = desc.num_reqs if desc.cg_mode != eager and desc.num_tokens == size else None
        return dataclasses.replace(desc, cg_mode=eager, num_tokens=size, num_reqs=rows,  # vLLM's own names
                                   uniform_token_count=None)

    def _inputs(self, input_batch, slot_mappings, block_tables) -> None:
        real, padded = input_batch.num_tokens, input_batch.num_tokens_after_padding
        buffers = self.runner.input_buffers
        if self.fill is not None and padded > real:
            self.fill_padded(buffers.input_ids[real:padded], buffers.positions[real:padded])
        self.record.token_ids = buffers.input_ids[:padded].clone()
        self.record.positions = buffers.positions[:padded].clone()
        self.record.slot_mapping = slot_mappings[0][:padded].clone()
        rows = input_batch.num_reqs_after_padding
        self.record.seq_lens = buffers.seq_lens[:rows].clone()
        self.record.query_start_loc = buffers.query_start_loc[:rows + 1].clone()
        self.record.block_tables = block_tables[0][:rows].clone()
