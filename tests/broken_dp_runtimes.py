"""Deliberately broken data-parallel runtimes: the reference engine with one bug each in how its
ranks agree (reference_runtime/engine/data_parallel.py) or in what an idle rank does. The
self-test tests/test_data_parallel_catches.py checks that the data-parallel execution suite
catches every one of them.
"""
from __future__ import annotations

import os
from dataclasses import replace

import torch

from harness.protocol import Request, StepResult
from reference_runtime.adapter import ReferenceRuntime, runner_config
from reference_runtime.engine.buffers import StaticBuffers
from reference_runtime.engine.data_parallel import DataParallel
from reference_runtime.engine.runner import ModelRunner
from reference_runtime.policy import CUDAGraphMode
from tests.broken_engines import StaleBlockTablesStager
from reference_runtime.policy.data_parallel import graph_size, graph_uniform, lowest, own_share, runs
from reference_runtime.policy.modes import RUNTIME_MODE_RANK


class _PadsToLocalSize(DataParallel):
    """Agrees on the mode, but pads to the size its own dispatch chose instead of the largest."""

    def dispatch(self, dispatcher, num_real_tokens, num_real_rows, uniform, captured):
        mine, num_real_rows = own_share(dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        ranks = [r._replace(num_real_tokens=mine.num_real_tokens, size=mine.size) for r in self.exchange(mine)]
        return runs(dispatcher, ranks, self.rank, num_real_rows)


class _KeepsOwnMode(DataParallel):
    """Pads to the agreed size but keeps its own mode there: the re-dispatch is not restricted to
    the agreed mode (vllm-ascend #6011), so a decode rank replays FULL beside a PIECEWISE rank."""

    def dispatch(self, dispatcher, num_real_tokens, num_real_rows, uniform, captured):
        mine, num_real_rows = own_share(dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        ranks = self.exchange(mine)
        if lowest(ranks) is CUDAGraphMode.NONE:
            return runs(dispatcher, ranks, self.rank, num_real_rows)
        size = graph_size(dispatcher, ranks)
        # Its own uniformity (V1's rule, under V2 too): that is how a decode rank reaches FULL.
        return dispatcher.lookup(size, num_real_rows, mine.uniform and size % dispatcher.config.query_len == 0)


class _MaxModeConsensus(DataParallel):
    """Agrees on the highest mode any rank dispatched instead of the lowest; a rank with no graph
    of that mode for its batch falls back below it, as vLLM's dispatcher does."""

    def dispatch(self, dispatcher, num_real_tokens, num_real_rows, uniform, captured):
        mine, num_real_rows = own_share(dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        ranks = self.exchange(mine)
        agreed = max((r.mode for r in ranks), key=RUNTIME_MODE_RANK.__getitem__)
        if agreed is CUDAGraphMode.NONE:
            return runs(dispatcher, ranks, self.rank, num_real_rows)
        size = graph_size(dispatcher, ranks)
        allowed = frozenset(m for m in RUNTIME_MODE_RANK if RUNTIME_MODE_RANK[m] <= RUNTIME_MODE_RANK[agreed])
        return dispatcher.lookup(size, num_real_rows, graph_uniform(dispatcher, mine, ranks, size), allowed_modes=allowed)


class _PadsUnderEager(DataParallel):
    """Pads every rank to the largest size even when the ranks agreed on eager (vLLM before
    PR #34102 padded whenever graphs were enabled at all)."""

    def dispatch(self, dispatcher, num_real_tokens, num_real_rows, uniform, captured):
        mine, num_real_rows = own_share(dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        ranks = self.exchange(mine)
        if lowest(ranks) is CUDAGraphMode.NONE:
            return dispatcher.lookup(max(r.size for r in ranks), num_real_rows, mine.uniform,
                                     allowed_modes=frozenset({CUDAGraphMode.NONE}))
        return runs(dispatcher, ranks, self.rank, num_real_rows)


class _IdleSkipsTheStep(ModelRunner):
    """An idle rank returns at once: it never joins the all-reduce, so the busy ranks wait in it for ever."""

    def step(self, requests, padding_fill=None):
        if not requests:
            return StepResult(torch.empty(0, self.model.vocab, dtype=self.dtype, device=self.device), "NONE", 0, 1)
        return super().step(requests, padding_fill)


class _IdleSkipsTheForward(ModelRunner):
    """An idle rank joins the consensus, then reports what was agreed without running anything."""

    def step(self, requests, padding_fill=None):
        if not requests:
            mode, key = self.planner.decide(0, 0, False, captured=self.capture_report is not None)
            return StepResult(torch.empty(0, self.model.vocab, dtype=self.dtype, device=self.device), mode.name, 0,
                              key.num_padded_tokens)
        return super().step(requests, padding_fill)


DUMMY_REQUEST = -1


class _DummyWritesKV(ModelRunner):
    """An idle rank runs its dummy batch as a real one-token request: it takes a KV block and writes it."""

    def step(self, requests, padding_fill=None):
        if requests:
            return super().step(requests, padding_fill)
        out = super().step([Request(DUMMY_REQUEST, (0,), 0)], padding_fill)
        self.release(DUMMY_REQUEST)
        return StepResult(out.logits[:0], out.runtime_mode, 0, out.num_padded_tokens)


class _StaleTablesOnRankOne(ModelRunner):
    """On rank 1 only, graph steps keep the block tables the step before left in the static
    buffer: that rank's real rows read another request's KV."""

    def __init__(self, config, **seams):
        stale = config.data_parallel is not None and config.data_parallel[0] == 1
        stager = StaleBlockTablesStager.around(StaticBuffers) if stale else StaticBuffers
        super().__init__(config, stager=stager, **seams)


def mutant(name: str, *, consensus: type = DataParallel, runner: type = ModelRunner, policy: bool = True,
           class_name: str | None = None) -> type:
    """The reference runtime whose engines use this consensus and runner; with policy=False it
    declares no dispatch() (nor vLLM's policy), so the suite has only the ranks to compare."""
    broken = consensus if consensus is not DataParallel else runner

    def build(self, config):
        return runner(runner_config(config), consensus=consensus)

    namespace = {"name": name, "build": build, "__doc__": broken.__doc__}
    if not policy:
        namespace["capabilities"] = replace(ReferenceRuntime.capabilities, dispatch=False, rules=None,
                                            data_parallel=False)
        namespace["__doc__"] += " It declares no dispatch policy."
    return type(class_name or broken.__name__.lstrip("_"), (ReferenceRuntime,), namespace)


PadsToLocalSize = mutant("dp-pads-to-local-size", consensus=_PadsToLocalSize)
KeepsOwnMode = mutant("dp-keeps-own-mode", consensus=_KeepsOwnMode)
MaxModeConsensus = mutant("dp-max-mode-consensus", consensus=_MaxModeConsensus)
PadsUnderEager = mutant("dp-pads-under-eager", consensus=_PadsUnderEager)
IdleSkipsTheStep = mutant("dp-idle-skips-the-step", runner=_IdleSkipsTheStep)
IdleSkipsTheForward = mutant("dp-idle-skips-the-forward", runner=_IdleSkipsTheForward)
DummyWritesKV = mutant("dp-dummy-writes-kv", runner=_DummyWritesKV)
StaleTablesOnRankOne = mutant("dp-stale-tables-on-rank-one", runner=_StaleTablesOnRankOne)
# Without a declared policy the suite can only hold the ranks to each other.
KeepsOwnModeNoPolicy = mutant("dp-keeps-own-mode-no-policy", consensus=_KeepsOwnMode, policy=False,
                              class_name="KeepsOwnModeNoPolicy")
PadsToLocalSizeNoPolicy = mutant("dp-pads-to-local-size-no-policy", consensus=_PadsToLocalSize, policy=False,
                                 class_name="PadsToLocalSizeNoPolicy")

MUTANTS = [PadsToLocalSize, KeepsOwnMode, MaxModeConsensus, PadsUnderEager, IdleSkipsTheStep, IdleSkipsTheForward,
           DummyWritesKV, StaleTablesOnRankOne, KeepsOwnModeNoPolicy, PadsToLocalSizeNoPolicy]


# -- ranks that fail outright: for the harness's own test of how it reports them, not suite mutants --
class _FailingRunner(ModelRunner):
    """Raises on every rank at a step of two-token prompts; rank 1's process exits at one of three."""

    def step(self, requests, padding_fill=None):
        lengths = {len(r.token_ids) for r in requests}
        if lengths == {2}:
            raise ValueError("this engine cannot run two-token prompts")
        if lengths == {3} and self.config.data_parallel[0] == 1:
            os._exit(7)
        return super().step(requests, padding_fill)


class FailingRanks(ReferenceRuntime):
    name = "dp-failing-ranks"

    def build(self, config):
        return _FailingRunner(runner_config(config))
