"""vLLM 0.25's graph policy for its V1 model runner (vllm/v1/worker/gpu_model_runner.py), answered
by vLLM's own code: the mode resolved with `use_v2_model_runner=False` (GPUModelRunner.
_check_and_update_cudagraph_mode), the keys of a `CudagraphDispatcher` made on the same VllmConfig
(`initialize_cudagraph_keys`), and its `dispatch`. No engine is needed: the dispatcher's table
depends on the config only. The V2 answers stay in policy.py.
"""
from __future__ import annotations

import dataclasses
import os

from harness import protocol as p

from cudagraph_vllm_engine import settings
from cudagraph_vllm_engine.policy import VERSION, VllmPolicy, resolve

from .lora import lora_args

# vLLM 0.25 reads this when a VllmConfig asks which runner to use (envs.py, VllmConfig.use_v2_model_runner).
RUNNER_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"


def v1_graph_keys(dispatcher) -> dict[str, tuple]:
    """Each runtime mode's keys as (num_tokens, num_reqs, uniform, num_active_loras), sorted."""
    return {mode.name: tuple(sorted((k.num_tokens, k.num_reqs or 0, k.uniform, k.num_active_loras) for k in keys))
            for mode, keys in dispatcher.cudagraph_keys.items() if keys}


def as_dispatch(mode, desc) -> p.Dispatch:
    """A V1 (CUDAGraphMode, BatchDescriptor) as the protocol's Dispatch."""
    return p.Dispatch(mode.name, p.Descriptor(desc.num_tokens, desc.num_reqs, desc.uniform, desc.has_lora,
                                              desc.num_active_loras))


def v1_args(model_dir, config: p.PolicyConfig, adapters: tuple[str, ...] = (), **kwargs):
    """EngineArgs for the V1 runner: ngram drafts (no draft model), LoRA enabled where asked (with
    the adapter folders an engine loads, lora.py)."""
    base = dataclasses.replace(config, num_speculative_tokens=0, max_loras=0)
    args = settings.engine_args(model_dir, base, **kwargs)
    if config.num_speculative_tokens:
        args.speculative_config = {"method": "ngram", "num_speculative_tokens": config.num_speculative_tokens,
                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    for name, value in lora_args(config, adapters).items():
        setattr(args, name, value)
    return args


class VllmV1Policy(VllmPolicy):
    QUESTION_RULES = f"vllm-{VERSION}/v1"

    def _args(self, config: p.PolicyConfig, **kwargs):
        return v1_args(self.model_dir, config, **kwargs)

    def _check_runner(self, vllm_config) -> None:
        if vllm_config.use_v2_model_runner:
            raise RuntimeError(f"vLLM chose its V2 runner for a V1 policy question ({RUNNER_SWITCH}="
                               f"{os.environ.get(RUNNER_SWITCH)!r}); the V1 runtime sets it to 0")

    def _resolve(self, vllm_config, support, backend_name: str, decode_query_len: int):
        """The mode GPUModelRunner._check_and_update_cudagraph_mode resolves."""
        return resolve(vllm_config, support, backend_name, decode_query_len, use_v2_model_runner=False)

    def _dispatcher(self, vllm_config, mode, decode_query_len: int):
        """vLLM's CudagraphDispatcher with the keys the V1 runner initialises after resolving the mode."""
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        dispatcher = CudagraphDispatcher(vllm_config)
        dispatcher.initialize_cudagraph_keys(mode, decode_query_len)
        return dispatcher

    def dispatch(self, config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
                 num_active_loras: int = 0) -> p.Dispatch:
        """CudagraphDispatcher.dispatch as the V1 runner calls it (_determine_batch_execution_and_padding):
        uniform_decode means every request brings q tokens; V1 does not take a request count."""
        dispatcher = self.answer(config).dispatcher
        mode, desc = dispatcher.dispatch(num_tokens=num_real_tokens, uniform_decode=uniform,  # vLLM's own name
                                         has_lora=num_active_loras > 0, num_active_loras=num_active_loras)
        return as_dispatch(mode, desc)
