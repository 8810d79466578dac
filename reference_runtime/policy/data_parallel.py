"""Data-parallel consensus: every rank runs the same mode at the same padded size (SPEC 4).

Each rank dispatches its own batch; the ranks agree on the lowest runtime mode among them.
Under a graph mode every rank pads to the largest padded size and re-dispatches allowing
only the agreed mode, so no rank ever moves to a higher mode. Under NONE there is no padding
across ranks: each runs eagerly at the size its own dispatch chose (vLLM's dp_utils).
"""
from __future__ import annotations

from .dispatch import BatchDescriptor, Dispatcher
from .modes import RUNTIME_MODE_RANK, CUDAGraphMode


def dp_dispatch(
    dispatcher: Dispatcher, ranks: list[tuple[int, int | None, bool]]
) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
    """ranks: (num_tokens, num_reqs, uniform) for each rank. Returns what each rank runs."""
    if not ranks:
        raise ValueError("data-parallel dispatch needs at least one rank")
    local = [dispatcher.dispatch(n, r, u) for n, r, u in ranks]
    if len(ranks) == 1:
        return local
    agreed = min((mode for mode, _ in local), key=RUNTIME_MODE_RANK.__getitem__)
    if agreed is CUDAGraphMode.NONE:
        # vLLM pads across ranks only under a graph mode; each rank re-dispatches eagerly at the size
        # its own dispatch chose (padded if it had a graph there).
        return [dispatcher.dispatch(key.num_tokens, None, False, allowed_modes=frozenset({agreed})) for _, key in local]
    padded = max(key.num_tokens for _, key in local)
    # The rank keeps its own uniformity; only the token count (and so num_reqs) changes.
    return [
        dispatcher.dispatch(padded, None, u and padded % dispatcher.config.query_len == 0,
                            allowed_modes=frozenset({agreed}))
        for _, _, u in ranks
    ]
