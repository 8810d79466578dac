"""Deliberately broken engines: the reference engine with one bug each, of a kind real engines
shipped. The self-tests (test_broken_engines.py) check that the execution suites catch every one.

Each mutant replaces one named part of the reference runner, as a third party would: a
constructor seam (model, attention backends, dispatcher, planner, stager, graph backend) or one
of the runner's public methods (docs/architecture.md lists them). None reaches into private state.
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from functools import partial

import torch

from harness.graphs import make_backend
from harness.protocol import CaptureReport, Resolution, StepResult
from reference_runtime.adapter import ReferenceRuntime, runner_config
from reference_runtime.engine.attention import BACKENDS, StaticBackend, attend, gather_context
from reference_runtime.engine.buffers import StaticBuffers
from reference_runtime.engine.model import Decoder
from reference_runtime.engine.plan import FULL, NONE, PIECEWISE, Planner
from reference_runtime.engine.runner import ModelRunner
from reference_runtime.engine.seams import Wrapped
from reference_runtime.engine.strategy import CapturedGraphs
from reference_runtime.policy import BatchDescriptor, CUDAGraphMode, Dispatcher


def mutant(name: str, class_name: str, make_runner, doc: str | None = None, **declares) -> type:
    """The reference runtime whose engines are `make_runner(runner config)`, declaring what the
    reference does and `declares` besides."""
    def build(self, config):
        return make_runner(runner_config(config))

    namespace = {"name": name, "build": build, "__doc__": doc or make_runner.__doc__}
    if declares:
        namespace["capabilities"] = replace(ReferenceRuntime.capabilities, **declares)
    return type(class_name, (ReferenceRuntime,), namespace)


def with_seams(**seams):
    """The reference runner with these constructor seams replaced."""
    return partial(ModelRunner, **seams)


def with_planner(wrapper):
    """The reference runner whose planner is the default one inside `wrapper`."""
    return with_seams(planner=wrapper.around(Planner))


def with_stager(wrapper):
    """The reference runner whose stager is the default one inside `wrapper`."""
    return with_seams(stager=wrapper.around(StaticBuffers))


def with_strategy(wrapper):
    """The reference runner whose run strategy is the default one inside `wrapper`."""
    return with_seams(strategy=wrapper.around(CapturedGraphs))


# -- padding, metadata and addresses ------------------------------------------------------------
class _WritesSlotMinusOneAsAnIndex:
    """Padded rows' slot -1 is used as a Python index: it wraps onto the last real slot."""

    def __call__(self, layer, q, k, v, meta):
        cache = self.cache
        cache.data[layer, 0, : cache.num_slots][meta.slot_mapping] = k
        cache.data[layer, 1, : cache.num_slots][meta.slot_mapping] = v
        return self.forward(layer, q, meta)


SLOT_WRAPPING_BACKENDS = {name: type(f"SlotWrapping{cls.__name__}", (_WritesSlotMinusOneAsAnIndex, cls), {})
                          for name, cls in BACKENDS.items()}


class StaleBlockTablesStager(Wrapped):
    """Graph steps keep the block tables already in the static buffer instead of refreshing them."""

    def stage(self, plan):
        if plan.mode is not NONE and plan.num_real_rows:
            plan = replace(plan, block_tables=self.inner.block_tables[: plan.num_rows].tolist())
        return self.inner.stage(plan)


class _NewInputTensorsStager(Wrapped):
    """Graph steps bind new input tensors instead of copying into the captured ones, and replay
    without checking addresses: the graph reads the old memory."""

    def stage(self, plan):
        staged = self.inner.stage(plan)
        if plan.mode is not NONE and plan.num_real_rows:
            self.inner.swap("input_ids")
        return staged


class UncheckedGraphs:
    """A graph backend whose graphs never check their inputs' addresses."""

    class Graph:
        def __init__(self, graph):
            self.graph = graph

        @property
        def output(self):
            return self.graph.output

        def replay(self, inputs=None):
            self.graph.replay(None)

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):  # capturing, close_capture_phase, pool_stats, name
        return getattr(self.backend, name)

    def capture(self, fn, *, static_inputs, name=""):
        return self.Graph(self.backend.capture(fn, static_inputs=static_inputs, name=name))


def _new_input_tensors(config):
    return ModelRunner(config, stager=_NewInputTensorsStager.around(StaticBuffers),
                       graphs=UncheckedGraphs(make_backend(config.graph_backend, config.device)))


class _PadsBelowDispatcher(Dispatcher):
    """Pads a batch to the capture size below it when it falls between two sizes."""

    def dispatch(self, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0, **kw):
        smaller = [s for s in self.sizes if s < num_real_tokens]
        if num_real_tokens not in self.sizes and smaller and num_real_tokens <= self.sizes[-1]:
            return CUDAGraphMode.PIECEWISE, BatchDescriptor(smaller[-1])
        return super().dispatch(num_real_tokens, num_real_rows, uniform, num_active_loras, **kw)


class _LeakyDecoder(Decoder):
    """A batch-wide reduction mixes padded rows into real ones (a norm over the whole batch)."""

    def first_piece(self, input_ids, positions):
        hidden, q, k, v = super().first_piece(input_ids, positions)
        return hidden + 1e-2 * hidden.mean(dim=0, keepdim=True), q, k, v


class _StalePaddedPositionsStager(Wrapped):
    """Padded rows keep the positions an earlier, larger step left in the static buffer (the
    real rows are right, so only the padded inputs show it)."""

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        left = self.inner.positions[real:size].tolist()  # what an earlier step left there
        return self.inner.stage(replace(plan, positions=plan.positions[:real] + left))


class StalePaddingIdsStager(Wrapped):
    """Padded rows keep the token ids an earlier step left in the static buffer, while the runtime
    declares random_padding_ids: it claims to draw them anew and does not."""

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        left = self.inner.input_ids[real:size].tolist()  # what an earlier step left there
        return self.inner.stage(replace(plan, input_ids=plan.input_ids[:real] + left))


class RandomPaddingIdsStager(Wrapped):
    """Draws padded rows' token ids anew every step (as LMDeploy does), without declaring
    random_padding_ids: the padded inputs then depend on the step, which the suite cannot tell
    from stale ones."""

    def __init__(self, inner):
        super().__init__(inner)
        self.draws = torch.Generator().manual_seed(0)

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        ids = torch.randint(1, 200, (size - real,), generator=self.draws).tolist()
        return self.inner.stage(replace(plan, input_ids=plan.input_ids[:real] + ids))


class _KeptRowsKeepTheirTablesPlanner(Wrapped):
    """Keeps request rows from one decode step to the next (a persistent batch) but refreshes a
    row's block table only when the table grows: a request that takes another's row (the batch
    reordered, or one request finished and another joined) attends over the old occupant's blocks."""

    def plan(self, requests, captured):
        kept, tables = self.inner.persistent, self.inner.allocator.tables
        before = None if kept is None else [list(table) for table in kept.block_tables]
        had_blocks = [r.request_id in tables for r in requests]  # a newcomer's table is new to the row
        plan = self.inner.plan(requests, captured)
        if plan is kept:  # updated in place: a row whose table changed this step gets its old one back
            for row, table in enumerate(plan.block_tables[: len(requests)]):
                if plan.table_revisions[row] == plan.revision and had_blocks[row] and len(before[row]) == len(table):
                    plan.block_tables[row] = before[row]
        return plan


class _KeptRowsUpdateOneTokenARowPlanner(Wrapped):
    """Keeps request rows from step to step and updates only each row's first token position and
    slot, as if every step were a one-token decode: a verify step's later tokens keep the positions
    and slots of the step before, so they attend from the wrong place and write over old KV."""

    def plan(self, requests, captured):
        kept = self.inner.persistent
        before = None if kept is None else (list(kept.positions), list(kept.slot_mapping))
        plan = self.inner.plan(requests, captured)
        if plan is kept and plan.uniform_q > 1:  # the persistent batch, updated in place
            q = plan.uniform_q
            for t in range(len(requests) * q):
                if t % q:  # not a row's first token: left as the last step had it
                    plan.positions[t], plan.slot_mapping[t] = before[0][t], before[1][t]
        return plan


class _RowsKeepTheirTablesOnEveryPathPlanner(Wrapped):
    """A persistent batch that rebuilds its rows' block tables only when the number of rows changes
    (a request joined or left), and otherwise only grows them, on every path, eager included: a
    request that takes another's row in a batch of the same size reads the old occupant's blocks,
    and eager and graph steps agree on the wrong answer."""

    def __init__(self, inner):
        super().__init__(inner)
        self.row_tables: list[list[int]] = []

    def plan(self, requests, captured):
        return self.keep_tables(requests, self.inner.plan(requests, captured))

    def plan_eager(self, requests, num_padded_tokens):
        return self.keep_tables(requests, self.inner.plan_eager(requests, num_padded_tokens))

    def keep_tables(self, requests, plan):
        if not requests:
            return plan
        kept, new = self.row_tables, plan.block_tables
        if len(kept) == len(new):
            tables = [old if len(old) == len(table) else list(table) for old, table in zip(kept, new)]
        else:
            tables = [list(table) for table in new]
        self.row_tables = tables
        return replace(plan, block_tables=tables)  # a copy: the planner's own plan keeps the right tables


class _IgnoresPaddingFills(ModelRunner):
    """Accepts padding_fill and ignores it: the suites' padded-row checks test nothing."""

    def step(self, requests, padding_fill=None):
        return super().step(requests)


class _OutputsOverwritten(Wrapped):
    """Returns a view of the graph's output buffer while declaring that outputs are the caller's."""

    def run(self, plan, eager=False):
        result = self.inner.run(plan, eager)
        if plan.mode is FULL:
            return replace(result, logits=self.inner.full_graphs[plan.key].output[: plan.num_real_tokens])
        return result


class _SwapBreaksTheStepStager(Wrapped):
    """swap_static_buffer() leaves a list where the tensor was: the next step dies of a TypeError,
    which is a bug in the engine, not the loud address check the suite asks for."""

    def swap(self, name):
        setattr(self.inner, name, getattr(self.inner, name).tolist())


class _EagerDriftsWithHistory(Wrapped):
    """Its eager steps round differently (one ulp up) once the engine has served many steps, as a
    workspace or cache that a long history changes would: graph and eager agree on a fresh engine,
    and drift apart on one that has served a while."""
    DRIFTS_AFTER = 40  # steps: more than a fresh engine serves in the rows-changing-owner test

    def __init__(self, inner):
        super().__init__(inner)
        self.served = 0

    def run(self, plan, eager=False):
        self.served += 1
        result = self.inner.run(plan, eager)
        if plan.mode is NONE and self.served > self.DRIFTS_AFTER:
            return replace(result, logits=torch.nextafter(result.logits, torch.full_like(result.logits, float("inf"))))
        return result


# -- what runs and what is reported ---------------------------------------------------------------
def _silent_downgrade(config):
    """Resolves the mode as the table says but keeps the downgrade to itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = ModelRunner(config)
    runner.resolution = replace(runner.resolution, warnings=())
    return runner


def _resolves_everything_to_none(config):
    """Gives up on graphs for every mode (and says so), although its attention supports them: the
    suites used to skip such an engine as 'resolved to NONE'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = ModelRunner(replace(config, policy=replace(config.policy, mode=CUDAGraphMode.NONE)))
    requested = config.policy.mode.name
    runner.resolution = Resolution(requested, "NONE", (f"cudagraph_mode {requested} -> NONE: graphs disabled",))
    return runner


class _ReportsGraphRunsEager(ModelRunner):
    """Falls back to eager without saying so: the step reports the graph mode it skipped."""

    def step(self, requests, padding_fill=None):
        reported = super().step(requests, padding_fill)
        eager = self.eager_step(requests, reported.num_real_tokens)
        return StepResult(eager.logits, reported.runtime_mode, reported.num_real_tokens, reported.num_padded_tokens)


class _ReportsWrongMode(ModelRunner):
    """Reports PIECEWISE for steps that replayed a FULL graph."""

    def step(self, requests, padding_fill=None):
        out = super().step(requests, padding_fill)
        if out.runtime_mode == "FULL":
            out.runtime_mode = "PIECEWISE"
        return out


class _UniformByCountPlanner(Wrapped):
    """Decides `uniform` from the token count alone (num_real_tokens == q x num_real_rows), so a verify batch
    of unequal request lengths runs the uniform-decode graph (vLLM #28207)."""

    def plan(self, requests, captured):
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        uniform = bool(requests) and num_real_tokens == self.inner.q * len(requests)
        mode, key = self.inner.decide(num_real_tokens, len(requests), uniform, captured)
        # Laid out as the batch is: the graph's layout is not checked.
        return self.inner.lay_out(requests, mode, None if mode is NONE else key, key.num_padded_tokens)

    def plan_eager(self, requests, num_padded_tokens):
        return self.inner.lay_out(requests, NONE, None, num_padded_tokens)


class StandInGraphBackend:
    """A stand-in for graphs that 'replays' by calling the captured Python function again: every
    step is eager, and a host sync in capture would go unnoticed."""

    name = "stand-in"
    capturing = False

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


class _DoubleReplay(Wrapped):
    """Replays a FULL graph twice per step: right answers, twice the launches."""

    def run(self, plan, eager=False):
        result = self.inner.run(plan, eager)
        if plan.mode is FULL:  # the same staged inputs again: the same values, one launch more
            self.inner.full_graphs[plan.key].replay(self.inner.runner.graph_inputs)
        return result


class _WindowFrozenAtCapture(StaticBackend):
    """Attention sizes its context window from the longest sequence of the step, a host value; a
    graph keeps the window it was captured with, too short for later contexts."""

    def forward(self, layer, q, meta):
        window = meta.context_window[: meta.max_seq_len]
        k, v = gather_context(self.cache, layer, meta.block_tables.index_select(0, meta.token_req), window[None, :])
        mask = window[None, :] <= meta.positions[:, None]
        return attend(q[:, None], k, v, mask[:, None, :], self.scale)[:, 0]


class _LyingAlwaysBackend(StaticBackend):
    """Declares ALWAYS, but inside a graph it uses a decode kernel that lets every token of a
    request see the whole request, future tokens of a prompt included."""

    in_graph = False  # the run strategy below says when graphs are being captured

    def forward(self, layer, q, meta):
        if not self.in_graph:
            return self.per_token(layer, q, meta)
        k, v = gather_context(self.cache, layer, meta.block_tables.index_select(0, meta.token_req),
                              meta.context_window[None, :])
        mask = meta.context_window[None, :] < meta.seq_lens.index_select(0, meta.token_req)[:, None]
        return attend(q[:, None], k, v, mask[:, None, :], self.scale)[:, 0]


class _CapturesLiars(Wrapped):
    """Tells the lying backends when graphs are being recorded (warm-ups included: their outputs
    are thrown away; PIECEWISE pieces record no attention)."""

    def capture(self):
        liars = [b for b in self.inner.runner.backends if isinstance(b, _LyingAlwaysBackend)]
        for liar in liars:
            liar.in_graph = True
        try:
            return self.inner.capture()
        finally:
            for liar in liars:
                liar.in_graph = False


class _RotaryOffByOne(Decoder):
    """Rotates each query one position too far (keys are right), in every path, eager and graphs
    alike: every equality of the runtime with itself holds, and only an independent forward sees it."""

    def pre_attention(self, index, hidden, positions):
        _, k, v = super().pre_attention(index, hidden, positions)
        shifted, _, _ = super().pre_attention(index, hidden, positions + 1)
        return shifted, k, v


# -- capture --------------------------------------------------------------------------------------
class _CaptureWritesLiveKVPlanner(Wrapped):
    """Warm-up and capture run their dummy batch on real slots instead of the padding slot: the
    KV of requests already in the cache is overwritten."""

    def dummy(self, mode, key):
        plan = self.inner.dummy(mode, key)
        block = self.inner.allocator.block_size
        return replace(plan, slot_mapping=list(range(block, block + key.num_padded_tokens)))


class _CaptureConsumesKVCapacityPlanner(Wrapped):
    """Gives every capture batch KV blocks of its own and never frees them."""

    def dummy(self, mode, key):
        allocator = self.inner.allocator
        allocator.ensure(-1 - len(allocator.tables), key.num_padded_tokens)
        return self.inner.dummy(mode, key)


class _PiecewiseIsOneGraph(CapturedGraphs):
    """Captures the whole forward, attention included, as the single 'piece' of a PIECEWISE size
    (replaying a size's pieces then replays that one graph)."""

    def capture_key(self, mode, key, graphs):
        if mode is not PIECEWISE:
            return super().capture_key(mode, key, graphs)
        runner = self.runner
        plan = runner.planner.dummy(mode, key)
        runner.stager.transfer(runner.stager.stage(plan))
        meta = runner.stager.metadata(plan)
        self.forward(meta)  # warm-up
        return [graphs.capture(lambda: self.forward(meta), static_inputs=runner.graph_inputs(with_attention=True),
                               name=f"PIECEWISE n={plan.num_padded_tokens}")]


class _GraphMemoryInKiB(Wrapped):
    """Reports graph memory in KiB where the protocol asks for bytes."""

    def capture(self):
        report = self.inner.capture()
        return replace(report, memory_bytes=report.memory_bytes // 1024)


class _SecondCaptureTypeError(ModelRunner):
    """A second capture() dies of a TypeError instead of refusing the closed capture phase."""

    def capture(self):
        if self.capture_report is not None:
            return len(None)
        return super().capture()


class _RecapturesSilently(ModelRunner):
    """A second capture() throws the graphs away and captures them all again."""

    def capture(self):
        if self.capture_report is not None:
            self.capture_report = None
            self.graphs = make_backend(self.config.graph_backend, self.device)  # a capture phase of its own
            self.strategy = CapturedGraphs(self)  # no graphs yet
        return super().capture()


class _CapturesInService(Wrapped):
    """capture() records nothing; each graph is captured the first time a step needs it."""

    def capture(self):
        return CaptureReport({"FULL": 0, "PIECEWISE": 0}, 0.001, None, ())

    def run(self, plan, eager=False):
        inner, runner = self.inner, self.inner.runner
        missing = (plan.mode is FULL and plan.key not in inner.full_graphs) or \
            (plan.mode is PIECEWISE and plan.num_padded_tokens not in inner.piece_graphs)
        if missing:
            with runner.capture_phase():
                inner.record(plan.mode, plan.key, inner.capture_key(plan.mode, plan.key, runner.graphs))
        return inner.run(plan, eager)


class _LazyCheckingEveryReplay(_CapturesInService):
    """Records each graph the first time a step needs it, and checks a graph's input addresses at
    every replay: its first is its recording, in service."""

    def __init__(self, inner):
        super().__init__(inner)
        inner.runner.graphs.debug = True


class _RecordsPerContext(_CapturesInService):
    """Declares lazy_capture, and records a step's graph again whenever its longest context is one
    not seen at that key (as a graph compiled with a host length baked in would be): graphs pile up
    with every decode step."""

    def __init__(self, inner):
        super().__init__(inner)
        self.recorded_at: set[tuple] = set()  # (mode, key, longest context) of every recording

    def run(self, plan, eager=False):
        at = (plan.mode, plan.key, max(plan.seq_lens, default=0))
        if plan.mode is not NONE and at not in self.recorded_at:
            self.recorded_at.add(at)
            self.inner.full_graphs.pop(plan.key, None)
            self.inner.piece_graphs.pop(plan.num_padded_tokens, None)
        return super().run(plan, eager)


def _stand_in_graphs(config):
    return ModelRunner(config, graphs=StandInGraphBackend())


SlotWraps = mutant("slot-minus-one-wraps", "SlotWraps", with_seams(backends=SLOT_WRAPPING_BACKENDS),
                   _WritesSlotMinusOneAsAnIndex.__doc__)
StaleBlockTables = mutant("stale-block-tables", "StaleBlockTables", with_stager(StaleBlockTablesStager),
                          StaleBlockTablesStager.__doc__)
NewInputTensors = mutant("new-input-tensors", "NewInputTensors", _new_input_tensors, _NewInputTensorsStager.__doc__)
PadsBelowBatch = mutant("pads-below-batch", "PadsBelowBatch", with_seams(dispatcher=_PadsBelowDispatcher),
                        _PadsBelowDispatcher.__doc__)
LeakyReduction = mutant("leaky-batch-reduction", "LeakyReduction", with_seams(model=_LeakyDecoder.from_checkpoint),
                        _LeakyDecoder.__doc__)
StalePaddedPositions = mutant("stale-padded-positions", "StalePaddedPositions",
                              with_stager(_StalePaddedPositionsStager), _StalePaddedPositionsStager.__doc__)
KeptRowsKeepTheirTables = mutant("kept-rows-keep-their-tables", "KeptRowsKeepTheirTables",
                                 with_planner(_KeptRowsKeepTheirTablesPlanner),
                                 _KeptRowsKeepTheirTablesPlanner.__doc__)
RowsKeepTheirTablesOnEveryPath = mutant("rows-keep-their-tables-on-every-path", "RowsKeepTheirTablesOnEveryPath",
                                        with_planner(_RowsKeepTheirTablesOnEveryPathPlanner),
                                        _RowsKeepTheirTablesOnEveryPathPlanner.__doc__)
EagerDriftsWithHistory = mutant("eager-drifts-with-history", "EagerDriftsWithHistory",
                                with_strategy(_EagerDriftsWithHistory), _EagerDriftsWithHistory.__doc__)
KeptRowsUpdateOneTokenARow = mutant("kept-rows-update-one-token-a-row", "KeptRowsUpdateOneTokenARow",
                                    with_planner(_KeptRowsUpdateOneTokenARowPlanner),
                                    _KeptRowsUpdateOneTokenARowPlanner.__doc__)
IgnoresPaddingFills = mutant("ignores-padding-fills", "IgnoresPaddingFills", _IgnoresPaddingFills)
OutputsOverwritten = mutant("outputs-overwritten", "OutputsOverwritten", with_strategy(_OutputsOverwritten),
                            _OutputsOverwritten.__doc__)
SwapBreaksTheStep = mutant("swap-breaks-the-step", "SwapBreaksTheStep", with_stager(_SwapBreaksTheStepStager),
                           _SwapBreaksTheStepStager.__doc__)
SilentDowngrade = mutant("silent-engine-downgrade", "SilentDowngrade", _silent_downgrade)
ResolvesEverythingToNone = mutant("resolves-everything-to-none", "ResolvesEverythingToNone",
                                  _resolves_everything_to_none)
ReportsGraphRunsEager = mutant("reports-graph-runs-eager", "ReportsGraphRunsEager", _ReportsGraphRunsEager)
ReportsWrongMode = mutant("reports-wrong-mode", "ReportsWrongMode", _ReportsWrongMode)
UniformByCount = mutant("uniform-by-count", "UniformByCount", with_planner(_UniformByCountPlanner),
                        _UniformByCountPlanner.__doc__)
StandInGraphs = mutant("stand-in-graphs", "StandInGraphs", _stand_in_graphs, StandInGraphBackend.__doc__)
DoubleReplay = mutant("double-replay", "DoubleReplay", with_strategy(_DoubleReplay), _DoubleReplay.__doc__)
WindowFrozenAtCapture = mutant("window-frozen-at-capture", "WindowFrozenAtCapture",
                               with_seams(backends={**BACKENDS, "static": _WindowFrozenAtCapture}),
                               _WindowFrozenAtCapture.__doc__)
AlwaysLiar = mutant("always-liar", "AlwaysLiar",
                    with_seams(backends={**BACKENDS, "static": _LyingAlwaysBackend},
                               strategy=_CapturesLiars.around(CapturedGraphs)), _LyingAlwaysBackend.__doc__)
RotaryOffByOne = mutant("rotary-off-by-one", "RotaryOffByOne", with_seams(model=_RotaryOffByOne.from_checkpoint),
                        _RotaryOffByOne.__doc__)
CaptureWritesLiveKV = mutant("capture-writes-live-kv", "CaptureWritesLiveKV",
                             with_planner(_CaptureWritesLiveKVPlanner), _CaptureWritesLiveKVPlanner.__doc__)
CaptureConsumesKVCapacity = mutant("capture-consumes-kv-capacity", "CaptureConsumesKVCapacity",
                                   with_planner(_CaptureConsumesKVCapacityPlanner),
                                   _CaptureConsumesKVCapacityPlanner.__doc__)
PiecewiseIsOneGraph = mutant("piecewise-is-one-graph", "PiecewiseIsOneGraph", with_seams(strategy=_PiecewiseIsOneGraph),
                             _PiecewiseIsOneGraph.__doc__)
GraphMemoryInKiB = mutant("graph-memory-in-kib", "GraphMemoryInKiB", with_strategy(_GraphMemoryInKiB),
                          _GraphMemoryInKiB.__doc__)
SecondCaptureTypeError = mutant("second-capture-type-error", "SecondCaptureTypeError", _SecondCaptureTypeError)
RecapturesSilently = mutant("recaptures-silently", "RecapturesSilently", _RecapturesSilently)
CapturesInService = mutant("captures-in-service", "CapturesInService", with_strategy(_CapturesInService),
                           _CapturesInService.__doc__)
RecordsPerContext = mutant("records-per-context", "RecordsPerContext", with_strategy(_RecordsPerContext),
                           _RecordsPerContext.__doc__, lazy_capture=True)
LazyChecksTheFirstReplayOnly = mutant(
    "lazy-checks-the-first-replay-only", "LazyChecksTheFirstReplayOnly", with_strategy(_CapturesInService),
    "Declares lazy_capture and checks a graph's input addresses at its first replay only, which is its "
    "recording in service: a buffer moved after it is never noticed, and the graph reads the old memory.",
    lazy_capture=True)
StalePaddingIdsDeclaredRandom = mutant("stale-padding-ids-declared-random", "StalePaddingIdsDeclaredRandom",
                                       with_stager(StalePaddingIdsStager), StalePaddingIdsStager.__doc__,
                                       declarations={"random_padding_ids": True})
RandomPaddingIdsUndeclared = mutant("random-padding-ids-undeclared", "RandomPaddingIdsUndeclared",
                                    with_stager(RandomPaddingIdsStager), RandomPaddingIdsStager.__doc__)
# Not mutants: random ids, declared, as LMDeploy's; lazy capture, declared, as torch.compile's graph
# trees: the suites must let them pass.
RandomPaddingIdsDeclared = mutant("random-padding-ids-declared", "RandomPaddingIdsDeclared",
                                  with_stager(RandomPaddingIdsStager), "Random padded ids, declared.",
                                  declarations={"random_padding_ids": True})
LazyCaptureDeclared = mutant("lazy-capture-declared", "LazyCaptureDeclared", with_strategy(_LazyCheckingEveryReplay),
                             _LazyCheckingEveryReplay.__doc__, lazy_capture=True)

MUTANTS = [SlotWraps, StaleBlockTables, NewInputTensors, PadsBelowBatch, LeakyReduction, StalePaddedPositions,
           KeptRowsKeepTheirTables, RowsKeepTheirTablesOnEveryPath, KeptRowsUpdateOneTokenARow, IgnoresPaddingFills,
           OutputsOverwritten, SwapBreaksTheStep, SilentDowngrade, ResolvesEverythingToNone, ReportsGraphRunsEager,
           ReportsWrongMode, UniformByCount, StandInGraphs, DoubleReplay, WindowFrozenAtCapture, AlwaysLiar,
           RotaryOffByOne, CaptureWritesLiveKV, CaptureConsumesKVCapacity, PiecewiseIsOneGraph, GraphMemoryInKiB,
           SecondCaptureTypeError, RecapturesSilently, CapturesInService, RecordsPerContext,
           LazyChecksTheFirstReplayOnly, StalePaddingIdsDeclaredRandom, RandomPaddingIdsUndeclared,
           EagerDriftsWithHistory]
