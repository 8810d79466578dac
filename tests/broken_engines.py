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


class StaleBlockTablesStager(StaticBuffers):
    """Graph steps keep the block tables already in the static buffer instead of refreshing them."""

    def stage(self, plan):
        if plan.mode is not NONE and plan.num_real_rows:
            plan = replace(plan, block_tables=self.block_tables[: plan.num_rows].tolist())
        return super().stage(plan)


class _NewInputTensorsStager(StaticBuffers):
    """Graph steps bind new input tensors instead of copying into the captured ones, and replay
    without checking addresses: the graph reads the old memory."""

    def stage(self, plan):
        staged = super().stage(plan)
        if plan.mode is not NONE and plan.num_real_rows:
            self.swap("input_ids")
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
    return ModelRunner(config, stager=_NewInputTensorsStager,
                       graphs=UncheckedGraphs(make_backend(config.graph_backend, config.device)))


class _PadsBelowDispatcher(Dispatcher):
    """Pads a batch to the capture size below it when it falls between two sizes."""

    def dispatch(self, num_tokens, num_reqs=None, uniform=False, num_active_loras=0, **kw):
        smaller = [s for s in self.sizes if s < num_tokens]
        if num_tokens not in self.sizes and smaller and num_tokens <= self.sizes[-1]:
            return CUDAGraphMode.PIECEWISE, BatchDescriptor(smaller[-1])
        return super().dispatch(num_tokens, num_reqs, uniform, num_active_loras, **kw)


class _LeakyDecoder(Decoder):
    """A batch-wide reduction mixes padded rows into real ones (a norm over the whole batch)."""

    def first_piece(self, input_ids, positions):
        hidden, q, k, v = super().first_piece(input_ids, positions)
        return hidden + 1e-2 * hidden.mean(dim=0, keepdim=True), q, k, v


class _StalePaddedPositionsStager(StaticBuffers):
    """Padded rows keep the positions an earlier, larger step left in the static buffer (the
    real rows are right, so only the padded inputs show it)."""

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        left = self.positions[real:size].tolist()  # what an earlier step left there
        return super().stage(replace(plan, positions=plan.positions[:real] + left))


class StalePaddingIdsStager(StaticBuffers):
    """Padded rows keep the token ids an earlier step left in the static buffer, while the runtime
    declares random_padding_ids: it claims to draw them anew and does not."""

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        return super().stage(replace(plan, input_ids=plan.input_ids[:real] + self.input_ids[real:size].tolist()))


class RandomPaddingIdsStager(StaticBuffers):
    """Draws padded rows' token ids anew every step (as LMDeploy does), without declaring
    random_padding_ids: the padded inputs then depend on the step, which the suite cannot tell
    from stale ones."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.draws = torch.Generator().manual_seed(0)

    def stage(self, plan):
        real, size = plan.num_real_tokens, plan.num_padded_tokens
        ids = torch.randint(1, 200, (size - real,), generator=self.draws).tolist()
        return super().stage(replace(plan, input_ids=plan.input_ids[:real] + ids))


class _KeptRowsKeepTheirTablesPlanner(Planner):
    """Keeps request rows from one decode step to the next (a persistent batch) but refreshes a
    row's block table only when the table grows: a request that takes another's row (the batch
    reordered, or one request finished and another joined) attends over the old occupant's blocks."""

    def update_persistent(self, requests, key, num_tokens):
        kept = self.persistent
        if kept is not None and kept.num_real_rows == len(requests):
            for row, request in enumerate(requests):
                table = self.allocator.tables.get(request.request_id)
                if table is not None and len(table) == len(kept.block_tables[row]):
                    kept.owners[row] = table  # a table as long as the row's passes for it
        return super().update_persistent(requests, key, num_tokens)


class _KeptRowsUpdateOneTokenARowPlanner(Planner):
    """Keeps request rows from step to step and updates only each row's first token position and
    slot, as if every step were a one-token decode: a verify step's later tokens keep the positions
    and slots of the step before, so they attend from the wrong place and write over old KV."""

    def update_persistent(self, requests, key, num_tokens):
        kept = self.persistent
        before = None if kept is None else (list(kept.positions), list(kept.slot_mapping))
        plan = super().update_persistent(requests, key, num_tokens)
        if plan is not None and plan.uniform_q > 1:
            q = plan.uniform_q
            for t in range(len(requests) * q):
                if t % q:  # not a row's first token: left as the last step had it
                    plan.positions[t], plan.slot_mapping[t] = before[0][t], before[1][t]
        return plan


class _RowsKeepTheirTablesOnEveryPathPlanner(Planner):
    """A persistent batch that rebuilds its rows' block tables only when the number of rows changes
    (a request joined or left), and otherwise only grows them, on every path, eager included: a
    request that takes another's row in a batch of the same size reads the old occupant's blocks,
    and eager and graph steps agree on the wrong answer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_tables: list[list[int]] = []

    def update_persistent(self, requests, key, num_tokens):
        return None  # every step plans its layout

    def fresh(self, requests, mode, key, num_tokens, uniform_q):
        plan = super().fresh(requests, mode, key, num_tokens, uniform_q)
        if not requests:
            return plan
        kept, new = self.row_tables, plan.block_tables
        if len(kept) == len(new):
            tables = [old if len(old) == len(table) else list(table) for old, table in zip(kept, new)]
        else:
            tables = [list(table) for table in new]
        self.row_tables = tables
        return replace(plan, block_tables=tables)


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


class _SwapBreaksTheStepStager(StaticBuffers):
    """swap_static_buffer() leaves a list where the tensor was: the next step dies of a TypeError,
    which is a bug in the engine, not the loud address check the suite asks for."""

    def swap(self, name):
        setattr(self, name, getattr(self, name).tolist())


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
class _SilentDowngrade(ModelRunner):
    """Resolves the mode as the table says but keeps the downgrade to itself."""

    def __init__(self, config, **seams):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(config, **seams)
        self.resolution = replace(self.resolution, warnings=())


class _ResolvesEverythingToNone(ModelRunner):
    """Gives up on graphs for every mode (and says so), although its attention supports them: the
    suites used to skip such an engine as 'resolved to NONE'."""

    def __init__(self, config, **seams):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(replace(config, policy=replace(config.policy, mode=CUDAGraphMode.NONE)), **seams)
        requested = config.policy.mode.name
        self.resolution = Resolution(requested, "NONE", (f"cudagraph_mode {requested} -> NONE: graphs disabled",))


class _ReportsGraphRunsEager(ModelRunner):
    """Falls back to eager without saying so: the step reports the graph mode it skipped."""

    def step(self, requests, padding_fill=None):
        reported = super().step(requests, padding_fill)
        eager = self.eager_step(requests, reported.num_tokens)
        return StepResult(eager.logits, reported.runtime_mode, reported.num_tokens, reported.padded_num_tokens)


class _ReportsWrongMode(ModelRunner):
    """Reports PIECEWISE for steps that replayed a FULL graph."""

    def step(self, requests, padding_fill=None):
        out = super().step(requests, padding_fill)
        if out.runtime_mode == "FULL":
            out.runtime_mode = "PIECEWISE"
        return out


class _UniformByCountPlanner(Planner):
    """Decides `uniform` from the token count alone (num_tokens == q x num_reqs), so a verify batch
    of unequal request lengths runs the uniform-decode graph (vLLM #28207)."""

    def is_uniform(self, requests):
        return bool(requests) and sum(len(r.token_ids) for r in requests) == self.q * len(requests)

    def lay_out(self, requests, mode, key, num_tokens, uniform=None):
        return super().lay_out(requests, mode, key, num_tokens)  # as the batch is: the graph's layout is not checked


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
class _CaptureWritesLiveKVPlanner(Planner):
    """Warm-up and capture run their dummy batch on real slots instead of the padding slot: the
    KV of requests already in the cache is overwritten."""

    def dummy(self, mode, key):
        plan = super().dummy(mode, key)
        block = self.allocator.block_size
        return replace(plan, slot_mapping=list(range(block, block + key.num_tokens)))


class _CaptureConsumesKVCapacityPlanner(Planner):
    """Gives every capture batch KV blocks of its own and never frees them."""

    def dummy(self, mode, key):
        self.allocator.ensure(-1 - len(self.allocator.tables), key.num_tokens)
        return super().dummy(mode, key)


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
StaleBlockTables = mutant("stale-block-tables", "StaleBlockTables", with_seams(stager=StaleBlockTablesStager),
                          StaleBlockTablesStager.__doc__)
NewInputTensors = mutant("new-input-tensors", "NewInputTensors", _new_input_tensors, _NewInputTensorsStager.__doc__)
PadsBelowBatch = mutant("pads-below-batch", "PadsBelowBatch", with_seams(dispatcher=_PadsBelowDispatcher),
                        _PadsBelowDispatcher.__doc__)
LeakyReduction = mutant("leaky-batch-reduction", "LeakyReduction", with_seams(model=_LeakyDecoder.from_checkpoint),
                        _LeakyDecoder.__doc__)
StalePaddedPositions = mutant("stale-padded-positions", "StalePaddedPositions",
                              with_seams(stager=_StalePaddedPositionsStager), _StalePaddedPositionsStager.__doc__)
KeptRowsKeepTheirTables = mutant("kept-rows-keep-their-tables", "KeptRowsKeepTheirTables",
                                 with_seams(planner=_KeptRowsKeepTheirTablesPlanner),
                                 _KeptRowsKeepTheirTablesPlanner.__doc__)
RowsKeepTheirTablesOnEveryPath = mutant("rows-keep-their-tables-on-every-path", "RowsKeepTheirTablesOnEveryPath",
                                        with_seams(planner=_RowsKeepTheirTablesOnEveryPathPlanner),
                                        _RowsKeepTheirTablesOnEveryPathPlanner.__doc__)
EagerDriftsWithHistory = mutant("eager-drifts-with-history", "EagerDriftsWithHistory",
                                with_strategy(_EagerDriftsWithHistory), _EagerDriftsWithHistory.__doc__)
KeptRowsUpdateOneTokenARow = mutant("kept-rows-update-one-token-a-row", "KeptRowsUpdateOneTokenARow",
                                    with_seams(planner=_KeptRowsUpdateOneTokenARowPlanner),
                                    _KeptRowsUpdateOneTokenARowPlanner.__doc__)
IgnoresPaddingFills = mutant("ignores-padding-fills", "IgnoresPaddingFills", _IgnoresPaddingFills)
OutputsOverwritten = mutant("outputs-overwritten", "OutputsOverwritten", with_strategy(_OutputsOverwritten),
                            _OutputsOverwritten.__doc__)
SwapBreaksTheStep = mutant("swap-breaks-the-step", "SwapBreaksTheStep", with_seams(stager=_SwapBreaksTheStepStager),
                           _SwapBreaksTheStepStager.__doc__)
SilentDowngrade = mutant("silent-engine-downgrade", "SilentDowngrade", _SilentDowngrade)
ResolvesEverythingToNone = mutant("resolves-everything-to-none", "ResolvesEverythingToNone", _ResolvesEverythingToNone)
ReportsGraphRunsEager = mutant("reports-graph-runs-eager", "ReportsGraphRunsEager", _ReportsGraphRunsEager)
ReportsWrongMode = mutant("reports-wrong-mode", "ReportsWrongMode", _ReportsWrongMode)
UniformByCount = mutant("uniform-by-count", "UniformByCount", with_seams(planner=_UniformByCountPlanner),
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
                             with_seams(planner=_CaptureWritesLiveKVPlanner), _CaptureWritesLiveKVPlanner.__doc__)
CaptureConsumesKVCapacity = mutant("capture-consumes-kv-capacity", "CaptureConsumesKVCapacity",
                                   with_seams(planner=_CaptureConsumesKVCapacityPlanner),
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
                                       with_seams(stager=StalePaddingIdsStager), StalePaddingIdsStager.__doc__,
                                       random_padding_ids=True)
RandomPaddingIdsUndeclared = mutant("random-padding-ids-undeclared", "RandomPaddingIdsUndeclared",
                                    with_seams(stager=RandomPaddingIdsStager), RandomPaddingIdsStager.__doc__)
# Not mutants: random ids, declared, as LMDeploy's; lazy capture, declared, as torch.compile's graph
# trees: the suites must let them pass.
RandomPaddingIdsDeclared = mutant("random-padding-ids-declared", "RandomPaddingIdsDeclared",
                                  with_seams(stager=RandomPaddingIdsStager), "Random padded ids, declared.",
                                  random_padding_ids=True)
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
