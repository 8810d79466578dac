"""The `lmdeploy-engine` runtime: LMDeploy 0.18's PyTorch engine (its model agent, cache engine and
CUDA-graph runner, one GPU, in this process) behind the harness protocol.

- Policy (capture_sizes, padded_size, dispatch, resolve_mode): LMDeploy's own rules for the
  model it runs here (policy.py), checked against LMDeploy's code and against every live engine.
- Execution (build): a real engine on the harness's checkpoint (engine.py), its decode graphs
  captured by LMDeploy's warm-up, each step an exact batch this runtime schedules, the path and
  padded size of every step read from LMDeploy's graph runner as it ran.

Listing runtimes stays cheap without LMDeploy (CI): it is imported when the runtime is made.
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

from harness import protocol as p
from harness.kit.checks import check_one_gpu_config, require_cuda
from harness.kit.delegate import PolicyDelegate
from harness.vocabulary import FDO

from . import LMDEPLOY_VERSION, __version__, settings
from .model_dir import MIN_HEAD_DIM, head_dim
from .policy import ATTENTION, SUPPORT, LmdeployPolicy, resolve

KNOWN_FAILURES = Path(__file__).with_name("known_failures.toml")
NOTES = ("LMDeploy {lmdeploy} PyTorch engine, in-process (UniExecutor, BaseModelAgent, CUDAGraphRunner), its Triton "
         "attention, {dtype} (LMDeploy has no float32: 'auto' makes a float32 checkpoint float16); this runtime is "
         "the scheduler: each step is a ModelInputs of the harness's batch, decoding when every request brings one "
         "token; FULL graphs for decode steps only (LMDeploy's rule), padded by batch size; logits: the model's "
         "get_logits on every real token's hidden state; eager_step: LMDeploy's fake-capture runner of the padded "
         "size (the graph's buffers and forward, no graph); before capture() the graph path is declined (LMDeploy "
         "never serves before its warm-up); one token a request; padded-row fills: zeros or random ids and positions")


class LmdeployPolicyRuntime(PolicyDelegate):
    """LMDeploy's policy alone (policy.py), on any machine: `--runtime
    cudagraph_lmdeploy_engine.runtime:LmdeployPolicyRuntime` runs the policy suites without LMDeploy
    or a GPU (tests/test_lmdeploy_policy.py does, in CI)."""

    name = "lmdeploy-policy"
    version = f"{__version__} (LMDeploy {LMDEPLOY_VERSION}'s rules, policy.py)"
    capabilities = p.Capabilities(capture_sizes=True, dispatch=True, mode_resolution=True,
                                  attention_backends=((ATTENTION, SUPPORT),),
                                  notes="LMDeploy's CUDA-graph policy for LlamaForCausalLM, restated from its code")
    policy = LmdeployPolicy()


class LmdeployEngineRuntime(LmdeployPolicyRuntime):
    known_failures = str(KNOWN_FAILURES)
    name = "lmdeploy-engine"

    def __init__(self):
        settings.apply_environment()
        require_cuda("lmdeploy-engine", "LMDeploy's PyTorch engine")
        import lmdeploy  # fails here, with the reason shown by the harness, when LMDeploy is not installed

        if lmdeploy.__version__ != LMDEPLOY_VERSION:
            raise p.RuntimeUnavailable(f"lmdeploy-engine reads and drives LMDeploy {LMDEPLOY_VERSION}'s code; "
                               f"found LMDeploy {lmdeploy.__version__} (bash scripts/lmdeploy/install.sh)")
        self.version = f"{__version__} (LMDeploy {lmdeploy.__version__}, PyTorch engine)"
        self.capabilities = p.Capabilities(
            capture_sizes=True, dispatch=True, mode_resolution=True,
            execution=True, graph_backends=("cuda",), attention_backends=((ATTENTION, SUPPORT),),
            padding_fills=("zeros", "random"), loads_checkpoint=True, kv_inspection=True, input_inspection=True,
            outputs_alias_graph_buffers=False, precision=settings.DTYPE,
            # fill_buffers_cudagraph (lmdeploy/pytorch/models/utils/cudagraph.py) draws every padded
            # row's token id anew each step: "Random padding balances MoE routing".
            declarations={"random_padding_ids": True}, rules=f"lmdeploy-{LMDEPLOY_VERSION}",
            notes=NOTES.format(lmdeploy=lmdeploy.__version__, dtype=settings.DTYPE),
        )
        self.engines_built = 0

    # -- execution --------------------------------------------------------------------------
    def build(self, config: p.EngineConfig):
        from .engine import LmdeployEngine

        if config.checkpoint is not None and head_dim(config.checkpoint) < MIN_HEAD_DIM:
            raise p.UnsupportedCheckpoint(
                f"attention heads {head_dim(config.checkpoint)} wide: LMDeploy's Triton attention needs them "
                f"{MIN_HEAD_DIM} wide or more (tl.dot's K >= 16); run with --preset small")
        self._check_config(config)
        self.policy.sizes(replace(config.policy, mode=FDO))  # ValueError, before any build, for what LMDeploy rejects
        resolved, downgrades = resolve(config.policy.mode)
        self.engines_built += 1
        policy = config.policy
        label = (f"engine #{self.engines_built} {policy.mode}->{resolved} {settings.DTYPE} seqs={policy.max_num_seqs} "
                 f"tokens={policy.max_num_batched_tokens}")
        engine = LmdeployEngine(config, resolved, label)
        engine.resolution = p.Resolution(policy.mode, resolved, downgrades)
        settings.event(f"built {label}: {engine.describe()}")
        for message in downgrades:
            warnings.warn(f"LMDeploy: {message}", stacklevel=2)
        return engine

    def _check_config(self, config: p.EngineConfig) -> None:
        check_one_gpu_config(config, "lmdeploy-engine", ATTENTION, f"LMDeploy's Triton attention ({ATTENTION!r})")
