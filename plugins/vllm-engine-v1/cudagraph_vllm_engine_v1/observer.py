"""What vLLM's V1 model runner did in one execute_model call, seen from inside the process.

Two instance attributes of vllm/v1/worker/gpu_model_runner.py's GPUModelRunner are wrapped (each
calls straight through):

- `cudagraph_dispatcher.dispatch`: every (CUDAGraphMode, BatchDescriptor) the live
  CudagraphDispatcher returned during the step. For an eager reference step the runtime may
  replace the answer with NONE at a given size.
- `_model_forward`: called inside `set_forward_context`, so the forward context holds the runtime
  mode and BatchDescriptor the forward runs with (the CUDAGraphWrappers read the same fields to
  decide whether to replay). The padded rows can be filled here on request, and the inputs
  (token ids, positions, the slot mapping vLLM computed, and the request rows: the runner's
  `seq_lens`, `query_start_loc` and the first KV group's `input_batch.block_table`, at the
  descriptor's padded request count) are copied for inspection; the length of the input_ids the
  forward is given is a second reading of the padded size.
"""
from __future__ import annotations

import dataclasses

from harness.kit.observer import ObserverBase

from cudagraph_vllm_engine.observer import StepRecord


@dataclasses.dataclass
class V1StepRecord(StepRecord):
    """V2's record (the inputs as the forward saw them), read from the forward context instead."""

    dispatched: list = dataclasses.field(default_factory=list)  # every (mode, BatchDescriptor) returned
    # `ran`: the forward context's BatchDescriptor; `path`: its cudagraph_runtime_mode.
    forward_tokens: int | None = None  # len(input_ids) given to the forward
    forwards: int = 0


def first_slot_mapping(slot_mapping):
    """The forward context's slot mapping: a dict per KV group's layers (or a list of them)."""
    if isinstance(slot_mapping, list):
        slot_mapping = slot_mapping[0] if slot_mapping else None
    if isinstance(slot_mapping, dict):
        return next(iter(slot_mapping.values()), None) if slot_mapping else None
    return slot_mapping


class V1StepObserver(ObserverBase):
    record_type = V1StepRecord

    def __init__(self, runner, vocab_size: int, max_model_len: int, forward_context=None):
        self.runner = runner
        super().__init__(vocab_size, max_model_len)
        self.real_tokens = 0
        if forward_context is None:
            from vllm.forward_context import get_forward_context as forward_context
        self._context = forward_context
        dispatcher = runner.cudagraph_dispatcher
        real_dispatch, real_forward = dispatcher.dispatch, runner._model_forward

        def dispatch(*args, **kwargs):
            mode, desc = real_dispatch(*args, **kwargs)
            if self.eager_size is not None:
                mode, desc = self._eager(mode, desc)
            self.record.dispatched.append((mode, desc))
            return mode, desc

        def model_forward(*args, **kwargs):
            self._before_forward(kwargs.get("input_ids", args[0] if args else None),
                                 kwargs.get("positions", args[1] if len(args) > 1 else None))
            return real_forward(*args, **kwargs)

        dispatcher.dispatch = dispatch
        runner._model_forward = model_forward

    def expect(self, num_real_tokens: int) -> None:
        """The next step's real tokens (the rows a padding fill must leave alone)."""
        self.real_tokens = num_real_tokens

    def _eager(self, mode, desc):
        """NONE at the requested size, keeping the request padding the graph of that size would use."""
        eager = type(mode).NONE
        keep_reqs = mode != eager and desc.num_tokens == self.eager_size
        rows = desc.num_reqs if keep_reqs else None
        return eager, dataclasses.replace(desc, num_tokens=self.eager_size, num_reqs=rows)  # vLLM's own names

    def _before_forward(self, input_ids, positions) -> None:
        context = self._context()
        record = self.record
        record.forwards += 1
        record.path = context.cudagraph_runtime_mode.name
        record.ran = context.batch_descriptor
        record.forward_tokens = None if input_ids is None else int(input_ids.shape[0])
        padded = record.forward_tokens or 0
        real = self.real_tokens
        if self.fill is not None and input_ids is not None and padded > real:
            self.fill_padded(input_ids[real:padded], positions[real:padded])
        record.token_ids = None if input_ids is None else input_ids[:padded].clone()
        record.positions = None if positions is None else positions[:padded].clone()
        slots = first_slot_mapping(getattr(context, "slot_mapping", None))
        record.slot_mapping = None if slots is None else slots[:padded].clone()
        self._request_rows(record)

    def _request_rows(self, record) -> None:
        """The request rows the forward reads, at the descriptor's padded count (PIECEWISE keys have
        none: the batch's own); left None on a runner without them (the CPU tests' stand-ins)."""
        runner = self.runner
        batch = getattr(runner, "input_batch", None)
        if batch is None or not hasattr(runner, "seq_lens"):
            return
        rows = getattr(record.ran, "num_reqs", None) or batch.num_reqs
        record.seq_lens = runner.seq_lens[:rows].clone()
        record.query_start_loc = runner.query_start_loc.gpu[:rows + 1].clone()
        record.block_tables = batch.block_table[0].get_device_tensor(rows)[:rows].clone()
