"""One rank's side of data-parallel consensus at step time, as vLLM's runners do it.

Before every step each rank dispatches its own batch, all-reduces (num_real_tokens, dispatched size,
mode, uniform) with the other ranks, and re-dispatches to what they agreed (policy/data_parallel.py:
the lowest mode; under a graph mode one size, by the policy's runner). A rank with no requests still takes part and
runs a dummy batch of one decode request's worth of padding rows (vLLM's dummy run), so the
ranks' collectives always pair up.

torch.distributed is initialised before the engine is built (by the harness, as a server's
launcher would); the table travels on the engine's device: NCCL on a GPU, gloo on the CPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..policy import BatchDescriptor, CUDAGraphMode, Dispatcher  # noqa: F401 (BatchDescriptor: the answer's type)
from ..policy.data_parallel import Shared, own_share, runs
from ..policy.modes import RUNTIME_MODE_RANK, RUNTIME_MODES  # RUNTIME_MODES[rank] is the mode of that rank


class DataParallel:
    def __init__(self, rank: int, world: int, device: torch.device):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(f"data_parallel=({rank}, {world}) needs torch.distributed initialised before the "
                             "engine is built (init_process_group with one process per rank)")
        if (dist.get_rank(), dist.get_world_size()) != (rank, world):
            raise ValueError(f"data_parallel=({rank}, {world}) but torch.distributed has rank {dist.get_rank()} "
                             f"of {dist.get_world_size()}")
        self.rank, self.world, self.device = rank, world, device

    def dispatch(self, dispatcher: Dispatcher, num_real_tokens: int, num_real_rows: int, uniform: bool,
                 captured: bool) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """What this rank runs: its own dispatch, the all-reduce, the re-dispatch."""
        mine, num_real_rows = own_share(dispatcher, num_real_tokens, num_real_rows, uniform, captured)
        return runs(dispatcher, self.exchange(mine), self.rank, num_real_rows)

    def exchange(self, mine: Shared) -> list[Shared]:
        """Every rank's share: one all-reduce (a sum) of a [4, world] table in which each rank
        fills its own column."""
        table = torch.zeros(4, self.world, dtype=torch.int32)
        table[:, self.rank] = torch.tensor([mine.num_real_tokens, mine.size, RUNTIME_MODE_RANK[mine.mode],
                                            int(mine.uniform)], dtype=torch.int32)
        table = table.to(self.device)
        dist.all_reduce(table)
        return [Shared(t, s, RUNTIME_MODES[m], bool(u)) for t, s, m, u in zip(*table.cpu().tolist())]
