"""The graph policy of vLLM 0.25's V2 model runner, answered by vLLM's own code for any
PolicyConfig: the VllmConfig an engine would get (settings.engine_args, with an EAGLE draft for
speculative tokens and LoRA enabled without adapters), the mode resolved as
`GPUModelRunner.initialize_kv_cache` does, and the V2 `CudaGraphManager`'s candidate table and
`dispatch` (on a manager built without a model), its LoRA cases vLLM's `get_lora_capture_cases`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness import protocol as p
from harness.vocabulary import padded

from . import settings

POLICY_MODEL = Path(__file__).with_name("policy_model")  # a config.json only: sizes never depend on weights
VERSION = "0.25"  # the vLLM release whose code answers, and whose rules this runtime declares


@dataclass(frozen=True)
class Answer:
    sizes: tuple[int, ...]  # vLLM's cudagraph_capture_sizes for the config, ascending
    mode: str  # the resolved config mode
    warnings: tuple[str, ...]
    dispatcher: object  # a vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager without a model


def check_version(version: str) -> None:
    """This runtime declares vLLM 0.25's rules: another release would answer with its own under them."""
    if not (version == VERSION or version.startswith(VERSION + ".")):
        raise RuntimeError(f"this runtime declares vLLM {VERSION}'s graph policy and answers with vLLM's own code, "
                           f"but vLLM {version} is installed; install vLLM {VERSION}.x (README)")


def attention_support() -> str:
    """The Triton backend's AttentionCGSupport, read from vLLM (not written down here)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    return TritonAttentionMetadataBuilder.get_cudagraph_support(None, None).name


def dispatcher_for(vllm_config, mode, decode_query_len: int = 1, graphs_captured: bool = True):
    """vLLM's V2 CudaGraphManager with its candidate table, built without __init__ (its distributed
    group and graph pool take no part in the table): the attributes `_init_candidates`,
    `_build_lora_dispatch_map` and `dispatch` read (vllm/v1/worker/gpu/cudagraph_utils.py)."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    manager = CudaGraphManager.__new__(CudaGraphManager)
    manager.vllm_config = vllm_config
    manager.compilation_config = vllm_config.compilation_config
    manager.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
    manager.cudagraph_mode = mode
    manager.decode_query_len = decode_query_len
    manager.lora_capture_cases = get_lora_capture_cases(vllm_config.lora_config, vllm_config.compilation_config)
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager._candidates, manager._capture_descs = {}, {}
    manager._init_candidates()
    manager._graphs_captured = graphs_captured  # the policy as it stands once capture() has run
    return manager


def graph_descriptors(manager) -> dict[str, tuple]:
    """Each runtime mode's descriptors a manager captures, sorted: what a built engine is checked against."""
    return {mode.name: tuple(sorted(map(repr, descs))) for mode, descs in manager._capture_descs.items()}


def sizes_with_graphs(manager) -> tuple[int, ...]:
    return tuple(sorted({desc.num_tokens for descs in manager._capture_descs.values() for desc in descs}))


def as_dispatch(desc) -> p.Dispatch:
    """A V2 BatchExecutionDescriptor as the protocol's Dispatch: uniform means a uniform token count."""
    loras = desc.num_active_loras
    return p.Dispatch(desc.cg_mode.name, p.Descriptor(desc.num_tokens, desc.num_reqs,
                                                      desc.uniform_token_count is not None, loras > 0, loras))


def num_reqs_of(config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None, uniform: bool) -> int:
    """V2 dispatches with a request count; the protocol's None is the most the batch can hold."""
    if num_real_rows is not None:
        return num_real_rows
    return num_real_tokens // config.query_len if uniform else min(num_real_tokens, config.max_num_seqs)


class VllmPolicy:
    """The V2 runner's answers; the V1 runner's (cudagraph_vllm_engine_v1.policy) differ in the hooks below."""

    QUESTION_RULES: str | None = None  # the rules a resolve_mode question's PolicyConfig names

    def __init__(self, model_dir: str | Path = POLICY_MODEL):
        self.model_dir = str(model_dir)
        self.support = attention_support()
        self._answer = lru_cache(maxsize=1024)(self._compute)

    def answer(self, config: p.PolicyConfig) -> Answer:
        return self._answer(config)

    def _args(self, config: p.PolicyConfig, **kwargs):
        return settings.engine_args(self.model_dir, config, draft=self.model_dir, **kwargs)

    def _check_runner(self, vllm_config) -> None:
        pass

    def _resolve(self, vllm_config, support, backend_name: str, decode_query_len: int):
        return resolve(vllm_config, support, backend_name, decode_query_len)

    def _dispatcher(self, vllm_config, mode, decode_query_len: int):
        return dispatcher_for(vllm_config, mode, decode_query_len)

    def _compute(self, config: p.PolicyConfig) -> Answer:
        from vllm.v1.attention.backend import AttentionCGSupport

        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(self._args(config))
            self._check_runner(vllm_config)
            mode = self._resolve(vllm_config, AttentionCGSupport[self.support], settings.ATTENTION_BACKEND,
                                 config.query_len)
            manager = self._dispatcher(vllm_config, mode, config.query_len)
        sizes = tuple(sorted(vllm_config.compilation_config.cudagraph_capture_sizes or ())) if mode.name != "NONE" else ()
        return Answer(sizes, mode.name, tuple(warnings), manager)

    # -- the protocol's policy questions -------------------------------------------------
    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return list(self.answer(config).sizes)

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        """V2 keeps no padding table: its mixed routine pads to the smallest capture size that holds the batch."""
        return padded(self.answer(config).sizes, num_real_tokens)

    def dispatch(self, config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
                 num_active_loras: int = 0) -> p.Dispatch:
        """CudaGraphManager.dispatch as execute_model calls it: V2's uniform batch brings one count per
        request, and only q's can match a decode graph, so that is the harness's `uniform`."""
        manager = self.answer(config).dispatcher
        q = config.query_len
        desc = manager.dispatch(num_reqs_of(config, num_real_tokens, num_real_rows, uniform), num_real_tokens, q if uniform else None,
                                num_active_loras)
        return as_dispatch(desc)

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        from vllm.v1.attention.backend import AttentionCGSupport

        if request.splitting_ops_empty:
            compilation = {"splitting_ops": []}
        elif not request.attention_in_splitting_ops:
            compilation = {"mode": 0}  # CompilationMode.NONE: the forward is not split, no piecewise graphs
        else:
            compilation = {}
        config = p.PolicyConfig(mode=request.mode, rules=self.QUESTION_RULES)
        with settings.collect_cudagraph_warnings() as warnings:
            vllm_config = settings.create_vllm_config(self._args(config, compilation=compilation))
            mode = self._resolve(vllm_config, AttentionCGSupport[request.support],
                                 f"a backend of support {request.support}", 1 + request.num_speculative_tokens)
        return p.Resolution(request.mode, mode.name, tuple(warnings))


def resolve(vllm_config, support, backend_name: str, decode_query_len: int, use_v2_model_runner: bool = True):
    """The mode GPUModelRunner.initialize_kv_cache resolves (vllm/v1/worker/gpu/model_runner.py; the
    V1 runner's _check_and_update_cudagraph_mode with use_v2_model_runner=False, its max_num_reqs
    max_num_seqs too); vLLM raises ValueError where no graph mode is possible."""
    return vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        support, backend_name, decode_query_len, use_v2_model_runner=use_v2_model_runner,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs)
