"""Data-parallel consensus: every rank runs the same mode at the same padded size (SPEC 4).

Each rank dispatches its own batch; the ranks agree on the lowest runtime mode among them.
Under NONE there is no padding across ranks. Otherwise every rank re-dispatches at one size.
The runners differ in what they share and re-dispatch (docs/runners.md):

- V1 (vllm/v1/worker/dp_utils.py): ranks share their padded sizes; under a graph mode each
  re-dispatches at the largest, allowing only the agreed mode, keeping its own uniformity;
  agreed on eager, each runs at the size its own dispatch chose (padded if it had a graph there).
- V2 (vllm/v1/worker/gpu/dp_utils.py, sync_cudagraph_and_dp_padding): ranks share their
  unpadded sizes and uniform token counts; under a graph mode each re-dispatches at the largest
  unpadded size, uniform only if every rank is; agreed on eager, each runs at its own unpadded size.
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
    q = dispatcher.config.query_len
    if dispatcher.config.runner == "v2":
        if agreed is CUDAGraphMode.NONE:
            return [dispatcher.dispatch(n, r, u, allowed_modes=frozenset({agreed})) for n, r, u in ranks]
        size = max(n for n, _, _ in ranks)
        all_uniform = all(u for _, _, u in ranks)
        return [dispatcher.lookup(size, r, all_uniform) for _, r, _ in ranks]
    if agreed is CUDAGraphMode.NONE:
        # vLLM pads across ranks only under a graph mode; each rank re-dispatches eagerly at the size
        # its own dispatch chose (padded if it had a graph there).
        return [dispatcher.dispatch(key.num_tokens, None, False, allowed_modes=frozenset({agreed})) for _, key in local]
    padded = max(key.num_tokens for _, key in local)
    # The rank keeps its own uniformity; only the token count (and so num_reqs) changes.
    return [
        dispatcher.dispatch(padded, None, u and padded % q == 0, allowed_modes=frozenset({agreed}))
        for _, _, u in ranks
    ]
