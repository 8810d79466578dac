"""The `vllm-policy` runtime: the installed vLLM's own graph policy behind the harness protocol.

`PolicyConfig.rules` picks the model runner whose code answers (VLLM_USE_V2_MODEL_RUNNER is set
to match for the length of each question). Every answer comes from vLLM's code, called as that
runner calls it:

- capture sizes: `VllmConfig.__post_init__` (`_set_cudagraph_sizes`) and then
  `CompilationConfig.resolve_cudagraph_mode_and_sizes(use_v2_model_runner=...)` (V1 rounds the
  sizes to multiples of q under FULL decode graphs; V2 does not);
- V1 padding and dispatch: `CudagraphDispatcher.initialize_cudagraph_keys` and `dispatch`;
- V2 keys and dispatch: `vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager` (its capture
  descriptors and `dispatch`), with LoRA cases from `lora_utils.get_lora_capture_cases`;
- mode resolution: `VllmConfig.__post_init__` (splitting ops, compilation mode) and then
  `resolve_cudagraph_mode_and_sizes` for the weakest backend's `AttentionCGSupport`;
- data parallel, V1: the per-rank dispatch, vLLM's post-processing of the DP all-reduce
  (`vllm.v1.worker.dp_utils`) and the re-dispatch of `_determine_batch_execution_and_padding`;
  V2: `vllm.v1.worker.gpu.dp_utils.dispatch_cg_and_sync_dp` for each rank, the ranks'
  all-reduce answered with the table every rank wrote.

Without a GPU vLLM picks a platform without graphs, so `_stand_in` answers the device queries
(graph support, capability, name, memory, a graph memory pool handle) as an H200 (platform max
512) or a B200 (1024) would, for the length of one question. V2's graph manager reads the
pipeline-parallel group, so a single-process gloo world is initialised once. Its `dispatch`
answers only after capture, which needs a GPU: the manager is marked captured instead. Nothing
else is patched. vLLM is imported when the runtime is built, never at import time, so listing
runtimes stays cheap where vLLM is absent.
"""
from __future__ import annotations

import contextlib
import logging
import os
from functools import lru_cache
from pathlib import Path

from harness import protocol as p
from harness.session.machine import free_port
from harness.vocabulary import padded

from . import __version__

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny_llama"  # a config.json only: ModelConfig needs an architecture, never weights
KNOWN_FAILURES = HERE.parent / "known_failures.toml"
GiB = 1 << 30
# platform_max -> (capability, name, total memory as torch reports it, about)
DEVICES = {512: ((9, 0), "NVIDIA H200", 139 * GiB), 1024: ((10, 0), "NVIDIA B200", 179 * GiB)}


class _Warnings(logging.Handler):
    """Collects vLLM's warnings about CUDA graphs (WARNING or above, naming cudagraphs) while it
    answers one question; its other warnings (e.g. "Inductor compilation was disabled") and its
    INFO lines are not warnings about the graph mode."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        if "cudagraph" in record.getMessage().lower():
            self.messages.append(record.getMessage())


class VllmPolicyRuntime:
    name = "vllm-policy"
    known_failures = str(KNOWN_FAILURES)
    capabilities = p.Capabilities(
        capture_sizes=True, rules="vllm-0.33", dispatch=True, mode_resolution=True, data_parallel=True,
        lora=True, speculative=True,
        notes=("policy only, answered by the installed vLLM's code for the runner PolicyConfig.rules names "
               "(V1: CudagraphDispatcher; V2: CudaGraphManager) with no GPU and no model weights; stood in: "
               "the platform's device queries (graph support, capability 9.0 or 10.0 for platform_max 512 or "
               "1024, device name, total memory, graph pool handle), V2's capture (the manager is marked "
               "captured), the data-parallel all-reduce (every rank's row, summed); speculative = ngram; "
               "resolve_mode asks the default runner; vLLM's config assertions are reported as ValueError"),
    )

    def __init__(self):
        import vllm  # fails here, with the reason shown by the harness, when vLLM is not installed
        from vllm.config import ModelConfig

        self.version = f"{__version__} (vLLM {vllm.__version__})"
        self._model = ModelConfig(model=str(MODEL_DIR), skip_tokenizer_init=True, dtype="float32")
        self._dispatcher = lru_cache(maxsize=256)(self._build_dispatcher)
        # vLLM imports modules lazily, and some set environment variables as they load (vLLM 0.33's
        # vllm._aiter_ops sets AITER_SITUV2_A4W4 on CPU too): one question per runner here loads
        # them before the first test, so the harness's isolation check does not see the first test
        # that asks as changing the process's environment.
        for runner in ("v1", "v2"):
            self.capture_sizes(p.PolicyConfig(rules=f"vllm-0.33/{runner}"))

    # -- vLLM configs --------------------------------------------------------------------
    @contextlib.contextmanager
    def _vllm(self, platform_max: int = 512, runner: str = "v2"):
        """Stand in for the device, pick the model runner, collect vLLM's warnings, and turn its
        config assertions into ValueError (the protocol's rejection)."""
        from vllm import logger as vllm_logger
        from vllm.platforms import current_platform

        capability, device_name, memory = DEVICES[platform_max]
        real = type(current_platform)
        before = os.environ.get(RUNNER_ENV)
        os.environ[RUNNER_ENV] = "1" if runner == "v2" else "0"
        current_platform.__class__ = _stand_in(real, capability, device_name, memory)
        vllm_logger._print_warning_once.cache_clear()  # each question is a fresh vLLM start
        handler = _Warnings()
        logging.getLogger("vllm").addHandler(handler)
        try:
            yield handler.messages
        except AssertionError as exc:
            raise ValueError(f"vLLM rejects the config: {exc}") from exc
        finally:
            logging.getLogger("vllm").removeHandler(handler)
            current_platform.__class__ = real
            if before is None:
                os.environ.pop(RUNNER_ENV, None)
            else:
                os.environ[RUNNER_ENV] = before

    def _vllm_config(self, config: p.PolicyConfig, cudagraph_mode: str, **compilation):
        from vllm.config import (CompilationConfig, DeviceConfig, LoRAConfig, SchedulerConfig,
                                 SpeculativeConfig, VllmConfig)
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        tokens = config.max_num_batched_tokens
        if tokens is None:  # what `vllm serve` picks for this device
            tokens = EngineArgs.get_batch_defaults(world_size=1)[0][UsageContext.OPENAI_API_SERVER]
        speculative = None
        if config.num_speculative_tokens:
            speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=config.num_speculative_tokens,
                                            prompt_lookup_min=1, prompt_lookup_max=3)
        if config.capture_sizes is not None:
            compilation["cudagraph_capture_sizes"] = list(config.capture_sizes)
        if config.max_capture_size is not None:
            compilation["max_cudagraph_capture_size"] = config.max_capture_size
        lora = None
        if config.max_loras:
            lora = LoRAConfig(max_loras=config.max_loras, specialize_active_lora=config.specialize_active_loras)
        return VllmConfig(
            model_config=self._model,
            scheduler_config=SchedulerConfig(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=tokens,
                                             max_model_len=self._model.max_model_len, is_encoder_decoder=False),
            compilation_config=CompilationConfig(cudagraph_mode=cudagraph_mode,
                                                 cudagraph_specialize_lora=config.specialize_lora, **compilation),
            speculative_config=speculative, lora_config=lora, device_config=DeviceConfig(device="cpu"),
        )

    def _build_dispatcher(self, config: p.PolicyConfig):
        """vLLM's dispatcher for a config, keys initialised as the config's runner does for a
        backend that supports every batch (ALWAYS): `config.mode` is already the resolved mode.
        V1: a CudagraphDispatcher; V2: a CudaGraphManager, marked captured."""
        from vllm.v1.attention.backend import AttentionCGSupport

        v2 = config.vllm_runner == "v2"
        with self._vllm(config.platform_max, config.vllm_runner):
            vllm_config = self._vllm_config(config, config.mode)
            if vllm_config.use_v2_model_runner != v2:
                raise ValueError(f"vLLM picked the {'V2' if vllm_config.use_v2_model_runner else 'V1'} model runner "
                                 f"for a config asking for {config.vllm_runner}")
            if not v2:
                from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

                dispatcher = CudagraphDispatcher(vllm_config)
                mode = vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
                    AttentionCGSupport.ALWAYS, None, config.query_len, use_v2_model_runner=False)
                dispatcher.initialize_cudagraph_keys(mode, config.query_len)
                return dispatcher
            import torch
            from vllm.config import set_current_vllm_config
            from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager
            from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

            mode = vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
                AttentionCGSupport.ALWAYS, None, config.query_len, use_v2_model_runner=True)
            with set_current_vllm_config(vllm_config):
                _single_process_world()
                manager = CudaGraphManager(
                    vllm_config, torch.device("cpu"), mode, config.query_len,
                    lora_capture_cases=get_lora_capture_cases(vllm_config.lora_config, vllm_config.compilation_config))
            manager._graphs_captured = True  # capture() needs a GPU; dispatch() answers only after it
        return manager

    # -- policy --------------------------------------------------------------------------
    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return list(self._dispatcher(config).compilation_config.cudagraph_capture_sizes)

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        dispatcher = self._dispatcher(config)
        if config.vllm_runner == "v2":
            # V2 keeps no padding table: its mixed routine pads to the smallest capture size.
            return padded(dispatcher.compilation_config.cudagraph_capture_sizes, num_real_tokens)
        table = getattr(dispatcher, "_bs_to_padded_graph_size", None)  # built only when graphs are on
        return table[num_real_tokens] if table is not None and num_real_tokens < len(table) else None

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0) -> p.Dispatch:
        dispatcher = self._dispatcher(config)
        if config.vllm_runner == "v2":
            return self._dispatch_v2(config, dispatcher, num_real_tokens, num_real_rows, uniform, num_active_loras)
        return self._dispatch(dispatcher, num_real_tokens, num_real_rows, uniform, num_active_loras)

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        from vllm.config import CompilationMode
        from vllm.v1.attention.backend import AttentionCGSupport

        if request.splitting_ops_empty:  # VLLM_COMPILE (-O2) with nothing to split at
            options = dict(splitting_ops=[])
        elif not request.attention_in_splitting_ops:  # no piecewise compilation: the forward is not split
            options = dict(mode=CompilationMode.NONE)
        else:  # the default: VLLM_COMPILE, splitting at the attention ops
            options = {}
        config = p.PolicyConfig(num_speculative_tokens=request.num_speculative_tokens)  # the default runner
        with self._vllm(runner=config.vllm_runner) as warnings:
            compilation = self._vllm_config(config, request.mode, **options).compilation_config
            # The runner's second check (vLLM 0.33): whether the loaded model gives piecewise graphs.
            capture = {} if getattr(request, "piecewise_capture", True) else dict(piecewise_capture_available=False)
            resolved = compilation.resolve_cudagraph_mode_and_sizes(
                AttentionCGSupport[request.support], "the weakest", config.query_len,
                use_v2_model_runner=config.vllm_runner == "v2", **capture)
        return p.Resolution(request.mode, resolved.name, tuple(warnings))

    def dp_dispatch(self, config: p.PolicyConfig, ranks) -> list[p.Dispatch]:
        if config.vllm_runner == "v2":
            return self._dp_dispatch_v2(config, ranks)
        return self._dp_dispatch_v1(config, ranks)

    def _dp_dispatch_v1(self, config: p.PolicyConfig, ranks) -> list[p.Dispatch]:
        """Each rank dispatches alone; the ranks' all-reduce (one column per rank, summed) goes
        through vLLM's post-processing; each rank re-dispatches at its agreed size and mode."""
        import torch
        from vllm.config import CUDAGraphMode
        from vllm.v1.worker import dp_utils

        dispatcher = self._dispatcher(config)
        local = [self._dispatch(dispatcher, r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
        if len(ranks) == 1:  # coordinate_batch_across_dp returns early at data_parallel_size 1
            return local
        reduced = torch.zeros(4, len(ranks), dtype=torch.int32)  # the layout of dp_utils._run_ar
        for i, (rank, mine) in enumerate(zip(ranks, local)):
            reduced[0][i], reduced[1][i] = rank.num_real_tokens, mine.descriptor.num_padded_tokens
            reduced[3][i] = CUDAGraphMode[mine.runtime_mode].value
        synced_mode = dp_utils._post_process_cudagraph_mode(reduced)
        sizes = dp_utils._post_process_dp_padding(reduced, should_dp_pad=synced_mode != 0)
        return [self._dispatch(dispatcher, int(sizes[i]), rank.num_real_rows, rank.uniform,
                               valid_modes={CUDAGraphMode(synced_mode)}) for i, rank in enumerate(ranks)]

    def _dp_dispatch_v2(self, config: p.PolicyConfig, ranks) -> list[p.Dispatch]:
        """Each rank runs V2's dispatch_cg_and_sync_dp as its model runner does; the all-reduce
        of the 7 x ranks table each rank fills in its own column is answered with the sum of
        every rank's table, as the collective would."""
        from vllm.v1.worker.gpu import dp_utils

        manager = self._dispatcher(config)
        q = config.query_len
        batches = [(r.num_real_tokens, _num_reqs(config, r.num_real_tokens, r.num_real_rows, r.uniform), r.uniform) for r in ranks]
        if len(ranks) == 1:
            return [self._dispatch_v2(config, manager, r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
        tables = []  # each rank's column of the all-reduce, as sync_cudagraph_and_dp_padding writes it
        with _collective(tables, len(ranks)) as group:
            for rank, (tokens, reqs, uniform) in enumerate(batches):
                group.rank = rank
                dp_utils.dispatch_cg_and_sync_dp(manager, reqs, tokens, q if uniform else None, len(ranks), rank,
                                                 max_query_len=q if uniform else None)
            group.gathered = True
            agreed = []
            for rank, (tokens, reqs, uniform) in enumerate(batches):
                group.rank = rank
                desc, _ = dp_utils.dispatch_cg_and_sync_dp(manager, reqs, tokens, q if uniform else None,
                                                           len(ranks), rank, max_query_len=q if uniform else None)
                agreed.append(_from_v2(desc))
        return agreed

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _dispatch_v2(config, manager, num_real_tokens, num_real_rows, uniform, num_active_loras=0) -> p.Dispatch:
        """V2's dispatch as GPUModelRunner.execute_model calls it: a uniform batch brings its
        token count per request (q) and its longest query (q); any other batch neither."""
        q = config.query_len
        desc = manager.dispatch(_num_reqs(config, num_real_tokens, num_real_rows, uniform), num_real_tokens,
                                q if uniform else None, num_active_loras, max_query_len=q if uniform else None)
        return _from_v2(desc)

    @staticmethod
    def _dispatch(dispatcher, num_real_tokens, num_real_rows, uniform, num_active_loras=0, valid_modes=None) -> p.Dispatch:
        mode, key = dispatcher.dispatch(num_real_tokens, uniform_decode=uniform, has_lora=num_active_loras > 0,
                                        num_active_loras=num_active_loras, valid_modes=valid_modes)
        return p.Dispatch(mode.name, p.Descriptor(key.num_tokens, key.num_reqs, key.uniform, key.has_lora,
                                                  key.num_active_loras))


@lru_cache(maxsize=None)
def _stand_in(platform: type, capability: tuple[int, int], device_name: str, memory: int) -> type:
    """The platform vLLM picked, answering the device queries as a GPU with graphs would."""
    from vllm.platforms.interface import DeviceCapability

    return type(f"{platform.__name__}As{device_name.split()[-1]}", (platform,), {
        "support_static_graph_mode": classmethod(lambda cls: True),
        "get_device_capability": classmethod(lambda cls, device_id=0: DeviceCapability(*capability)),
        "get_device_name": classmethod(lambda cls, device_id=0: device_name),
        "get_device_total_memory": classmethod(lambda cls, device_id=0: memory),
        "graph_pool_handle": lambda self: f"graph pool of the stood-in {device_name}",  # no device memory here
    })


RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def _num_reqs(config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None, uniform: bool) -> int:
    """V2 needs a request count; the protocol's None is the most the batch can hold."""
    if num_real_rows is not None:
        return num_real_rows
    return num_real_tokens // config.query_len if uniform else min(num_real_tokens, config.max_num_seqs)


def _from_v2(desc) -> p.Dispatch:
    """A V2 BatchExecutionDescriptor as a protocol Dispatch: uniform means a uniform token count."""
    return p.Dispatch(desc.cg_mode.name, p.Descriptor(desc.num_tokens, desc.num_reqs, desc.uniform_token_count is not None,
                                                     desc.num_active_loras > 0, desc.num_active_loras))


def _single_process_world() -> None:
    """A one-rank gloo world, once per process: V2's graph manager reads the pipeline group."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    parallel_state.initialize_model_parallel(1, 1)


class _AllReduce:
    """The data-parallel group as V2's dp_utils sees it, for ranks simulated one after another:
    the first pass records each rank's column; the second answers every rank with their sum."""

    def __init__(self, tables: list, world: int):
        self.tables, self.world, self.rank, self.gathered = tables, world, 0, False

    def cpu_all_reduce_(self, tensor):
        if not self.gathered:
            self.tables.append(tensor.clone())
        else:
            tensor.copy_(sum(self.tables))
        return tensor


@contextlib.contextmanager
def _collective(tables: list, world: int):
    from vllm.v1.worker.gpu import dp_utils

    group = _AllReduce(tables, world)
    real = dp_utils.get_dp_group
    dp_utils.get_dp_group = lambda: group
    try:
        yield group
    finally:
        dp_utils.get_dp_group = real
