"""A real vLLM 0.25 engine on one GPU, driven one exact batch at a time.

Built as vLLM's offline engine builds itself in-process (vllm/v1/engine/core.py EngineCore.__init__,
_initialize_kv_caches): EngineArgs -> VllmConfig, UniProcExecutor, a profile run (torch.compile
happens here), KV cache configs, initialize_from_config (the graph mode resolved, the V2
CudaGraphManager made). This runtime being the scheduler, the KV cache has a fixed number of blocks
(num_gpu_blocks_override) and graphs are captured by `capture()` (the runner's `capture_model`).
A step is one `execute_model` + `sample_tokens` with a SchedulerOutput this runtime writes; logits
are the model's `compute_logits` over every real token's hidden states, read between the two calls.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from harness import protocol as p
from harness.kit import scheduled
from harness.kit.block_book import num_blocks_for
from harness.kit.guard import cached_memory_returned
from harness.kit.scheduled import ScheduledEngine, greedy_tolerance, sampled_greedily

from . import release, settings
from .policy import graph_descriptors, sizes_with_graphs
from .observer import StepObserver
from .requests import Requests


class EngineError(RuntimeError):
    """vLLM did something other than what this runtime asked, or the runtime misread it."""


def request_rows(req_ids: list, starts, planned) -> list:
    """(request, its token rows) for each planned request, from vLLM's batch order and query starts."""
    return scheduled.request_rows(req_ids, starts, planned, lambda q: q.vllm_id, "vLLM", EngineError)


class VllmEngine(ScheduledEngine):
    engine_name = "vLLM"
    PADDING_BLOCK = None  # what padded request rows' block tables hold (StepInputs.padding_block)
    own_errors = (EngineError,)
    events = settings.EVENTS

    def __init__(self, config: p.EngineConfig, label: str, live=None):
        from vllm.config import set_current_vllm_config

        self.config, self.label = config, label
        self.live = live if live is not None else set()  # this runtime's engines not yet closed
        self.executor = self.runner = None
        self._set_config = set_current_vllm_config
        try:
            self._build()
        except BaseException:
            self.close()  # a failed build gives back what it made, as a closed engine does
            raise

    # The hooks the V1 engine (cudagraph_vllm_engine_v1.engine) fills in; the rest of the build is the same.
    observer_class = StepObserver
    KV_STAGE = "KV cache and graph manager"  # what the build's KV stage makes, for the events log

    def _engine_args(self, config: p.EngineConfig):
        # One more position than the harness asks for: after a step the runner writes the sampled
        # token at index len(tokens) of its per-request token table (input_batch.post_update).
        return settings.engine_args(config.checkpoint, config.policy, dtype=config.dtype, seed=config.seed,
                                    max_model_len=config.max_model_len + 1)

    def _check_runner(self, vllm_config, label: str) -> None:
        if not vllm_config.use_v2_model_runner:
            raise EngineError("vLLM chose its V1 model runner for this config; this runtime drives the V2 runner "
                               "(vllm/v1/worker/gpu/model_runner.py) only")

    def _runner_made(self, vllm_config, label: str) -> None:
        """After the executor made the runner, before the profile run."""

    def _take_graphs(self) -> None:
        self.manager = self.runner.cudagraph_manager

    def _kernel_block_size(self) -> int:
        return self.runner.kernel_block_sizes[0]

    def _built(self, label: str) -> None:
        """The build's last step before the build's cached memory is handed back."""

    def _build(self) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        config, label = self.config, self.label
        policy = config.policy
        args = self._engine_args(config)
        with settings.collect_cudagraph_warnings() as warnings, settings.timed(f"build {label}"), \
                settings.process_state_restored():
            self.vllm_config = vllm_config = settings.create_vllm_config(args)
            self._check_runner(vllm_config, label)
            with settings.timed(f"  {label}: executor (worker, device, model load)"):
                self.executor = UniProcExecutor(vllm_config)
            self.live.add(self)  # from here on close() has something to give back, a failed build included
            self.runner = self.executor.driver_worker.worker.model_runner
            self._runner_made(vllm_config, label)
            with self._set_config(vllm_config):
                specs = self.executor.get_kv_cache_specs()
                with settings.timed(f"  {label}: profile run (torch.compile happens here)"):
                    self.runner.profile_run()
                block_size, num_blocks = self._kv_cache(vllm_config, specs, self.KV_STAGE)
        self.build_warnings = tuple(warnings)
        self._take_graphs()
        self.resolved = self.manager.cudagraph_mode.name
        self._check_attention()
        self.vocab, self.num_blocks = vllm_config.model_config.get_vocab_size(), num_blocks
        self.kernel_block_size = self._kernel_block_size()
        self.requests = Requests(num_blocks, block_size, self.vocab, config.max_model_len, policy.max_num_seqs,
                                 vllm_config.scheduler_config.max_num_batched_tokens)
        self.observer = self.observer_class(self.runner, self.vocab, config.max_model_len)
        self.sampling = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
        self.captured: p.CaptureReport | None = None
        self.last = None
        self.steps = 0
        self._built(label)
        cached_memory_returned()  # none of the build's for capture_model's own empty_cache() to hand back

    def _kv_cache(self, vllm_config, specs, what: str) -> tuple[int, int]:
        """The runner's KV cache of the harness's size, vLLM's null block reserved: (block size, blocks)."""
        import torch
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

        sizes = {spec.block_size for worker in specs for spec in worker.values()}
        if len(sizes) != 1:
            raise EngineError(f"expected one KV block size for a dense Llama, vLLM's specs have {sorted(sizes)}")
        block_size = sizes.pop()
        num_blocks = num_blocks_for(self.config.kv_tokens, block_size, self.config.policy.max_num_seqs, reserved=1)
        vllm_config.cache_config.num_gpu_blocks_override = num_blocks
        register_all_kvcache_specs(vllm_config)
        kv_configs = get_kv_cache_configs(vllm_config, specs, [torch.cuda.mem_get_info()[0]])
        if kv_configs[0].num_blocks != num_blocks:
            raise EngineError(f"vLLM made {kv_configs[0].num_blocks} KV blocks; this runtime asked for {num_blocks}")
        with settings.timed(f"  {self.label}: {what}"):
            self.executor.collective_rpc("initialize_from_config", args=(kv_configs,))
        return block_size, num_blocks

    def _check_attention(self) -> None:
        self.attention = sorted({g.backend.get_name() for groups in self.runner.attn_groups for g in groups})
        if self.attention != [settings.ATTENTION_BACKEND]:
            raise EngineError(f"vLLM chose attention backends {self.attention}; this runtime asked for "
                               f"{settings.ATTENTION_BACKEND} and declares its graph support only")

    # -- capture ------------------------------------------------------------------------------
    def _capture_model(self) -> tuple:
        """The runner's capture_model, once an engine: (vLLM's own memory measure, seconds)."""
        self.capture_once("at engine start")
        self.observer.start()  # capture runs the piecewise path too: keep it off the last step's record
        with settings.timed(f"capture {self.label}"):
            start = time.perf_counter()
            with self._set_config(self.vllm_config), settings.process_state_restored():
                memory = self.runner.capture_model()  # vLLM's own measure: free memory before minus after
            return memory, time.perf_counter() - start

    def capture(self) -> p.CaptureReport:
        from vllm.compilation.counter import compilation_counter

        captured_before, full_before = compilation_counter.num_cudagraph_captured, len(self.manager.graphs)
        memory, seconds = self._capture_model()
        full = len(self.manager.graphs) - full_before
        piecewise = compilation_counter.num_cudagraph_captured - captured_before - full
        graphs = {mode: count for mode, count in (("PIECEWISE", piecewise), ("FULL", full)) if count}
        descs = {key.name: batch for key, batch in self.manager._capture_descs.items()}  # largest first, per mode
        order = [(desc.cg_mode.name, desc.num_tokens) for mode in ("PIECEWISE", "FULL") for desc in descs.get(mode, ())]
        self.captured = p.CaptureReport(graphs, seconds, int(memory), order)
        settings.event(f"captured {self.label}: {graphs} in {seconds:.2f}s, {int(memory) / 2**20:.1f} MiB (vLLM's "
                       f"measure); sizes {[n for _, n in order]}")
        return self.captured

    def sizes_with_graphs(self) -> list[int]:
        return list(sizes_with_graphs(self.manager))

    def capture_sizes(self) -> list[int]:
        """vLLM's cudagraph_capture_sizes for this engine ([] when it resolved NONE)."""
        if self.resolved == "NONE":
            return []
        return sorted(self.vllm_config.compilation_config.cudagraph_capture_sizes or ())

    def graph_descriptors(self) -> dict[str, tuple]:
        return graph_descriptors(self.manager)

    # -- steps --------------------------------------------------------------------------------
    # ScheduledEngine's step (and eager_step): plan, the scheduler's output, vLLM's forward, logits read back, checked.
    @contextmanager
    def guarded(self):
        with self._set_config(self.vllm_config), settings.process_state_restored():
            yield

    def prepare(self, planned):
        return self._scheduler_output(planned)

    def forward(self, planned, output):
        import torch

        self.executor.execute_model(output)
        state = getattr(self.runner, "execute_model_state", None)
        if state is None:
            raise EngineError(f"vLLM's {self.runner_name} model runner left no execute_model_state after execute_model")
        rows = self._rows(state, planned)
        with torch.inference_mode():
            index = torch.tensor([r for _, span in rows for r in span], device=state.hidden_states.device)
            logits = self.runner.model.compute_logits(state.hidden_states.index_select(0, index))
        sampled = self.executor.sample_tokens(None)
        return logits, state, rows, sampled

    runner_name = "V2"

    def check_step(self, record, planned, output, ran) -> int:
        logits, state, rows, sampled = ran
        padded = state.input_batch.num_tokens_after_padding
        self._check(record, padded, rows, logits, sampled, output)
        return padded

    def _scheduler_output(self, planned):
        """The SchedulerOutput vLLM's scheduler would send for these requests, each resumed with its
        tokens so far (as V2's own warm-up builds them, vllm/v1/worker/gpu/warmup.py)."""
        from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

        return self._scheduled([
            NewRequestData(req_id=q.vllm_id, prompt_token_ids=list(q.all_tokens), mm_features=[],
                           sampling_params=self.sampling, pooling_params=None, block_ids=(list(q.blocks),),
                           num_computed_tokens=q.context_len, lora_request=None, prefill_token_ids=list(q.all_tokens))
            for q in planned], planned, SchedulerOutput.make_empty())

    def _scheduled(self, new_reqs: list, planned, output):
        """`output` (empty) scheduling these new requests and ending those released since the last step."""
        output.scheduled_new_reqs = new_reqs
        output.num_scheduled_tokens = {q.vllm_id: q.num_new for q in planned}
        output.total_num_scheduled_tokens = sum(q.num_new for q in planned)
        output.num_common_prefix_blocks = [0]
        output.finished_req_ids = self.requests.take_finished()
        return output

    def _rows(self, state, planned):
        """Each request's rows in the step's input batch (V2 orders requests by token count)."""
        batch = state.input_batch
        return request_rows(list(batch.req_ids), batch.query_start_loc_np, planned)

    def _check(self, record, padded, rows, logits, sampled, output) -> dict[int, int]:
        """Fail loudly where vLLM did not run what this runtime asked, or where the runtime misread it:
        the path and padded size, each token's KV slot, each sampled token (a verify step's accepted
        drafts included: returned per request)."""
        ran = record.ran
        if ran is None:
            raise EngineError("vLLM's CUDA-graph dispatcher was not called during the step")
        if ran.cg_mode.name != record.path or ran.num_tokens != padded:
            raise EngineError(f"vLLM's dispatcher chose {ran.cg_mode.name} at {ran.num_tokens} tokens, but the forward "
                               f"took the {record.path} path at {padded}")
        return self._check_rows(record, rows, logits, sampled, output)

    def _check_rows(self, record, rows, logits, sampled, output) -> dict[int, int]:
        misplaced = self.requests.misplaced(record.slot_mapping.tolist(), rows, self.kernel_block_size)
        if misplaced:
            raise EngineError("vLLM computed other KV slots than this runtime's: " + "; ".join(misplaced))
        return sampled_greedily(rows, logits, dict(zip(sampled.req_ids, sampled.sampled_token_ids)),
                                output.scheduled_spec_decode_tokens, lambda q: q.vllm_id,
                                greedy_tolerance(self.config.dtype), "vLLM", EngineError)

    # -- the end --------------------------------------------------------------------------------
    def close(self) -> None:
        """Give back what this engine holds (release.py), and, after this runtime's last engine, what
        vLLM keeps for the process."""
        if self not in self.live:
            return
        self.live.discard(self)
        executor, runner = self.executor, self.runner
        self.executor = self.runner = self.manager = self.observer = self.last = None
        with settings.timed(f"close {self.label}"), self._set_config(self.vllm_config), settings.process_state_restored():
            if executor is not None:
                release.release_engine(executor, runner, others_alive=bool(self.live))
            del executor, runner
            cached_memory_returned()
            if not self.live:
                release.release_process()

    # -- inspection ---------------------------------------------------------------------------
    def static_buffer_addresses(self) -> dict[str, int]:
        buffers, tables = self.runner.input_buffers, self.runner.block_tables
        return {"input_ids": buffers.input_ids.data_ptr(), "positions": buffers.positions.data_ptr(),
                "query_start_loc": buffers.query_start_loc.data_ptr(), "seq_lens": buffers.seq_lens.data_ptr(),
                "block_table": tables.input_block_tables[0].data_ptr(), "slot_mapping": tables.slot_mappings.data_ptr()}

    def kv_snapshot(self):
        """Every KV slot of every layer, slot first: [num_blocks * block_size, layers * 2 * heads * dim]."""
        import torch

        torch.cuda.synchronize()
        parts = []
        for kv in self.runner.kv_caches:
            # Triton attention: (num_blocks, 2, block_size, kv_heads, head_size) (get_kv_cache_shape).
            if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[1] != 2 \
                    or kv.shape[2] != self.kernel_block_size:
                raise RuntimeError(f"unexpected KV cache layout {getattr(kv, 'shape', type(kv))}; expected "
                                   f"(blocks, 2, {self.kernel_block_size}, heads, head_size)")
            parts.append(kv.permute(0, 2, 1, 3, 4).reshape(kv.shape[0] * kv.shape[2], -1))
        return torch.cat(parts, dim=1).cpu()

    def slot_of(self, request_id: int, position: int) -> int:
        return self.requests.slot(request_id, position, self.kernel_block_size)

    def last_step_inputs(self) -> p.StepInputs:
        from vllm.v1.attention.backends.utils import PAD_SLOT_ID

        last = self.last_record()
        # Padded request rows: zero lengths, query starts padded with the token count; V2's block-table
        # rows are what gather_block_tables left (PADDING_BLOCK None: read nothing), V1's the null block.
        return p.StepInputs(last.token_ids, last.positions, last.slot_mapping, PAD_SLOT_ID, seq_lens=last.seq_lens,
                            query_start_loc=last.query_start_loc, block_tables=last.block_tables,
                            block_size=self.kernel_block_size, padding_block=self.PADDING_BLOCK)

    def describe(self) -> dict:
        """What vLLM itself reports about this engine (for logs)."""
        cc = self.vllm_config.compilation_config
        return {"requested": self.config.policy.mode, "resolved": self.resolved, "compilation_mode": str(cc.mode),
                "config_capture_sizes": list(cc.cudagraph_capture_sizes or []), "sizes_with_graphs": self.sizes_with_graphs(),
                "attention": self.attention, "block_size": self.requests.block_size,
                "kernel_block_size": self.kernel_block_size, "num_blocks": self.num_blocks,
                "model_runner": type(self.runner).__module__, "dtype": str(self.vllm_config.model_config.dtype),
                "max_num_batched_tokens": self.vllm_config.scheduler_config.max_num_batched_tokens,
                "warnings": list(self.build_warnings)}
