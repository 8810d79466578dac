"""One-off probe (issue 52): the oracle's model of vLLM 0.25's V2 graph search under a dynamic
speculative schedule, asked beside vLLM 0.25.0's own CudaGraphManager on the CPU.

Beyond vLLM's own tests (every integer a capture size, where one search and two agree), this asks
default-grid sizes, where 0.25's one search across modes differs from 0.33's: every uniform batch
of every q, and mixed batches, up to the largest size, for several schedules. Run in the venv of
scripts/setup_vllm_versions.sh, with vLLM 0.25 and this repository on the path:

    PYTHONPATH=DIR/vllm-0.25:. DIR/venv/bin/python reports/peer-tests/vllm_025_dynamic_sd_probe.py

Prints one line per config (questions asked, disagreements) and exits 1 on any disagreement.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from unittest.mock import MagicMock

import torch
from vllm.config import CompilationConfig, CUDAGraphMode, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.platforms import interface
from vllm.v1.worker.gpu import cudagraph_utils

from harness.expectations import oracle
from harness.protocol import PolicyConfig

interface.Platform.get_global_graph_pool = classmethod(lambda cls: object())  # no device here
cudagraph_utils.get_pp_group = lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)

# (max_num_seqs, speculative tokens, schedule of (first, last, tokens), capture sizes or None: the grid)
CONFIGS = [
    (64, 4, [(1, 8, 4), (9, 32, 2), (33, 64, 1)], None),
    (128, 7, [(1, 31, 4), (32, 128, 3)], None),
    (256, 3, [(1, 16, 3), (17, 256, 0)], None),
    (48, 5, [(1, 4, 5), (5, 48, 2)], [1, 3, 7, 16, 40, 100, 240]),
    (512, 7, [(q, q, q - 1) for q in range(1, 9)], None),
]


def manager(seqs: int, k: int, schedule, sizes: list[int]):
    compilation = CompilationConfig(cudagraph_mode="FULL_AND_PIECEWISE", cudagraph_capture_sizes=sizes)
    compilation.max_cudagraph_capture_size = max(sizes)
    compilation.post_init_cudagraph_sizes()
    config = MagicMock(spec=VllmConfig)
    config.compilation_config = compilation
    config.scheduler_config = SchedulerConfig.default_factory(max_num_seqs=seqs)
    config.parallel_config = ParallelConfig()
    config.num_speculative_tokens = k
    speculative = MagicMock()
    speculative.uses_dynamic_speculative_decoding.return_value = True
    speculative.num_speculative_tokens_per_batch_size = schedule
    config.speculative_config = speculative
    found = cudagraph_utils.CudaGraphManager(vllm_config=config, device=torch.device("cpu"),
                                             cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, decode_query_len=k + 1)
    found._graphs_captured = True
    return found


def main() -> int:
    wrong = 0
    for seqs, k, schedule, given in CONFIGS:
        q = k + 1
        policy = PolicyConfig(max_num_seqs=seqs, num_speculative_tokens=k, mode="FULL_AND_PIECEWISE", runner="v2",
                              vllm_version="0.25", max_num_batched_tokens=max(8192, q * seqs),
                              capture_sizes=None if given is None else tuple(given))
        sizes = oracle.capture_sizes(policy)
        lens = oracle.speculative_decode_query_lens(schedule)
        vllm = manager(seqs, k, schedule, sizes)
        asked, disagree = 0, []
        batches = [(reqs * ql, reqs, ql) for ql in range(1, q + 1) for reqs in range(1, seqs + 1)
                   if reqs * ql <= max(sizes)]
        batches += [(tokens, min(tokens, seqs) - 1 or 1, None) for tokens in range(2, max(sizes) + 1)]
        for tokens, reqs, ql in batches:
            desc = vllm.dispatch(num_reqs=reqs, num_tokens=tokens, uniform_token_count=ql, num_active_loras=0)
            theirs = (desc.cg_mode.name, desc.num_tokens, desc.num_reqs if desc.cg_mode.name == "FULL" else None)
            found = oracle.dispatch(policy, tokens, reqs, ql is not None, decode_query_lens=lens)
            ours = (found.runtime_mode, found.descriptor.num_tokens,
                    found.descriptor.num_reqs if found.runtime_mode == "FULL" else None)
            if theirs[0] == "NONE":
                theirs = ("NONE", tokens, None)
            if ours[0] == "NONE":
                ours = ("NONE", tokens, None)
            asked += 1
            if theirs != ours:
                disagree.append((tokens, reqs, ql, theirs, ours))
        wrong += len(disagree)
        print(f"max_num_seqs={seqs} k={k} schedule={schedule} sizes={'grid' if given is None else given}: "
              f"{len(sizes)} sizes, decode q {list(lens)}, {asked} batches, {len(disagree)} disagree"
              + (f"; first: {disagree[0]}" if disagree else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
