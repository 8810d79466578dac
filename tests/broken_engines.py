"""Deliberately broken engines: the reference engine with one bug each, of a kind real engines
shipped. The self-tests check that the execution suites catch every one of them.

Each mutant is a runtime whose engine differs from the reference in one place.
"""
from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from reference_runtime.adapter import ReferenceRuntime
from reference_runtime.engine.attention import StaticBackend, attend, gather_context
from reference_runtime.engine.runner import CUDAGraphMode, ModelRunner, StepOutput


def mutant(name: str, runner_class: type) -> type:
    return type(runner_class.__name__.lstrip("_"), (ReferenceRuntime,), {"name": name, "runner_class": runner_class,
                                                             "__doc__": runner_class.__doc__})


class _SlotWraps(ModelRunner):
    """Padded rows' slot -1 is used as a Python index: it wraps onto the last real slot."""

    def __init__(self, config):
        super().__init__(config)
        cache = self.cache

        def write(layer, k, v, slot_mapping):
            cache.data[layer, 0, : cache.num_slots][slot_mapping] = k
            cache.data[layer, 1, : cache.num_slots][slot_mapping] = v

        cache.write = write


class _StaleBlockTables(ModelRunner):
    """Graph steps keep the block tables already in the static buffer instead of refreshing them."""

    def __init__(self, config):
        super().__init__(config)
        load = self.buffers.load

        def load_keeping_tables(layout):
            tables = self.buffers.block_tables.clone()
            load(layout)
            if self._graph_step:
                self.buffers.block_tables.copy_(tables)

        self.buffers.load = load_keeping_tables
        self._graph_step = False

    def _run(self, requests, mode, *args, **kwargs):
        self._graph_step = mode is not CUDAGraphMode.NONE
        return super()._run(requests, mode, *args, **kwargs)


class _NewInputTensors(ModelRunner):
    """Graph steps bind new input tensors instead of copying into the captured ones, and replay
    without checking addresses: the graph reads the old memory."""

    def __init__(self, config):
        super().__init__(config)
        load = self.buffers.load

        def load_into_new_tensor(layout):
            load(layout)
            if self._graph_step:
                self.buffers.input_ids = self.buffers.input_ids.clone()

        self.buffers.load = load_into_new_tensor
        self._graph_step = False

    def capture(self):
        summary = super().capture()
        for graph in list(self.full_graphs.values()) + [g for gs in self.piece_graphs.values() for g in gs]:
            graph.replay = lambda inputs=None, g=graph: type(g).replay(g, None)
        return summary

    def _run(self, requests, mode, *args, **kwargs):
        self._graph_step = mode is not CUDAGraphMode.NONE
        return super()._run(requests, mode, *args, **kwargs)


class _PadsBelowBatch(ModelRunner):
    """Pads a batch to the capture size below it when it falls between two sizes."""

    def step(self, requests, padding_fill=None):
        n = sum(len(r.token_ids) for r in requests)
        sizes = self.dispatcher.sizes
        smaller = [s for s in sizes if s < n]
        if n not in sizes and smaller and n <= sizes[-1]:
            key_size = smaller[-1]
            return self._run(requests, CUDAGraphMode.PIECEWISE, key_size, None, None, padding_fill)
        return super().step(requests, padding_fill)


class _LeakyReduction(ModelRunner):
    """A batch-wide reduction mixes padded rows into real ones (a norm over the whole batch)."""

    def __init__(self, config):
        super().__init__(config)
        model = self.model
        first_piece = model.first_piece

        def leaky_first_piece(input_ids, positions):
            hidden, q, k, v = first_piece(input_ids, positions)
            return hidden + 1e-2 * hidden.mean(dim=0, keepdim=True), q, k, v

        model.first_piece = leaky_first_piece


class _SilentDowngrade(ModelRunner):
    """Resolves the mode as the table says but keeps the downgrade to itself."""

    def __init__(self, config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(config)
        self.resolution = replace(self.resolution, warnings=())


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


class _OutputsOverwritten(ModelRunner):
    """Returns a view of the graph's output buffer while declaring that outputs are the caller's."""

    def _execute(self, layout, mode, key, n):
        if mode is CUDAGraphMode.FULL:
            graph = self.full_graphs[key]
            graph.replay(self.buffers.tensors())
            return StepOutput(graph.output[:n], mode.name, n, layout.num_tokens)
        return super()._execute(layout, mode, key, n)


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

    def _execute(self, layout, mode, key, n):
        self._window = max(layout.seq_lens)
        return super()._execute(layout, mode, key, n)

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
        for backend in self.backends:
            backend.cache = self.cache


SlotWraps = mutant("slot-minus-one-wraps", _SlotWraps)
StaleBlockTables = mutant("stale-block-tables", _StaleBlockTables)
NewInputTensors = mutant("new-input-tensors", _NewInputTensors)
PadsBelowBatch = mutant("pads-below-batch", _PadsBelowBatch)
LeakyReduction = mutant("leaky-batch-reduction", _LeakyReduction)
SilentDowngrade = mutant("silent-engine-downgrade", _SilentDowngrade)
ReportsGraphRunsEager = mutant("reports-graph-runs-eager", _ReportsGraphRunsEager)
ReportsWrongMode = mutant("reports-wrong-mode", _ReportsWrongMode)
OutputsOverwritten = mutant("outputs-overwritten", _OutputsOverwritten)
WindowFrozenAtCapture = mutant("window-frozen-at-capture", _WindowFrozenAtCapture)
AlwaysLiar = mutant("always-liar", _AlwaysLiar)

MUTANTS = [SlotWraps, StaleBlockTables, NewInputTensors, PadsBelowBatch, LeakyReduction, SilentDowngrade,
           ReportsGraphRunsEager, ReportsWrongMode, OutputsOverwritten, WindowFrozenAtCapture, AlwaysLiar]
