"""What LMDeploy's graph runner did in one forward, seen from inside the process.

LMDeploy's `CUDAGraphRunner.__call__` (backends/cuda/graph_runner/runner.py) chooses one path a
forward: a FULL decode graph (`_forward_full_graph`: the graph of `get_graph_key`'s key replays,
or is captured on a miss by `_capture_full_graph`), a piecewise plan (none for this model), or
eager (`_forward_eager`). Each path is a method of the live runner; this observer wraps them on
the instance (each wrapper calls straight through) and records what ran:

- `_should_use_full_graph`: LMDeploy's own decision that a step belongs to a decode graph, and
  whether the step is decoding. Before `capture()` (LMDeploy never serves before its warm-up,
  which captures) and for an eager reference step, the graph path is declined here, so the
  forward runs eager: the one place this runtime overrides LMDeploy, recorded as such.
- `get_graph_key`: the key LMDeploy computed, with the padded batch in it.
- `_capture_full_graph`: every capture, in order; one outside `capture()` is a capture in service.
  Each captured graph's own `forward` (CUDASingleGraphRunner.forward, the replay) is wrapped in
  turn: a replay records FULL and the padded size is the replayed graph's own capacity
  (`CudaGraphMeta.max_tokens`), not recomputed.
- `_forward_eager`: the eager path; for an eager reference at a padded size it runs LMDeploy's
  own fake-capture runner of that size instead (engine.py makes it), the graph's layout without
  a graph.
- the model's `fill_buffers_cudagraph` (CudaGraphMixin): called right after LMDeploy filled a
  graph's static inputs and before the forward reads them; here the padded rows are filled on
  request, and the buffers the forward read are kept for `last_step_inputs()`.
"""
from __future__ import annotations

import dataclasses

from harness.kit.observer import ObserverBase

GRAPH_PATH_DECLINED_BEFORE_CAPTURE = "before capture()"
GRAPH_PATH_DECLINED_FOR_EAGER = "eager_step"


@dataclasses.dataclass
class StepRecord:
    decoding: bool | None = None  # StepContext.global_is_decoding() as LMDeploy saw the step
    offered: bool | None = None  # LMDeploy's _should_use_full_graph answer
    declined: str | None = None  # why this runtime kept a graph step eager
    key: tuple | None = None  # get_graph_key's answer
    path: str = "NONE"  # FULL: a captured graph replayed; NONE: an eager forward
    replayed_key: tuple | None = None  # the key the replayed graph was captured under
    padded: int | None = None  # tokens the forward ran at
    captured: list = dataclasses.field(default_factory=list)  # keys captured during this step
    graph_inputs: object | None = None  # (CudaGraphMeta, real tokens): the static buffers the forward read
    eager_inputs: dict | None = None  # the forward's own inputs, for an unpadded eager step


class EagerShapeError(ValueError):
    """An eager reference at a padded size for a step LMDeploy never pads."""


class GraphRunnerObserver(ObserverBase):
    record_type = StepRecord

    def __init__(self, runner, eager_runner, vocab_size: int, max_model_len: int):
        """`runner`: LMDeploy's CUDAGraphRunner; `eager_runner(size)`: a callable running a forward
        eagerly at `size` padded tokens with a graph's layout (engine.py)."""
        self.runner, self.model = runner, runner.model
        self.eager_runner = eager_runner
        super().__init__(vocab_size, max_model_len)
        self.graphs_allowed = False  # set once capture() has run
        self.capturing = False  # inside capture(): captures belong to the capture phase
        self.capture_order: list[tuple] = []  # every key captured, in order
        self.graphs: dict[tuple, object] = {}  # key -> LMDeploy's CUDASingleGraphRunner captured under it
        self.captures_in_service = 0
        self._wrap()

    def _wrap(self) -> None:
        runner, model = self.runner, self.model
        real_should, real_key = runner._should_use_full_graph, runner.get_graph_key
        real_capture, real_eager = runner._capture_full_graph, runner._forward_eager
        real_fill = model.fill_buffers_cudagraph

        def should_use_full_graph(step_context, model_inputs):
            offered = real_should(step_context, model_inputs)
            record = self.record
            record.decoding, record.offered, record.declined = bool(step_context.global_is_decoding()), bool(offered), None
            if offered and not self.capturing:
                if not self.graphs_allowed:
                    record.declined = GRAPH_PATH_DECLINED_BEFORE_CAPTURE
                elif self.eager_size is not None:
                    record.declined = GRAPH_PATH_DECLINED_FOR_EAGER
            return offered and record.declined is None

        def get_graph_key(*args, **kwargs):
            key = real_key(*args, **kwargs)
            self.record.key = tuple(key)
            return key

        def capture_full_graph(graph_key, kwargs):
            output = real_capture(graph_key, kwargs)
            key = tuple(graph_key)
            self.capture_order.append(key)
            self._watch_replays(key, runner._full_graph_runners[graph_key])
            if not self.capturing:
                self.captures_in_service += 1
                self.record.captured.append(key)
            self.record.path, self.record.padded = "NONE", self._capacity(runner._full_graph_runners[graph_key])
            return output

        def forward_eager(**kwargs):
            record, tokens = self.record, kwargs["input_ids"].size(-1)
            record.path = "NONE"
            size = self.eager_size
            if self.capturing or size is None or size == tokens:
                record.padded, record.eager_inputs = tokens, kwargs
                return real_eager(**kwargs)
            if not record.decoding:
                raise EagerShapeError(f"an eager step at {size} tokens for a prefill step of {tokens}: LMDeploy pads "
                                      "only decode steps (one token a request); a prefill step runs unpadded")
            record.padded = size
            return self.eager_runner(size)(**kwargs)

        def fill_buffers(graph_meta, *args, **kwargs):
            new_inputs = real_fill(graph_meta, *args, **kwargs)
            if not self.capturing:
                input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
                real, padded = input_ids.size(-1), self._capacity_of(graph_meta)
                if self.fill is not None and padded > real:
                    self._fill_padded_rows(graph_meta.input_buffers, real, padded)
                self.record.graph_inputs = (graph_meta, real)
            return new_inputs

        runner._should_use_full_graph, runner.get_graph_key = should_use_full_graph, get_graph_key
        runner._capture_full_graph, runner._forward_eager = capture_full_graph, forward_eager
        model.fill_buffers_cudagraph = fill_buffers

    def _watch_replays(self, key: tuple, graph) -> None:
        self.graphs[key] = graph
        real_forward = graph.forward

        def forward(**kwargs):
            self.record.path, self.record.replayed_key = "FULL", key
            self.record.padded = self._capacity(graph)
            return real_forward(**kwargs)

        graph.forward = forward

    @classmethod
    def _capacity(cls, graph) -> int:
        return cls._capacity_of(graph.meta)

    @staticmethod
    def _capacity_of(graph_meta) -> int:
        """Tokens a graph (or a fake-capture runner) runs at: its static buffers' token capacity."""
        return int(graph_meta.max_tokens)

    def _fill_padded_rows(self, buffers, real: int, padded: int) -> None:
        self.fill_padded(buffers["input_ids"][0, real:padded], buffers["position_ids"][0, real:padded])
