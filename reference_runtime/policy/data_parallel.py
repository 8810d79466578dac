"""Data-parallel consensus: every rank runs the same mode at the same padded size (SPEC 4).

Each rank dispatches its own batch; the ranks agree on the lowest runtime mode among them.
Under a graph mode every rank pads to the largest padded size and re-dispatches allowing
only the agreed mode, so no rank ever moves to a higher mode. Under NONE there is no padding
across ranks: each runs eagerly at the size its own dispatch chose (vLLM's dp_utils).

`agree` and `redispatch` are the two halves an engine rank runs around its all-reduce
(engine/data_parallel.py); `dp_dispatch` is the whole rule over every rank at once.
"""
from __future__ import annotations

from .dispatch import BatchDescriptor, Dispatcher
from .modes import RUNTIME_MODE_RANK, CUDAGraphMode


def agree(dispatched: list[tuple[CUDAGraphMode, int]]) -> tuple[CUDAGraphMode, int | None]:
    """From each rank's (mode, dispatched size): the lowest mode and, under a graph mode, the
    largest size (None under NONE: no padding across ranks)."""
    mode = min((m for m, _ in dispatched), key=RUNTIME_MODE_RANK.__getitem__)
    return mode, None if mode is CUDAGraphMode.NONE else max(size for _, size in dispatched)


def redispatch(dispatcher: Dispatcher, agreed: CUDAGraphMode, agreed_size: int | None, own_size: int,
               uniform: bool) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """What one rank runs once the ranks agreed; own_size is what its own dispatch chose."""
    if agreed is CUDAGraphMode.NONE:
        # vLLM pads across ranks only under a graph mode; the rank runs eagerly at the size its
        # own dispatch chose (padded if it had a graph there).
        return dispatcher.dispatch(own_size, None, False, allowed_modes=frozenset({agreed}))
    # The rank keeps its own uniformity; only the token count (and so num_reqs) changes.
    uniform = uniform and agreed_size % dispatcher.config.query_len == 0
    return dispatcher.dispatch(agreed_size, None, uniform, allowed_modes=frozenset({agreed}))


def dp_dispatch(
    dispatcher: Dispatcher, ranks: list[tuple[int, int | None, bool]]
) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
    """ranks: (num_tokens, num_reqs, uniform) for each rank. Returns what each rank runs."""
    if not ranks:
        raise ValueError("data-parallel dispatch needs at least one rank")
    local = [dispatcher.dispatch(n, r, u) for n, r, u in ranks]
    if len(ranks) == 1:
        return local
    agreed, size = agree([(mode, key.num_tokens) for mode, key in local])
    return [redispatch(dispatcher, agreed, size, key.num_tokens, u) for (_, key), (_, _, u) in zip(local, ranks)]
