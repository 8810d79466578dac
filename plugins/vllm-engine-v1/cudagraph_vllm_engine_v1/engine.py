"""A real vLLM 0.25 engine on one GPU with its V1 model runner (vllm/v1/worker/gpu_model_runner.py)
and that runner's CudagraphDispatcher, driven one exact batch at a time.

Built as engine.py builds the V2 engine (same EngineArgs, fixed KV blocks, capture by
`capture_model`, the same release rules), with vLLM's runner switch set to V1 (v1_policy.
RUNNER_SWITCH). What differs is read from the V1 runner: the dispatcher's keys and what it
returned (observer.py), the forward context the forward ran under, and, for speculative
configs, verify steps: a request of q = k + 1 tokens at a context is one sampled token and k
drafts, handed over as vLLM's scheduler hands drafts (`scheduled_spec_decode_tokens`).
"""
from __future__ import annotations

from harness import protocol as p
from cudagraph_vllm_engine import settings
from cudagraph_vllm_engine.engine import EngineError, VllmEngine, request_rows

from . import ngram_stand_in
from .lora import load_each, lora_requests, request_lora
from .observer import V1StepObserver
from .policy import RUNNER_SWITCH, v1_args, v1_graph_keys


def verify_split(all_tokens, context_len: int, num_new: int, num_speculative_tokens: int):
    """(tokens vLLM has as the request's, drafts) for one request of a step: a request bringing
    exactly q = k + 1 tokens after some context is a verify step (its first token is the one
    sampled last, the rest are drafts); anything else brings no drafts."""
    tokens = tuple(all_tokens)
    if num_speculative_tokens and context_len > 0 and num_new == num_speculative_tokens + 1:
        return tokens[:context_len + 1], tokens[context_len + 1:]
    return tokens, ()


class VllmV1Engine(VllmEngine):
    PADDING_BLOCK = 0  # vLLM's NULL_BLOCK_ID: _build_attention_metadata fills padded rows with it
    adapters: dict = {}  # adapter id (Request.lora) -> vLLM's LoRARequest; set at build, never changed

    observer_class = V1StepObserver
    KV_STAGE = "KV cache and dispatcher keys"

    def _engine_args(self, config: p.EngineConfig):
        policy = config.policy
        self.num_speculative_tokens = policy.num_speculative_tokens
        return v1_args(config.checkpoint, policy, tuple(config.lora_adapters), dtype=config.dtype, seed=config.seed,
                       max_model_len=config.max_model_len + 1 + policy.num_speculative_tokens)

    def _check_runner(self, vllm_config, label: str) -> None:
        if vllm_config.use_v2_model_runner:
            raise EngineError(f"vLLM chose its V2 model runner although {RUNNER_SWITCH}=0; this runtime drives "
                               "the V1 runner (vllm/v1/worker/gpu_model_runner.py) only")
        if self.num_speculative_tokens:
            settings.event(f"  {label}: ngram proposer: {ngram_stand_in.install()}")

    def _runner_made(self, vllm_config, label: str) -> None:
        """The V1 runner's dispatcher checked, and the LoRA adapters loaded once."""
        config = self.config
        if not hasattr(self.runner, "cudagraph_dispatcher"):
            raise EngineError(f"vLLM's model runner {type(self.runner).__module__}.{type(self.runner).__name__} "
                               "has no cudagraph_dispatcher: not the V1 GPUModelRunner")
        self.adapters = {}
        if config.lora_adapters:
            from vllm.lora.request import LoRARequest

            if getattr(self.runner, "lora_manager", None) is None:
                raise EngineError("vLLM's V1 runner has no lora_manager although LoRA was enabled "
                                  f"(lora_config {vllm_config.lora_config}): the model was not wrapped for LoRA")
            self.adapters = lora_requests(tuple(config.lora_adapters), LoRARequest)
            with self._set_config(vllm_config), settings.timed(f"  {label}: LoRA adapters loaded once"):
                load_each(self.runner.lora_manager, self.adapters)

    def _take_graphs(self) -> None:
        self.dispatcher = self.manager = self.runner.cudagraph_dispatcher

    def _kernel_block_size(self) -> int:
        sizes = getattr(self.runner, "kernel_block_sizes", None) or getattr(self.runner, "_init_kernel_block_sizes", None)
        if not sizes or not isinstance(sizes[0], int):
            raise EngineError(f"could not read the V1 runner's kernel block size (found {sizes!r})")
        return sizes[0]

    def _built(self, label: str) -> None:
        self.accepted: dict[int, int] = {}  # request id -> drafts vLLM's rejection sampler accepted, last step
        settings.event(f"built {label}: V1 runner, resolved {self.resolved}, keys {self.graph_descriptors()}")

    # -- capture ------------------------------------------------------------------------------
    def capture(self) -> p.CaptureReport:
        from vllm.compilation.counter import compilation_counter

        counted_before = compilation_counter.num_cudagraph_captured
        descs = [] if self.resolved == "NONE" else self.dispatcher.get_capture_descs()
        memory, seconds = self._capture_model()
        # vLLM counts every CUDA graph it captures, a FULL key's one and each piece of a PIECEWISE
        # key's; the FULL keys are the dispatcher's, so the rest are pieces.
        captured = compilation_counter.num_cudagraph_captured - counted_before
        full = sum(len(batch) for mode, batch in descs if mode.name == "FULL")
        graphs = {mode: count for mode, count in (("PIECEWISE", captured - full), ("FULL", full)) if count}
        order = [(mode.name, desc.num_tokens) for mode, batch in descs for desc in batch]
        self.captured = p.CaptureReport(graphs, seconds, int(memory or 0), order)
        settings.event(f"captured {self.label}: {graphs} in {seconds:.2f}s, {int(memory or 0) / 2**20:.1f} MiB (vLLM's "
                       f"measure); compilation_counter.num_cudagraph_captured +{captured}; order {order}")
        return self.captured

    def sizes_with_graphs(self) -> list[int]:
        return sorted({size for keys in self.graph_descriptors().values() for size, *_ in keys})

    def graph_descriptors(self) -> dict[str, tuple]:
        return v1_graph_keys(self.dispatcher)

    # -- steps: ScheduledEngine's step with the V1 runner's forward and its checks ------------------
    def prepare(self, planned):
        self.observer.expect(sum(q.num_new for q in planned))
        return self._scheduler_output(planned)

    runner_name = "V1"

    def check_step(self, record, planned, output, ran) -> int:
        logits, _, rows, sampled = ran
        padded = self._padded(record)
        self.accepted = self._check(record, padded, rows, logits, sampled, output)
        return padded

    def key_of(self, record):
        """The BatchDescriptor the forward ran under (its adapter count included), as StepResult.key."""
        ran = record.ran
        if ran is None:
            return None
        return p.Descriptor(ran.num_tokens, ran.num_reqs, ran.uniform, ran.has_lora, ran.num_active_loras)

    @staticmethod
    def _padded(record) -> int:
        if record.forwards != 1 or record.ran is None:
            raise EngineError(f"expected one model forward with a BatchDescriptor in its forward context; saw "
                               f"{record.forwards} forwards, descriptor {record.ran!r}")
        if record.forward_tokens != record.ran.num_tokens:
            raise EngineError(f"the forward was given {record.forward_tokens} input ids, its forward context's "
                               f"BatchDescriptor says {record.ran.num_tokens} tokens")
        return record.ran.num_tokens

    def _scheduler_output(self, planned):
        """The SchedulerOutput vLLM's scheduler would send for these requests resumed with their tokens
        so far, drafts of verify steps as scheduled_spec_decode_tokens (vllm/v1/core/sched/output.py)."""
        from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

        output = SchedulerOutput.make_empty()
        new, drafts = [], {}
        for q in planned:
            tokens, spec = verify_split(q.all_tokens, q.context_len, q.num_new, self.num_speculative_tokens)
            new.append(NewRequestData(req_id=q.vllm_id, prompt_token_ids=list(tokens), mm_features=[],
                                      sampling_params=self.sampling, pooling_params=None, block_ids=(list(q.blocks),),
                                      num_computed_tokens=q.context_len,
                                      lora_request=request_lora(q.request_id, q.lora, self.adapters),
                                      prefill_token_ids=list(tokens)))
            if spec:
                drafts[q.vllm_id] = list(spec)
        output.scheduled_spec_decode_tokens = drafts
        return self._scheduled(new, planned, output)

    def _rows(self, state, planned):
        """Each request's rows in the V1 runner's persistent batch (its query_start_loc): on the runner."""
        runner = self.runner
        return request_rows(list(runner.input_batch.req_ids), runner.query_start_loc.np, planned)

    def _check(self, record, padded, rows, logits, sampled, output) -> dict[int, int]:
        mode, desc = record.dispatched[-1] if record.dispatched else (None, None)
        if desc is None:
            raise EngineError("vLLM's CudagraphDispatcher was not called during the step")
        if (mode.name, desc) != (record.path, record.ran):
            raise EngineError(f"vLLM's dispatcher last chose {mode.name} {desc}, but the forward ran under "
                               f"{record.path} {record.ran}")
        if record.slot_mapping is None:
            raise EngineError("the forward context held no slot mapping")
        return self._check_rows(record, rows, logits, sampled, output)

    # -- inspection ---------------------------------------------------------------------------
    def static_buffer_addresses(self) -> dict[str, int]:
        runner = self.runner

        def address(buffer) -> int:  # a CpuGpuBuffer (.gpu) or a plain device tensor
            return getattr(buffer, "gpu", buffer).data_ptr()

        return {name: address(getattr(runner, name)) for name in ("input_ids", "positions", "query_start_loc", "seq_lens")}

    def last_step_inputs(self) -> p.StepInputs:
        import dataclasses

        inputs = super().last_step_inputs()
        return dataclasses.replace(inputs, not_exposed={
            **dict(inputs.not_exposed or {}),
            "lora_ids": "vLLM keeps each token row's adapter as a slot index in its LoRA manager's punica wrapper "
                        "(set by set_active_loras each step), not in a static input of the runner this runtime reads"})

    def describe(self) -> dict:
        info = super().describe()
        info.update(runner="v1", keys=self.graph_descriptors(), num_speculative_tokens=self.num_speculative_tokens)
        return info
