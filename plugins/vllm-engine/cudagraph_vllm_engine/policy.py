"""The graph policy of vLLM 0.25's V2 model runner, answered by vLLM's own code for any
PolicyConfig: the VllmConfig the engine would get (settings.engine_args), the mode resolved as
`GPUModelRunner.initialize_kv_cache` resolves it, and the candidate table of the V2
`CudaGraphManager` (its `_init_candidates` and `dispatch`, on a manager built without a model).

V2 differs from the spec's V1 dispatcher in one visible way: graphs exist only for the
descriptors `_init_candidates` makes, so under FULL_DECODE_ONLY the sizes above
max_num_seqs x q have no graph. `capture_sizes()` lists the sizes that have a graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness import protocol as p

from . import settings

POLICY_MODEL = Path(__file__).with_name("policy_model")  # a config.json only: sizes never depend on weights


@dataclass(frozen=True)
class Answer:
    sizes: tuple[int, ...]  # sizes with a graph, ascending
    mode: str  # the resolved config mode
    warnings: tuple[str, ...]
    dispatcher: object  # a vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager without a model


def attention_support() -> str:
    """The Triton backend's AttentionCGSupport, read from vLLM (not written down here)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    return TritonAttentionMetadataBuilder.get_cudagraph_support(None, None).name


def dispatcher_for(vllm_config, mode, decode_query_len: int = 1, graphs_captured: bool = True):
    """vLLM's V2 CudaGraphManager with its candidate table, built without __init__ (which needs a
    distributed group and a graph pool, and neither takes part in the table). The attributes set
    here are the ones `_init_candidates`, `_build_lora_dispatch_map` and `dispatch` read
    (vllm/v1/worker/gpu/cudagraph_utils.py, CudaGraphManager.__init__)."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    manager = CudaGraphManager.__new__(CudaGraphManager)
    manager.vllm_config = vllm_config
    manager.compilation_config = vllm_config.compilation_config
    manager.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
    manager.cudagraph_mode = mode
    manager.decode_query_len = decode_query_len
    manager.lora_capture_cases = [0]
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager._candidates, manager._capture_descs = {}, {}
    manager._init_candidates()
    manager._graphs_captured = graphs_captured  # the policy as it stands once capture() has run
    return manager


def sizes_with_graphs(manager) -> tuple[int, ...]:
    return tuple(sorted({desc.num_tokens for descs in manager._capture_descs.values() for desc in descs}))


def as_dispatch(desc) -> p.Dispatch:
    """A V2 BatchExecutionDescriptor as the protocol's Dispatch (an eager one is vLLM's trivial key)."""
    if desc.cg_mode.name == "NONE":
        return p.Dispatch("NONE", p.Descriptor(desc.num_tokens))
    return p.Dispatch(desc.cg_mode.name, p.Descriptor(desc.num_tokens, desc.num_reqs, desc.uniform_token_count is not None,
                                                      False, desc.num_active_loras))


class VllmPolicy:
    def __init__(self, model_dir: str | Path = POLICY_MODEL):
        self.model_dir = str(model_dir)
        self.support = attention_support()
        self._answer = lru_cache(maxsize=1024)(self._compute)

    def answer(self, config: p.PolicyConfig) -> Answer:
        return self._answer(config)

    def _compute(self, config: p.PolicyConfig) -> Answer:
        from vllm.v1.attention.backend import AttentionCGSupport

        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(settings.engine_args(self.model_dir, config))
            mode = resolve(vllm_config, AttentionCGSupport[self.support], settings.ATTENTION_BACKEND, config.query_len)
            manager = dispatcher_for(vllm_config, mode, config.query_len)
        return Answer(sizes_with_graphs(manager) if mode.name != "NONE" else (), mode.name, tuple(warnings), manager)

    # -- the protocol's policy questions -------------------------------------------------
    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return list(self.answer(config).sizes)

    def padded_size(self, config: p.PolicyConfig, num_tokens: int) -> int | None:
        candidates = self.answer(config).dispatcher._candidates.get((num_tokens, 0))
        return candidates[0].num_tokens if candidates else None

    def dispatch(self, config: p.PolicyConfig, num_tokens: int, num_reqs: int | None = None, uniform: bool = False,
                 num_active_loras: int = 0) -> p.Dispatch:
        if num_active_loras:
            raise ValueError("vllm-engine loads no LoRA adapters: num_active_loras must be 0")
        manager = self.answer(config).dispatcher
        # V2 calls a batch uniform when every request brings the same count; only a count of q
        # can match a decode graph, so the harness's `uniform` (every request brings q) is the same test.
        desc = manager.dispatch(num_reqs or 1, num_tokens, config.query_len if uniform else None, 0)
        return as_dispatch(desc)

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        from vllm.v1.attention.backend import AttentionCGSupport

        if request.splitting_ops_empty:
            compilation = {"splitting_ops": []}
        elif not request.attention_in_splitting_ops:
            compilation = {"mode": 0}  # CompilationMode.NONE: the forward is not split, no piecewise graphs
        else:
            compilation = {}
        config = p.PolicyConfig(mode=request.mode)
        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(settings.engine_args(self.model_dir, config, compilation=compilation))
            mode = resolve(vllm_config, AttentionCGSupport[request.support], f"a backend of support {request.support}",
                           1 + request.num_speculative_tokens)
        return p.Resolution(request.mode, mode.name, tuple(warnings))


def resolve(vllm_config, support, backend_name: str, decode_query_len: int):
    """The mode GPUModelRunner.initialize_kv_cache resolves (vllm/v1/worker/gpu/model_runner.py);
    vLLM raises ValueError where no graph mode is possible."""
    return vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        support, backend_name, decode_query_len, use_v2_model_runner=True,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs)
