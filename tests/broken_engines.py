"""Deliberately broken engines: the reference engine with one bug each, of a kind real engines
shipped. The self-tests (test_broken_engines.py) check that the execution suites catch every one.

Each mutant is a runtime whose engine's runner differs from the reference in one place, built
through the same public pieces a third party would use (`runner_config`, `ReferenceEngine`).
"""
from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from reference_runtime.adapter import ReferenceEngine, ReferenceRuntime, runner_config
from reference_runtime.engine.attention import StaticBackend, attend, gather_context
from reference_runtime.engine.runner import CUDAGraphMode, ModelRunner, StepOutput


def mutant(name: str, runner_class: type, engine_class: type = ReferenceEngine) -> type:
    def build(self, config):
        return engine_class(runner_class(runner_config(config)))

    return type(runner_class.__name__.lstrip("_"), (ReferenceRuntime,),
                {"name": name, "build": build, "__doc__": runner_class.__doc__})


# -- padding, metadata and addresses ------------------------------------------------------------
class _SlotWraps(ModelRunner):
    """Padded rows' slot -1 is used as a Python index: it wraps onto the last real slot."""

    def __init__(self, config):
        super().__init__(config)
        cache = self.cache

        def write(layer, k, v, slot_mapping):
            cache.data[layer, 0, : cache.num_slots][slot_mapping] = k
            cache.data[layer, 1, : cache.num_slots][slot_mapping] = v

        cache.write = write


class _GraphStep(ModelRunner):
    """A runner that knows whether the step it is loading will replay a graph."""

    def __init__(self, config):
        super().__init__(config)
        self._graph_step = False

    def _run(self, requests, mode, *args, **kwargs):
        self._graph_step = mode is not CUDAGraphMode.NONE
        return super()._run(requests, mode, *args, **kwargs)


class _StaleBlockTables(_GraphStep):
    """Graph steps keep the block tables already in the static buffer instead of refreshing them."""

    def __init__(self, config):
        super().__init__(config)
        stage = self.buffers.stage

        def stage_keeping_tables(layout, rows=None):
            if self._graph_step:  # what the buffer holds now, not the step's tables
                layout = replace(layout, block_tables=self.buffers.block_tables[: layout.num_reqs].tolist())
            return stage(layout, rows)

        self.buffers.stage = stage_keeping_tables


class _NewInputTensors(_GraphStep):
    """Graph steps bind new input tensors instead of copying into the captured ones, and replay
    without checking addresses: the graph reads the old memory."""

    def __init__(self, config):
        super().__init__(config)
        stage = self.buffers.stage

        def stage_into_new_tensor(layout, rows=None):
            staged = stage(layout, rows)
            if self._graph_step:
                self.buffers.input_ids = self.buffers.input_ids.clone()
            return staged

        self.buffers.stage = stage_into_new_tensor

    def capture(self):
        summary = super().capture()
        for graph in list(self.full_graphs.values()) + [g for gs in self.piece_graphs.values() for g in gs]:
            graph.replay = lambda inputs=None, g=graph: type(g).replay(g, None)
        return summary


class _PadsBelowBatch(ModelRunner):
    """Pads a batch to the capture size below it when it falls between two sizes."""

    def step(self, requests, padding_fill=None):
        n = sum(len(r.token_ids) for r in requests)
        sizes = self.dispatcher.sizes
        smaller = [s for s in sizes if s < n]
        if n not in sizes and smaller and n <= sizes[-1]:
            return self._run(requests, CUDAGraphMode.PIECEWISE, smaller[-1], None, None, padding_fill)
        return super().step(requests, padding_fill)


class _LeakyReduction(ModelRunner):
    """A batch-wide reduction mixes padded rows into real ones (a norm over the whole batch)."""

    def __init__(self, config):
        super().__init__(config)
        first_piece = self.model.first_piece

        def leaky_first_piece(input_ids, positions):
            hidden, q, k, v = first_piece(input_ids, positions)
            return hidden + 1e-2 * hidden.mean(dim=0, keepdim=True), q, k, v

        self.model.first_piece = leaky_first_piece


class _StalePaddedPositions(ModelRunner):
    """Padded rows keep the positions an earlier, larger step left in the static buffer (the
    real rows are right, so only the padded inputs show it)."""

    def __init__(self, config):
        super().__init__(config)
        stage = self.buffers.stage

        def stage_leaving_padding(layout, rows=None):
            real, size = layout.num_real_tokens, layout.num_tokens
            left = self.buffers.positions[real:size].tolist()  # what an earlier step left there
            return stage(replace(layout, positions=layout.positions[:real] + left), rows)

        self.buffers.stage = stage_leaving_padding


class _KeptRowsKeepTheirTables(ModelRunner):
    """Keeps request rows from one decode step to the next (a persistent batch) but refreshes a
    row's block table only when the table grows: a request that takes another's row (the batch
    reordered, or one request finished and another joined) attends over the old occupant's blocks."""

    def __init__(self, config):
        super().__init__(config)
        buffers, restage = self.buffers, self.buffers.restage

        def restage_by_length(requests, allocator, num_tokens, rows):
            kept = buffers._kept
            if kept is not None and len(kept.tables) == len(requests):
                for row, request in enumerate(requests):
                    table = allocator.tables.get(request.request_id)
                    if table is not None and kept.tables[row] is not None and len(table) == len(kept.tables[row]):
                        kept.tables[row] = table  # a table as long as the row's passes for it
            return restage(requests, allocator, num_tokens, rows)

        buffers.restage = restage_by_length


class _KeptRowsUpdateOneTokenARow(ModelRunner):
    """Keeps request rows from step to step and updates only each row's first token position and
    slot, as if every step were a one-token decode: a verify step's later tokens keep the positions
    and slots of the step before, so they attend from the wrong place and write over old KV."""

    def __init__(self, config):
        super().__init__(config)
        buffers, restage = self.buffers, self.buffers.restage

        def restage_first_tokens(requests, allocator, num_tokens, rows):
            kept = buffers._kept
            before = None if kept is None else (list(kept.layout.positions), list(kept.layout.slot_mapping))
            layout = restage(requests, allocator, num_tokens, rows)
            if layout is not None and layout.uniform_q > 1:
                n, q, pinned = num_tokens, layout.uniform_q, buffers._host_items
                for t in range(len(requests) * q):
                    if t % q:  # not a row's first token: left as the last step had it
                        layout.positions[t] = pinned[n + t] = before[0][t]
                        layout.slot_mapping[t] = pinned[2 * n + t] = before[1][t]
            return layout

        buffers.restage = restage_first_tokens


class _RowsKeepTheirTablesOnEveryPath(ModelRunner):
    """A persistent batch that rebuilds its rows' block tables only when the number of rows changes
    (a request joined or left), and otherwise only grows them, on every path, eager included: a
    request that takes another's row in a batch of the same size reads the old occupant's blocks,
    and eager and graph steps agree on the wrong answer."""

    def __init__(self, config):
        super().__init__(config)
        self._row_tables: list[list[int]] = []
        self.buffers.restage = lambda *args: None  # every step plans and stages its layout

    def _load_and_execute(self, layout, mode, key):
        kept = self._row_tables
        if len(kept) == len(layout.block_tables):
            tables = [old if len(old) == len(new) else list(new) for old, new in zip(kept, layout.block_tables)]
        else:
            tables = [list(table) for table in layout.block_tables]
        self._row_tables = tables
        return super()._load_and_execute(replace(layout, block_tables=tables), mode, key)


class _IgnoresPaddingFills(ModelRunner):
    """Accepts padding_fill and ignores it: the suites' padded-row checks test nothing."""

    def step(self, requests, padding_fill=None):
        return super().step(requests)


class _OutputsOverwritten(ModelRunner):
    """Returns a view of the graph's output buffer while declaring that outputs are the caller's."""

    def _execute(self, layout, mode, key):
        if mode is CUDAGraphMode.FULL:
            graph = self.full_graphs[key]
            graph.replay(self.graph_inputs())
            n = layout.num_real_tokens
            return StepOutput(graph.output[:n], mode.name, n, layout.num_tokens)
        return super()._execute(layout, mode, key)


class _SwapBreaksTheStep(ReferenceEngine):
    """swap_static_buffer() leaves a list where the tensor was: the next step dies of a TypeError,
    which is a bug in the engine, not the loud address check the suite asks for."""

    def swap_static_buffer(self, name):
        buffers = self.runner.buffers
        if name in buffers.NAMES:
            setattr(buffers, name, getattr(buffers, name).tolist())
        else:
            super().swap_static_buffer(name)


# -- what runs and what is reported ---------------------------------------------------------------
class _SilentDowngrade(ModelRunner):
    """Resolves the mode as the table says but keeps the downgrade to itself."""

    def __init__(self, config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(config)
        self.resolution = replace(self.resolution, warnings=())


class _ResolvesEverythingToNone(ModelRunner):
    """Gives up on graphs for every mode (and says so), although its attention supports them: the
    suites used to skip such an engine as 'resolved to NONE'."""

    def __init__(self, config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(replace(config, mode="NONE"))
        self.resolution = replace(self.resolution, requested=self.resolution.requested.parse(config.mode),
                                  warnings=(f"cudagraph_mode {config.mode} -> NONE: graphs disabled",))


class _ReportsGraphRunsEager(ModelRunner):
    """Falls back to eager without saying so: the step reports the graph mode it skipped."""

    def step(self, requests, padding_fill=None):
        n = sum(len(r.token_ids) for r in requests)
        reported = super().step(requests, padding_fill)
        eager = self._run(requests, CUDAGraphMode.NONE, n, None, None, padding_fill)
        return StepOutput(eager.logits, reported.runtime_mode, n, reported.padded_num_tokens)


class _ReportsWrongMode(ModelRunner):
    """Reports PIECEWISE for steps that replayed a FULL graph."""

    def step(self, requests, padding_fill=None):
        out = super().step(requests, padding_fill)
        if out.runtime_mode == "FULL":
            out.runtime_mode = "PIECEWISE"
        return out


class _UniformByCount(ModelRunner):
    """Decides `uniform` from the token count alone (num_tokens == q x num_reqs), so a verify batch
    of unequal request lengths runs the uniform-decode graph (vLLM #28207)."""

    def step(self, requests, padding_fill=None):
        n = sum(len(r.token_ids) for r in requests)
        mode, key = self.dispatcher.dispatch(n, len(requests), n == self.q * len(requests))
        if mode is CUDAGraphMode.NONE:
            return super().step(requests, padding_fill)
        return self._run(requests, mode, key.num_tokens, None, key, padding_fill)


class _StandInGraphs(ModelRunner):
    """A stand-in for graphs that 'replays' by calling the captured Python function again: every
    step is eager, and a host sync in capture would go unnoticed."""

    class Backend:
        name = "stand-in"

        class Graph:
            def __init__(self, fn):
                self.fn, self.output = fn, fn()

            def replay(self, inputs=None):
                self.output = self.fn()

        def capture(self, fn, *, static_inputs, name=""):
            return self.Graph(fn)

        def close_capture_phase(self):
            pass

        def pool_stats(self):
            return {"bytes": 1}

    def __init__(self, config):
        super().__init__(config)
        self.graphs = self.Backend()


class _DoubleReplay(ModelRunner):
    """Replays a FULL graph twice per step: right answers, twice the launches."""

    def _execute(self, layout, mode, key):
        if mode is CUDAGraphMode.FULL:
            self.full_graphs[key].replay(self.graph_inputs())
        return super()._execute(layout, mode, key)


class _WindowFrozenAtCapture(ModelRunner):
    """Attention sizes its context window from the longest sequence it sees on the host; a graph
    keeps the window it was captured with, too short for later contexts."""

    def __init__(self, config):
        super().__init__(config)
        self._window = config.max_model_len
        for backend in self.backends:
            backend.per_token = self._windowed(backend)

    def _windowed(self, backend):
        def per_token(layer, q, meta):
            window = meta.context_window[: self._window]
            k, v = gather_context(backend.cache, layer, meta.block_tables.index_select(0, meta.token_req),
                                  window[None, :])
            mask = window[None, :] <= meta.positions[:, None]
            return attend(q[:, None], k, v, mask[:, None, :], backend.scale)[:, 0]
        return per_token

    def _execute(self, layout, mode, key):
        self._window = max(layout.seq_lens)
        return super()._execute(layout, mode, key)

    def _capture_full(self, key):
        self._window = self.q  # the capture batch is all padding: contexts of q tokens
        super()._capture_full(key)


class _LyingAlwaysBackend(StaticBackend):
    """Declares ALWAYS, but inside a graph it uses a decode kernel that lets every token of a
    request see the whole request, future tokens of a prompt included."""

    def forward(self, layer, q, meta):
        if not self.graphs.capturing:
            return self.per_token(layer, q, meta)
        k, v = gather_context(self.cache, layer, meta.block_tables.index_select(0, meta.token_req),
                              meta.context_window[None, :])
        mask = meta.context_window[None, :] < meta.seq_lens.index_select(0, meta.token_req)[:, None]
        return attend(q[:, None], k, v, mask[:, None, :], self.scale)[:, 0]


class _AlwaysLiar(ModelRunner):
    __doc__ = _LyingAlwaysBackend.__doc__

    def __init__(self, config):
        super().__init__(config)
        for index, backend in enumerate(self.backends):
            if isinstance(backend, StaticBackend):
                liar = _LyingAlwaysBackend(backend.cache, backend.scale)
                liar.graphs = self.graphs
                self.backends[index] = liar


class _RotaryOffByOne(ModelRunner):
    """Rotates each query one position too far (keys are right), in every path, eager and graphs
    alike: every equality of the runtime with itself holds, and only an independent forward sees it."""

    def __init__(self, config):
        super().__init__(config)
        model, pre_attention = self.model, self.model.pre_attention

        def query_one_off(index, hidden, positions):
            q, k, v = pre_attention(index, hidden, positions)
            shifted, _, _ = pre_attention(index, hidden, positions + 1)
            return shifted, k, v

        model.pre_attention = query_one_off


# -- capture --------------------------------------------------------------------------------------
class _CaptureWritesLiveKV(ModelRunner):
    """Warm-up and capture run their dummy batch on real slots instead of the padding slot: the
    KV of requests already in the cache is overwritten."""

    def _load_dummy(self, num_tokens, uniform):
        layout = super()._load_dummy(num_tokens, uniform)
        block = self.config.block_size
        self.buffers.slot_mapping[:num_tokens].copy_(torch.arange(block, block + num_tokens))
        return layout


class _CaptureConsumesKVCapacity(ModelRunner):
    """Gives every capture batch KV blocks of its own and never frees them."""

    def _load_dummy(self, num_tokens, uniform):
        self.allocator.ensure(-1 - len(self.allocator.tables), num_tokens)
        return super()._load_dummy(num_tokens, uniform)


class _PiecewiseIsOneGraph(ModelRunner):
    """Captures the whole forward, attention included, as the single 'piece' of a PIECEWISE size."""

    def _capture_pieces(self, n):
        meta = self.buffers.metadata(self._load_dummy(n, uniform=False))
        self._forward(meta)
        self.piece_graphs[n] = [self.graphs.capture(lambda: self._forward(meta), static_inputs=self.graph_inputs(),
                                                    name=f"PIECEWISE n={n}")]

    def _run_pieces(self, meta):
        graph = self.piece_graphs[meta.num_tokens][0]
        graph.replay(self.graph_inputs())
        return graph.output


class _GraphMemoryInKiB(ReferenceEngine):
    """Reports graph memory in KiB where the protocol asks for bytes."""

    def capture(self):
        report = super().capture()
        return replace(report, memory_bytes=report.memory_bytes // 1024)


class _SecondCaptureTypeError(ModelRunner):
    """A second capture() dies of a TypeError instead of refusing the closed capture phase."""

    def capture(self):
        if self.capture_summary is not None:
            return len(None)
        return super().capture()


class _RecapturesSilently(ModelRunner):
    """A second capture() throws the graphs away and captures them all again."""

    def capture(self):
        if self.capture_summary is not None:
            self.capture_summary, self.full_graphs, self.piece_graphs = None, {}, {}
            self.graphs._capture_phase_closed = False
        return super().capture()


class _CapturesInService(ModelRunner):
    """capture() records nothing; each graph is captured the first time a step needs it."""

    def capture(self):
        from reference_runtime.engine.runner import CaptureSummary

        if self.capture_summary is not None:
            raise RuntimeError("the capture phase is over")
        self.capture_summary = CaptureSummary({"FULL": 0, "PIECEWISE": 0}, 0.001, None, {}, [], self.graphs.name)
        return self.capture_summary

    def _load_and_execute(self, layout, mode, key):
        if mode is CUDAGraphMode.FULL and key not in self.full_graphs:
            with self.capture_phase():
                self._capture_full(key)
        if mode is CUDAGraphMode.PIECEWISE and layout.num_tokens not in self.piece_graphs:
            with self.capture_phase():
                self._capture_pieces(layout.num_tokens)
        return super()._load_and_execute(layout, mode, key)


def _engine_mutant(name: str, engine_class: type) -> type:
    return mutant(name, type(engine_class.__name__, (ModelRunner,), {"__doc__": engine_class.__doc__}), engine_class)


SlotWraps = mutant("slot-minus-one-wraps", _SlotWraps)
StaleBlockTables = mutant("stale-block-tables", _StaleBlockTables)
NewInputTensors = mutant("new-input-tensors", _NewInputTensors)
PadsBelowBatch = mutant("pads-below-batch", _PadsBelowBatch)
LeakyReduction = mutant("leaky-batch-reduction", _LeakyReduction)
StalePaddedPositions = mutant("stale-padded-positions", _StalePaddedPositions)
KeptRowsKeepTheirTables = mutant("kept-rows-keep-their-tables", _KeptRowsKeepTheirTables)
RowsKeepTheirTablesOnEveryPath = mutant("rows-keep-their-tables-on-every-path", _RowsKeepTheirTablesOnEveryPath)
KeptRowsUpdateOneTokenARow = mutant("kept-rows-update-one-token-a-row", _KeptRowsUpdateOneTokenARow)
IgnoresPaddingFills = mutant("ignores-padding-fills", _IgnoresPaddingFills)
OutputsOverwritten = mutant("outputs-overwritten", _OutputsOverwritten)
SwapBreaksTheStep = _engine_mutant("swap-breaks-the-step", _SwapBreaksTheStep)
SilentDowngrade = mutant("silent-engine-downgrade", _SilentDowngrade)
ResolvesEverythingToNone = mutant("resolves-everything-to-none", _ResolvesEverythingToNone)
ReportsGraphRunsEager = mutant("reports-graph-runs-eager", _ReportsGraphRunsEager)
ReportsWrongMode = mutant("reports-wrong-mode", _ReportsWrongMode)
UniformByCount = mutant("uniform-by-count", _UniformByCount)
StandInGraphs = mutant("stand-in-graphs", _StandInGraphs)
DoubleReplay = mutant("double-replay", _DoubleReplay)
WindowFrozenAtCapture = mutant("window-frozen-at-capture", _WindowFrozenAtCapture)
AlwaysLiar = mutant("always-liar", _AlwaysLiar)
RotaryOffByOne = mutant("rotary-off-by-one", _RotaryOffByOne)
CaptureWritesLiveKV = mutant("capture-writes-live-kv", _CaptureWritesLiveKV)
CaptureConsumesKVCapacity = mutant("capture-consumes-kv-capacity", _CaptureConsumesKVCapacity)
PiecewiseIsOneGraph = mutant("piecewise-is-one-graph", _PiecewiseIsOneGraph)
GraphMemoryInKiB = _engine_mutant("graph-memory-in-kib", _GraphMemoryInKiB)
SecondCaptureTypeError = mutant("second-capture-type-error", _SecondCaptureTypeError)
RecapturesSilently = mutant("recaptures-silently", _RecapturesSilently)
CapturesInService = mutant("captures-in-service", _CapturesInService)

MUTANTS = [SlotWraps, StaleBlockTables, NewInputTensors, PadsBelowBatch, LeakyReduction, StalePaddedPositions,
           KeptRowsKeepTheirTables, RowsKeepTheirTablesOnEveryPath, KeptRowsUpdateOneTokenARow, IgnoresPaddingFills,
           OutputsOverwritten, SwapBreaksTheStep, SilentDowngrade, ResolvesEverythingToNone, ReportsGraphRunsEager,
           ReportsWrongMode, UniformByCount, StandInGraphs, DoubleReplay, WindowFrozenAtCapture, AlwaysLiar,
           RotaryOffByOne, CaptureWritesLiveKV, CaptureConsumesKVCapacity, PiecewiseIsOneGraph, GraphMemoryInKiB,
           SecondCaptureTypeError, RecapturesSilently, CapturesInService]
