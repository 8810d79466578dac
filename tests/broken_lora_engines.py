"""Deliberately broken LoRA engines: the reference engine with one LoRA bug each. The self-tests
(test_broken_lora_engines.py) check that suites/test_lora.py catches every one.

Each replaces one named part of the reference runner through its constructor seams, as
tests/broken_engines.py does: the run strategy (a subclass that defines `capture_key`), the
dispatcher, or the planner (wrapped, editing the plan it hands on).
"""
from __future__ import annotations

from dataclasses import replace

from reference_runtime.adapter import ReferenceRuntime
from reference_runtime.engine.seams import Wrapped
from reference_runtime.engine.strategy import CapturedGraphs
from reference_runtime.policy import Dispatcher
from tests.broken_engines import mutant, with_planner, with_seams


class _CapturesWithoutAdapters(CapturedGraphs):
    """Every key's graphs are recorded as the no-adapter key's: no LoRA op inside."""

    def capture_key(self, mode, key, graphs):
        return super().capture_key(mode, replace(key, has_lora=False, num_active_loras=0), graphs)


GraphsWithoutAdapters = mutant(
    "graphs-without-adapters", "GraphsWithoutAdapters", with_seams(strategy=_CapturesWithoutAdapters),
    "Graphs captured without the adapter op, then replayed for batches with adapters active (eager steps "
    "apply them).")


class _OneAdapterCase(Dispatcher):
    """Dispatches every batch with adapters to the one-adapter key, whatever its count."""

    def dispatch(self, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0, **kw):
        return super().dispatch(num_real_tokens, num_real_rows, uniform, min(num_active_loras, 1), **kw)


KeyIgnoresAdapterCount = mutant(
    "key-ignores-adapter-count", "KeyIgnoresAdapterCount", with_seams(dispatcher=_OneAdapterCase),
    "The graph key ignores how many adapters the batch has active (its outputs are right: the key is not "
    "what the declared policy says).")


class _PaddingRunsAdapterOne(Wrapped):
    """Padded token rows carry adapter 1 (the real rows are right)."""

    def plan(self, requests, captured):
        plan = self.inner.plan(requests, captured)
        plan.lora_ids[plan.num_real_tokens:] = [1] * (plan.num_padded_tokens - plan.num_real_tokens)
        return plan


PaddedRowsRunAnAdapter = mutant(
    "padded-rows-run-an-adapter", "PaddedRowsRunAnAdapter", with_planner(_PaddingRunsAdapterOne),
    "Padded rows carry an adapter (adapter 1) in the step's static inputs.")


class _AdaptersReversed(Wrapped):
    """Each real token row gets the adapter of the row at the mirror position: the adapters go to
    other requests, in graph and eager steps alike (so they agree with each other)."""

    def plan(self, requests, captured):
        return self._reversed(self.inner.plan(requests, captured))

    def plan_eager(self, requests, num_padded_tokens):
        return self._reversed(self.inner.plan_eager(requests, num_padded_tokens))

    @staticmethod
    def _reversed(plan):
        real = plan.num_real_tokens
        plan.lora_ids[:real] = [plan.lora_ids[real - 1 - t] for t in range(real)]
        return plan


AdapterOnTheWrongRequest = mutant(
    "adapter-on-the-wrong-request", "AdapterOnTheWrongRequest", with_planner(_AdaptersReversed),
    "Each request runs the adapter of another (its mirror row), in graph and eager steps alike.")

class _GraphSlotsMissTheLastAdapter(Wrapped):
    """A planned step (graph steps; eager_step plans apart) with adapter-free rows beside k adapters runs
    the adapter op over k slots, one of them the no-adapter id's: the rows of the highest adapter get
    none, while eager steps apply every one.
    The class vLLM 0.25's V1 runner showed with specialize_active_lora (reports/h100/vllm-v1/README.md)."""

    def plan(self, requests, captured):
        plan = self.inner.plan(requests, captured)
        real = plan.lora_ids[:plan.num_real_tokens]
        adapters = {a for a in real if a}
        if adapters and len(adapters) < len(real) and 0 in real:
            last = max(adapters)
            plan.lora_ids[:plan.num_real_tokens] = [0 if a == last else a for a in real]
        return plan


GraphSlotsMissTheLastAdapter = mutant(
    "graph-slots-miss-the-last-adapter", "GraphSlotsMissTheLastAdapter", with_planner(_GraphSlotsMissTheLastAdapter),
    "Graph steps mixing adapter-free rows with adapters leave the highest adapter's rows without it; eager "
    "steps are right.")


class _OneGraphForEveryAdapterCount(CapturedGraphs):
    """Captures one graph with the adapter op per size and reuses it for every adapter count (its
    outputs are right: the op reads each row's adapter), so the keys outnumber the graphs."""

    def capture_key(self, mode, key, graphs):
        shared = getattr(self, "_shared", None)
        if shared is None:
            shared = self._shared = {}
        kind = (mode, key.num_padded_tokens, key.num_padded_rows, key.uniform, key.has_lora)
        if kind not in shared:
            shared[kind] = super().capture_key(mode, key, graphs)
        return shared[kind]


GraphSharedAcrossAdapterCounts = mutant(
    "graph-shared-across-adapter-counts", "GraphSharedAcrossAdapterCounts",
    with_seams(strategy=_OneGraphForEveryAdapterCount),
    "One graph per size serves every adapter count: fewer graphs than the keys the policy names.")

_DECLARES_LORA_DTYPES = replace(ReferenceRuntime.capabilities,
                                declarations={"lora_dtypes": ("bfloat16", "float16")})
LoraDtypesDeclaredNotHeld = type("LoraDtypesDeclaredNotHeld", (ReferenceRuntime,), {
    "name": "lora-dtypes-declared-not-held", "capabilities": _DECLARES_LORA_DTYPES,
    "__doc__": "Declares it runs adapters in float16 and bfloat16 only, yet builds a LoRA engine in float32 "
               "(the engine a real one would fail inside its kernels at capture)."})

MUTANTS = [LoraDtypesDeclaredNotHeld, GraphSharedAcrossAdapterCounts, GraphsWithoutAdapters, KeyIgnoresAdapterCount,
           PaddedRowsRunAnAdapter, AdapterOnTheWrongRequest, GraphSlotsMissTheLastAdapter]
