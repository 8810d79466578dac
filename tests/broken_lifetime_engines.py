"""Broken engines whose bug is a lifetime: memory a graph uses, freed while the graph lives; the KV
and positions of draft tokens, kept after the drafts were rejected. Each is the reference engine
with one part replaced through its public seams (tests/broken_engines.py says how), rebuilt from a
bug an engine shipped in 2025-26 (issue 53). tests/test_broken_lifetime_engines.py holds their
catch table.
"""
from __future__ import annotations

import weakref
from dataclasses import replace

import torch

from reference_runtime.engine.attention import BACKENDS
from reference_runtime.engine.seams import Wrapped
from reference_runtime.engine.plan import Planner
from tests.broken_engines import mutant, with_seams

# -- a graph that uses memory freed after its capture ---------------------------------------------
_WORKSPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # KV cache -> the engine's workspace


class _GrowingWorkspace:
    """TensorRT-LLM's shared attention workspace: one buffer for every layer of an engine, sized on
    the host for the step (its query rows, or a row per position of the longest context, whichever
    is more) and reallocated whenever a step needs more. Every graph captured before a reallocation
    keeps the old buffer's address; a step with a longer context than capture's dummy batches (an
    eager or PIECEWISE step, whose attention runs eagerly) frees it."""

    def __call__(self, layer, q, k, v, meta):
        need = max(q.numel(), meta.max_seq_len * q[0].numel())
        workspace = _WORKSPACES.get(self.cache)
        if workspace is None or workspace.numel() < need:
            workspace = _WORKSPACES[self.cache] = torch.zeros(need, dtype=q.dtype, device=q.device)
        staged = workspace[: q.numel()].view_as(q)
        staged.copy_(q)
        return super().__call__(layer, staged, k, v, meta)


WORKSPACE_BACKENDS = {name: type(f"Workspace{cls.__name__}", (_GrowingWorkspace, cls), {})
                      for name, cls in BACKENDS.items()}

WorkspaceFreedUnderGraphs = mutant("workspace-freed-under-graphs", "WorkspaceFreedUnderGraphs",
                                   with_seams(backends=WORKSPACE_BACKENDS), _GrowingWorkspace.__doc__)



# -- drafts taken as accepted -------------------------------------------------------------------
class _AcceptsEveryDraftPlanner(Planner):
    """Keeps its own count of each request's tokens, advanced by every token a step brought, as if
    every draft were accepted, and trusts it over a smaller context_len (unless the step is the
    last one run again): after a rejection the next tokens go past the rejected drafts, whose KV
    stays in the context, on every path (eager too)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last: dict[int, tuple[int, int]] = {}  # request -> (context_len, end) of its last step

    def counted(self, request):
        start, end = self.last.get(request.request_id, (request.context_len, request.context_len))
        if start < request.context_len < end or request.context_len < start:
            return replace(request, context_len=end)
        return request

    def plan(self, requests, captured):
        requests = [self.counted(r) for r in requests]
        self.last.update((r.request_id, (r.context_len, r.context_len + len(r.token_ids))) for r in requests)
        return super().plan(requests, captured)

    def plan_eager(self, requests, num_padded_tokens):
        return super().plan_eager([self.counted(r) for r in requests], num_padded_tokens)

    def release(self, request_id):
        self.last.pop(request_id, None)
        super().release(request_id)


class _PersistentBatchAcceptsEveryDraftPlanner(Wrapped):
    """A persistent batch that moves each kept row to the end of its last verify step, as if every
    draft were accepted, where the request's context_len says less: on the graph path (the only one
    that keeps rows), the step after a rejection writes past the rejected drafts and reads them."""

    def plan(self, requests, captured):
        inner = self.inner
        kept, q = inner.persistent, inner.q
        starts = {} if kept is None else {id(owner): kept.positions[row * q] for row, owner in enumerate(kept.owners)}
        plan = inner.plan(requests, captured)
        if kept is None or plan is not kept or q == 1:  # only the kept batch, updated in place, is edited
            return plan
        for row, request in enumerate(requests):
            table = inner.allocator.tables[request.request_id]
            last_start = starts.get(id(table))
            if last_start is None or not last_start < request.context_len < last_start + q:
                continue
            start = last_start + q  # where the row would be had every draft been accepted
            if len(inner.allocator.ensure(request.request_id, start + q)) != len(plan.block_tables[row]):
                plan.block_tables[row], plan.table_revisions[row] = list(table), plan.revision
            for j in range(q):
                plan.positions[row * q + j] = start + j
                plan.slot_mapping[row * q + j] = inner.allocator.slot(request.request_id, start + j)
            plan.seq_lens[row] = start + q
        return plan


AcceptsEveryDraft = mutant("accepts-every-draft", "AcceptsEveryDraft", with_seams(planner=_AcceptsEveryDraftPlanner))
PersistentBatchAcceptsEveryDraft = mutant("persistent-batch-accepts-every-draft", "PersistentBatchAcceptsEveryDraft",
                                          with_seams(planner=_PersistentBatchAcceptsEveryDraftPlanner.around(Planner)),
                                          _PersistentBatchAcceptsEveryDraftPlanner.__doc__)

MUTANTS = [WorkspaceFreedUnderGraphs, AcceptsEveryDraft, PersistentBatchAcceptsEveryDraft]
for _mutant in MUTANTS:
    _mutant.__module__ = __name__  # where a data-parallel rank finds it to unpickle
