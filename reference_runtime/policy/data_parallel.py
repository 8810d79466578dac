"""Data-parallel consensus: every rank runs the same mode at the same padded size (spec section 4.6).

Each rank dispatches its own batch and shares what it has (`share`); the ranks agree on the lowest
runtime mode among them; under NONE there is no padding across ranks; otherwise every rank
re-dispatches at one size (`runs`). The runners differ in what they share and re-dispatch
(docs/runners.md):

- V1 (vllm/v1/worker/dp_utils.py): under a graph mode each rank re-dispatches at the largest
  padded size, allowing only the agreed mode, keeping its own uniformity; agreed on eager, each
  runs at the size its own dispatch chose (padded if it had a graph there).
- V2 (vllm/v1/worker/gpu/dp_utils.py, sync_cudagraph_and_dp_padding): under a graph mode each
  re-dispatches at the largest unpadded size, uniform only if every rank is; agreed on eager,
  each runs at its own unpadded size.

An engine rank calls `own_share` (`share`, an idle rank as one dummy decode request) and `runs`
around its all-reduce (engine/data_parallel.py); `dp_dispatch` is the whole rule over every rank
at once.
"""
from __future__ import annotations

from typing import NamedTuple

from .dispatch import BatchDescriptor, Dispatcher
from .modes import RUNTIME_MODE_RANK, CUDAGraphMode


class Shared(NamedTuple):
    """What one rank puts in the all-reduce."""

    num_real_tokens: int  # unpadded
    size: int  # what its own dispatch chose
    mode: CUDAGraphMode  # what its own dispatch chose
    uniform: bool


def share(dispatcher: Dispatcher, num_real_tokens: int, num_real_rows: int | None, uniform: bool,
          captured: bool = True) -> Shared:
    """A rank's own dispatch, as it enters the consensus (nothing captured yet: eager, unpadded)."""
    if captured:
        mode, key = dispatcher.dispatch(num_real_tokens, num_real_rows, uniform)
    else:
        mode, key = CUDAGraphMode.NONE, BatchDescriptor(num_real_tokens)
    return Shared(num_real_tokens, key.num_padded_tokens, mode, uniform)


def own_share(dispatcher: Dispatcher, num_real_tokens: int, num_real_rows: int, uniform: bool,
              captured: bool) -> tuple[Shared, int]:
    """(what this rank shares, its request count); an idle rank runs a dummy decode step of one
    request, padding rows only."""
    if num_real_tokens == 0:
        num_real_tokens, num_real_rows, uniform = dispatcher.config.query_len, 1, True
    return share(dispatcher, num_real_tokens, num_real_rows, uniform, captured), num_real_rows


def lowest(ranks: list[Shared]) -> CUDAGraphMode:
    """The mode the ranks agree on: the lowest any of them dispatched."""
    return min((r.mode for r in ranks), key=RUNTIME_MODE_RANK.__getitem__)


def graph_size(dispatcher: Dispatcher, ranks: list[Shared]) -> int:
    """The size every rank re-dispatches at under a graph mode: V2 the largest unpadded size, V1
    the largest padded one."""
    unpadded = dispatcher.config.rules.dp_pads_to_unpadded_max
    return max(r.num_real_tokens if unpadded else r.size for r in ranks)


def graph_uniform(dispatcher: Dispatcher, own: Shared, ranks: list[Shared], size: int) -> bool:
    """Whether a rank re-dispatches as uniform: V2 only if every rank is; V1 keeps its own
    uniformity where the size still divides into whole requests."""
    if dispatcher.config.rules.dp_uniform_only_if_all:
        return all(r.uniform for r in ranks)
    return own.uniform and size % dispatcher.config.query_len == 0


def runs(dispatcher: Dispatcher, ranks: list[Shared], mine: int, num_real_rows: int | None
         ) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """What rank `mine` runs once every rank has shared."""
    own, agreed, keeps_counts = ranks[mine], lowest(ranks), dispatcher.config.rules.dp_keeps_counts
    only = frozenset({agreed})
    if agreed is CUDAGraphMode.NONE:  # no padding across ranks: V2 unpadded, V1 at its own dispatch's size
        if keeps_counts:
            return dispatcher.lookup(own.num_real_tokens, num_real_rows, own.uniform, allowed_modes=only)
        return dispatcher.dispatch(own.size, None, False, allowed_modes=only)
    size = graph_size(dispatcher, ranks)
    uniform = graph_uniform(dispatcher, own, ranks, size)
    if keeps_counts:
        return dispatcher.lookup(size, num_real_rows, uniform)
    return dispatcher.dispatch(size, None, uniform, allowed_modes=only)


def dp_dispatch(
    dispatcher: Dispatcher, ranks: list[tuple[int, int | None, bool]]
) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
    """ranks: (num_real_tokens, num_real_rows, uniform) for each rank. Returns what each rank runs."""
    if not ranks:
        raise ValueError("data-parallel dispatch needs at least one rank")
    if len(ranks) == 1:  # no all-reduce at data-parallel size 1
        return [dispatcher.dispatch(n, r, u) for n, r, u in ranks]
    shared = [share(dispatcher, n, r, u) for n, r, u in ranks]
    return [runs(dispatcher, shared, i, r) for i, (_, r, _) in enumerate(ranks)]
