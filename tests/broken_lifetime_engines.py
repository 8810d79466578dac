"""Broken engines whose bug is a lifetime: memory a graph uses, freed while the graph lives; the KV
and positions of draft tokens, kept after the drafts were rejected. Each is the reference engine
with one part replaced through its public seams (tests/broken_engines.py says how), rebuilt from a
bug an engine shipped in 2025-26 (issue 53). tests/test_broken_lifetime_engines.py holds their
catch table.
"""
from __future__ import annotations

import weakref

import torch

from reference_runtime.engine.attention import BACKENDS
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

MUTANTS = [WorkspaceFreedUnderGraphs]
for _mutant in MUTANTS:
    _mutant.__module__ = __name__  # where a data-parallel rank finds it to unpickle
