"""vLLM 0.25's graph policy for its V1 model runner (vllm/v1/worker/gpu_model_runner.py), answered
by vLLM's own code: the mode resolved with `use_v2_model_runner=False` (GPUModelRunner.
_check_and_update_cudagraph_mode), the keys of a `CudagraphDispatcher` made on the same VllmConfig
(`initialize_cudagraph_keys`), and its `dispatch`. No engine is needed: the dispatcher's table
depends on the config only. The V2 answers stay in policy.py.
"""
from __future__ import annotations

import dataclasses

from harness import protocol as p

from . import settings
from .policy import VERSION, Answer, VllmPolicy
from .v1_lora import lora_args

# vLLM 0.25 reads this when a VllmConfig asks which runner to use (envs.py, VllmConfig.use_v2_model_runner).
RUNNER_SWITCH = "VLLM_USE_V2_MODEL_RUNNER"


def v1_dispatcher(vllm_config, mode, decode_query_len: int):
    """vLLM's CudagraphDispatcher with the keys the V1 runner initialises after resolving the mode."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    dispatcher = CudagraphDispatcher(vllm_config)
    dispatcher.initialize_cudagraph_keys(mode, decode_query_len)
    return dispatcher


def v1_graph_keys(dispatcher) -> dict[str, tuple]:
    """Each runtime mode's keys as (num_tokens, num_reqs, uniform, num_active_loras), sorted."""
    return {mode.name: tuple(sorted((k.num_tokens, k.num_reqs or 0, k.uniform, k.num_active_loras) for k in keys))
            for mode, keys in dispatcher.cudagraph_keys.items() if keys}


def as_dispatch(mode, desc) -> p.Dispatch:
    """A V1 (CUDAGraphMode, BatchDescriptor) as the protocol's Dispatch."""
    return p.Dispatch(mode.name, p.Descriptor(desc.num_tokens, desc.num_reqs, desc.uniform, desc.has_lora,
                                              desc.num_active_loras))


def resolve_v1(vllm_config, support, backend_name: str, decode_query_len: int):
    """The mode GPUModelRunner._check_and_update_cudagraph_mode resolves (its max_num_reqs: max_num_seqs)."""
    return vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        support, backend_name, decode_query_len, use_v2_model_runner=False,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs)


def v1_args(model_dir, config: p.PolicyConfig, adapters: tuple[str, ...] = (), **kwargs):
    """EngineArgs for the V1 runner: ngram drafts (no draft model), LoRA enabled where asked (with
    the adapter folders an engine loads, v1_lora.py)."""
    base = dataclasses.replace(config, num_speculative_tokens=0, max_loras=0)
    args = settings.engine_args(model_dir, base, **kwargs)
    if config.num_speculative_tokens:
        args.speculative_config = {"method": "ngram", "num_speculative_tokens": config.num_speculative_tokens,
                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    for name, value in lora_args(config, adapters).items():
        setattr(args, name, value)
    return args


class VllmV1Policy(VllmPolicy):
    def _compute(self, config: p.PolicyConfig) -> Answer:
        from vllm.v1.attention.backend import AttentionCGSupport

        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(v1_args(self.model_dir, config))
            if vllm_config.use_v2_model_runner:
                raise RuntimeError(f"vLLM chose its V2 runner for a V1 policy question ({RUNNER_SWITCH}="
                                   f"{__import__('os').environ.get(RUNNER_SWITCH)!r}); the V1 runtime sets it to 0")
            mode = resolve_v1(vllm_config, AttentionCGSupport[self.support], settings.ATTENTION_BACKEND,
                              config.query_len)
            dispatcher = v1_dispatcher(vllm_config, mode, config.query_len)
        sizes = tuple(sorted(vllm_config.compilation_config.cudagraph_capture_sizes or ())) if mode.name != "NONE" else ()
        return Answer(sizes, mode.name, tuple(warnings), dispatcher)

    def dispatch(self, config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
                 num_active_loras: int = 0) -> p.Dispatch:
        """CudagraphDispatcher.dispatch as the V1 runner calls it (_determine_batch_execution_and_padding):
        uniform_decode means every request brings q tokens; V1 does not take a request count."""
        dispatcher = self.answer(config).dispatcher
        mode, desc = dispatcher.dispatch(num_tokens=num_real_tokens, uniform_decode=uniform,  # vLLM's own name
                                         has_lora=num_active_loras > 0, num_active_loras=num_active_loras)
        return as_dispatch(mode, desc)

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        from vllm.v1.attention.backend import AttentionCGSupport

        if request.splitting_ops_empty:
            compilation = {"splitting_ops": []}
        elif not request.attention_in_splitting_ops:
            compilation = {"mode": 0}
        else:
            compilation = {}
        config = p.PolicyConfig(mode=request.mode, rules=f"vllm-{VERSION}/v1")
        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(v1_args(self.model_dir, config, compilation=compilation))
            mode = resolve_v1(vllm_config, AttentionCGSupport[request.support],
                              f"a backend of support {request.support}", 1 + request.num_speculative_tokens)
        return p.Resolution(request.mode, mode.name, tuple(warnings))
