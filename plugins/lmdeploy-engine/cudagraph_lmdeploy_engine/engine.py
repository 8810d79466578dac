"""A real LMDeploy 0.18 PyTorch engine on one GPU, driven one exact batch at a time.

Built as LMDeploy builds itself (lmdeploy/pytorch/engine/engine.py `Engine.__init__`): a
PytorchEngineConfig, its ConfigBuilder configs, `build_executor` (the single-device UniExecutor
and its BaseModelAgent), then `ExecutorBase.init`'s stages: build_model (weights loaded from the
harness's checkpoint), update_configs (here with a fixed block count from EngineConfig.kv_tokens:
the harness inspects every slot), build_graph_runner (LMDeploy's CUDAGraphRunner around the model)
and build_cache_engine. The last stage of `init`, `warmup` (where LMDeploy captures its decode
graphs), is `capture()`. Not built: LMDeploy's Engine around the agent (its scheduler, request
queues, sampler loop, environment-check process); this runtime is the scheduler (requests.py).

A step is one `BaseModelAgent.async_forward` of a `ModelInputs` this runtime writes, then the
model's own `get_logits` on every real token's hidden state (LMDeploy itself takes only each
request's last row to its sampler; the rows come from the same hidden states and function).
"""
from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import replace

from harness import protocol as p
from harness.kit.guard import cached_memory_returned, shared_stream
from harness.kit.scheduled import ScheduledEngine, rows_in_order
from harness.vocabulary import FDO

from . import settings
from .model_dir import model_dir
from .observer import EagerShapeError, GraphRunnerObserver
from .policy import LmdeployPolicy
from .requests import PADDING_SLOT, Requests, is_decoding
from .seen import from_record

_FORWARD_STREAMS: dict = {}  # device -> the one stream every engine's forward runs on (see __init__)


class EngineError(RuntimeError):
    """LMDeploy did something other than what this runtime asked, or the runtime misread it."""


class LmdeployEngine(ScheduledEngine):
    engine_name = "LMDeploy"
    own_errors = (EngineError, EagerShapeError)
    events = settings.EVENTS
    padding_fill_reason = ("padded rows attend only to LMDeploy's reserved block, which they also write, so a "
                           "poisoned KV row would be overwritten before it is read")

    def __init__(self, config: p.EngineConfig, resolved: str, label: str):
        import torch

        self.config, self.resolved, self.label = config, resolved, label
        policy = config.policy
        self.rng = settings.EngineRandom(config.seed, torch.cuda.current_device())
        folder = model_dir(config.checkpoint)
        with settings.timed(f"build {label}"), settings.process_state_restored(self.rng):
            self.executor = build_executor(folder, settings.engine_config(config, resolved))
            for stage in ("build_model", "update_configs", "build_graph_runner", "build_cache_engine"):
                with settings.timed(f"  {label}: {stage}"):
                    getattr(self.executor, stage)()
        self.agent = self.executor.model_agent
        # Each BaseModelAgent makes its own forward stream, and cuBLAS keeps a workspace for every
        # stream a matmul ran on for the life of the process: one per engine would grow the process
        # by a workspace for every engine the suites build. All engines here run one at a time, so
        # they share one stream (set before anything ran on the agent's own).
        self.agent.stream = shared_stream(_FORWARD_STREAMS, torch.cuda.current_device())
        self.runner = self.agent.patched_model
        self.vocab = int(self.agent.model_config.vocab_size)
        self.live_sizes = list(self.runner.get_capture_batch_sizes())
        self.block_size = int(self.agent.cache_config.block_size)
        self.num_blocks = int(self.agent.cache_config.num_gpu_blocks)
        self._check_build(policy)
        self.requests = Requests(self.num_blocks, self.block_size, self.vocab, config.max_model_len,
                                 policy.max_num_seqs, policy.max_num_batched_tokens or self.agent.cache_config.max_prefill_token_num)
        self.observer = GraphRunnerObserver(self.runner, self._eager_runner, self.vocab, config.max_model_len)
        self._eager_runners: dict[int, object] = {}
        self._loop = asyncio.new_event_loop()  # async_forward is a coroutine; this runtime is synchronous
        weakref.finalize(self, self._loop.close)
        self.captured: p.CaptureReport | None = None
        self.last = None
        self.steps = 0
        # The harness measures graph memory as free device memory around capture(): leave no cached
        # blocks of the build behind.
        cached_memory_returned()

    def _check_build(self, policy: p.PolicyConfig) -> None:
        """Fail the build loudly where LMDeploy built something else than this runtime declares."""
        import torch
        from lmdeploy.pytorch import envs

        agent, runner, problems = self.agent, self.runner, []
        if envs.fake_capture or envs.enable_decode_torch_compile:
            problems.append("LMDEPLOY_FAKE_CUDA_GRAPH_CAPTURE or LMDEPLOY_ENABLE_DECODE_TORCH_COMPILE is set: graphs would "
                            "not be CUDA graphs of the eager kernels")
        if type(runner.model).__name__ != "LlamaForCausalLM":
            problems.append(f"LMDeploy built {type(runner.model).__name__}; this runtime's policy is for LlamaForCausalLM")
        if type(runner).__name__ != "CUDAGraphRunner":
            problems.append(f"the model is wrapped in {type(runner).__name__}, not LMDeploy's CUDAGraphRunner")
        elif runner.backend_config.eager_mode != (self.resolved == "NONE"):
            problems.append(f"eager_mode={runner.backend_config.eager_mode} for a {self.resolved} engine")
        if getattr(runner, "_piecewise_graph_manager", None) is not None:
            problems.append("LMDeploy made piecewise prefill graphs for this model; this runtime's policy says "
                            "LlamaForCausalLM has none (policy.py)")
        declared = LmdeployPolicy().sizes(replace(policy, mode=FDO))  # computed by the runner in every mode
        if self.live_sizes != declared:
            problems.append(f"LMDeploy's graph runner computed capture batch sizes {self.live_sizes}; this runtime's "
                            f"policy declares {declared}")
        cache = agent.cache_config
        if (cache.kernel_block_size, cache.num_reserved_gpu_blocks) != (self.block_size, settings.RESERVED_BLOCKS):
            problems.append(f"KV blocks of {self.block_size} tokens in kernel blocks of {cache.kernel_block_size}, "
                            f"{cache.num_reserved_gpu_blocks} reserved: this runtime's block bookkeeping expects "
                            f"one kernel block a block and {settings.RESERVED_BLOCKS} reserved")
        if agent.model_config.dtype != getattr(torch, settings.DTYPE):
            problems.append(f"LMDeploy built the model in {agent.model_config.dtype}, not {settings.DTYPE}")
        shapes = sorted({tuple(t.shape[:2]) for layer in agent.cache_engine.gpu_cache for t in layer})
        if shapes != [(self.num_blocks, self.block_size)]:
            problems.append(f"KV cache tensors of leading shapes {shapes}; kv_snapshot() reads (blocks, block_size, "
                            f"...) = ({self.num_blocks}, {self.block_size}, ...)")
        if problems:
            raise EngineError(f"{self.label}: " + "; ".join(problems))

    # -- capture ------------------------------------------------------------------------------
    def capture(self) -> p.CaptureReport:
        import torch

        self.capture_once("in its warm-up")
        self.observer.start()  # the warm-up's forwards stay off the last step's record
        torch.cuda.synchronize()
        cached_memory_returned()
        free_before = torch.cuda.mem_get_info()[0]
        self.observer.capturing = True
        try:
            with settings.timed(f"capture {self.label}"), settings.process_state_restored(self.rng):
                start = time.perf_counter()
                self.executor.warmup()  # BaseModelAgent.warmup: a dummy prefill, then every decode size, largest first
                torch.cuda.synchronize()
                seconds = time.perf_counter() - start
        finally:
            self.observer.capturing = False
        self.observer.graphs_allowed = True
        cached_memory_returned()
        memory = max(0, free_before - torch.cuda.mem_get_info()[0])  # LMDeploy measures none; this is vLLM's measure
        keys = list(self.observer.capture_order)
        if len(keys) != len(self.runner._full_graph_runners):
            raise EngineError(f"{self.label}: the observer saw {len(keys)} captures, LMDeploy's runner holds "
                              f"{len(self.runner._full_graph_runners)} graphs")
        order = [("FULL", key[0] * key[3]) for key in keys]  # (padded batch, decoding, microbatch, query_len)
        self.captured = p.CaptureReport({"FULL": len(keys)} if keys else {}, seconds, int(memory), order)
        settings.event(f"captured {self.label}: {len(keys)} graphs in {seconds:.2f}s, {memory / 2**20:.1f} MiB; keys {keys}")
        return self.captured

    def _eager_runner(self, size: int):
        """LMDeploy's own runner of one graph (CUDASingleGraphRunner) in its fake-capture mode
        (LMDEPLOY_FAKE_CUDA_GRAPH_CAPTURE: `_use_graph` off): the graph's static buffers, padding and
        forward at `size` tokens, run eagerly, never captured. Kept per size by this runtime, apart
        from LMDeploy's graphs."""
        if size not in self._eager_runners:
            from lmdeploy.pytorch.backends.cuda.graph_runner.full_graph import CUDASingleGraphRunner

            runner = self.runner
            single = CUDASingleGraphRunner(
                runner.model, max_batches=size, max_tokens=runner.cudagraph_strategy.get_max_tokens(size, size, size),
                num_blocks=runner.num_blocks, is_decoding=True, decode_query_len=1, pool=None,
                model_config=runner.model_config, device=runner.device)
            single._use_graph = False

            def run(**kwargs):
                # A first call allocates the buffers and runs the forward (capture() without a graph).
                return single.forward(**kwargs) if single.meta.input_buffers else single.capture(**kwargs)

            self._eager_runners[size] = run
        return self._eager_runners[size]

    # -- steps --------------------------------------------------------------------------------
    def eager_step(self, requests, num_padded_tokens: int) -> p.StepResult:
        """The kit's eager step, padded only where LMDeploy pads: a decode step (one token a request)."""
        requests = list(requests)
        tokens = sum(len(r.token_ids) for r in requests)
        if num_padded_tokens != tokens and not (requests and all(len(r.token_ids) == 1 for r in requests)):
            raise ValueError(f"eager_step at {num_padded_tokens} tokens for a step of {tokens}: LMDeploy pads only a "
                             "decode step (one token a request) and runs every other step unpadded")
        return super().eager_step(requests, num_padded_tokens)

    # ScheduledEngine's step: plan, LMDeploy's forward on ModelInputs, logits read back, checked.
    def guarded(self):
        return settings.process_state_restored(self.rng)

    def prepare(self, planned):
        return is_decoding(planned)

    def forward(self, planned, decoding: bool):
        return (self._forward(self._model_inputs(planned, decoding)),)

    def check_step(self, record, planned, decoding: bool, ran) -> int:
        self._check(record, planned, decoding)
        return record.padded

    def _model_inputs(self, planned, decoding: bool):
        """The ModelInputs LMDeploy's scheduler would make for these requests
        (engine/inputs_maker.py, create_model_inputs), on the device."""
        import torch
        from lmdeploy.pytorch.model_inputs import ModelInputs

        q_len = [q.num_new for q in planned]
        history = [q.context_len for q in planned]
        kv_len = [q + h for q, h in zip(q_len, history)]
        offsets = torch.zeros((len(planned), max(len(q.blocks) for q in planned)), dtype=torch.int32)
        for row, q in enumerate(planned):
            offsets[row, :len(q.blocks)] = torch.tensor(q.blocks, dtype=torch.int32)
        inputs = ModelInputs(
            input_ids=torch.tensor([t for q in planned for t in q.new_tokens], dtype=torch.long)[None],
            seq_length=torch.tensor(q_len, dtype=torch.long), history_lengths=torch.tensor(history, dtype=torch.long),
            block_offsets=offsets, is_decoding=decoding, num_ignored_history=torch.zeros(len(planned), dtype=torch.long),
            max_q_seqlen=max(q_len), max_kv_seqlen=max(kv_len), sum_kv_seqlen=sum(kv_len))
        return inputs.to_device("cuda")

    def _forward(self, inputs):
        """One forward on the agent's stream, and the logits of every real token on the caller's."""
        import torch

        agent, caller = self.agent, torch.cuda.current_stream()
        agent.stream.wait_stream(caller)  # the inputs were copied on the caller's stream
        with agent.all_context(), torch.cuda.stream(agent.stream):
            output = self._loop.run_until_complete(agent.async_forward(inputs))
            logits = agent.get_logits(output["hidden_states"])[0]
            # Read below on the caller's stream before its memory goes back to the agent's. (Inside
            # inference mode: record_stream counts as an update, refused on an inference tensor outside it.)
            logits.record_stream(caller)
        caller.wait_stream(agent.stream)
        return logits.clone()  # a tensor of the caller's own, outside inference mode

    def _check(self, record, planned, decoding: bool) -> None:
        """Fail loudly where LMDeploy did not run what this runtime asked, or where it was misread."""
        problems = []
        if record.offered is None:
            problems.append("LMDeploy's graph runner made no graph-or-eager decision during the step")
        elif record.decoding != decoding:
            problems.append(f"LMDeploy saw a {'decoding' if record.decoding else 'prefill'} step; this runtime sent "
                            f"a {'decoding' if decoding else 'prefill'} one")
        if record.path == "FULL":
            key = record.key or ()
            if record.replayed_key != record.key or len(key) < 4 or record.padded != key[0] * key[3]:
                problems.append(f"LMDeploy computed graph key {record.key}, replayed the graph of {record.replayed_key} "
                                f"holding {record.padded} tokens")
        elif record.offered and record.declined is None and not record.captured:
            problems.append("LMDeploy chose its decode graph, but the forward took the eager path")
        elif record.padded is None:
            problems.append("no forward path of LMDeploy's graph runner ran")
        if not problems:
            slots = from_record(record, self.block_size, cut=True).slot_mapping()
            problems += [f"LMDeploy's buffers place {line}" for line in self.requests.misplaced(slots, rows_in_order(planned))]
        if problems:
            raise EngineError(f"{self.label}: " + "; ".join(problems))

    def close(self) -> None:
        """Give back what this engine holds: LMDeploy's own release (UniExecutor.release ->
        BaseModelAgent.release: the graph runner reset, the model and cache engine dropped, the
        allocator's cache emptied), then this runtime's references to them."""
        executor, self.executor = getattr(self, "executor", None), None
        if executor is None:
            return
        self.agent = self.runner = self.observer = self.last = None
        self._eager_runners.clear()
        with settings.timed(f"close {self.label}"), settings.process_state_restored(self.rng):
            executor.release()
        del executor
        cached_memory_returned()

    # -- inspection ---------------------------------------------------------------------------
    def static_buffer_addresses(self) -> dict[str, int]:
        """The KV cache every graph reads and writes (from the build), and each captured graph's
        own inputs (LMDeploy allocates them when it captures that graph)."""
        addresses = {f"kv.layer{i}.{j}": t.data_ptr() for i, layer in enumerate(self.agent.cache_engine.gpu_cache)
                     for j, t in enumerate(layer)}
        for key, graph in self.observer.graphs.items():
            for name, buffer in (graph.meta.input_buffers or {}).items():
                if hasattr(buffer, "data_ptr"):
                    addresses[f"graph{key[0] * key[3]}.{name}"] = buffer.data_ptr()
        return addresses

    def kv_snapshot(self):
        """Every KV slot of every layer, slot first, LMDeploy's reserved block left out:
        [(blocks - 1) * block_size, layers * tensors * heads * dim] (layout (blocks, block_size, heads, dim))."""
        import torch

        torch.cuda.synchronize()
        first = settings.RESERVED_BLOCKS
        slots = (self.num_blocks - first) * self.block_size
        parts = [t[first:].reshape(slots, -1) for layer in self.agent.cache_engine.gpu_cache for t in layer]
        return torch.cat(parts, dim=1).cpu()

    def slot_of(self, request_id: int, position: int) -> int:
        return self.requests.slot(request_id, position)

    def last_step_inputs(self) -> p.StepInputs:
        import torch

        seen = from_record(self.last_record(), self.block_size)
        slots = torch.tensor(seen.slot_mapping(), device=seen.token_ids.device)
        return p.StepInputs(seen.token_ids.clone(), seen.positions.clone(), slots, PADDING_SLOT, **seen.request_rows())

    def describe(self) -> dict:
        """LMDeploy's own live state for this engine (for logs)."""
        import lmdeploy

        runner, agent = self.runner, self.agent
        return {"requested": self.config.policy.mode, "resolved": self.resolved, "lmdeploy": lmdeploy.__version__,
                "runner": type(runner).__name__, "eager_mode": runner.backend_config.eager_mode,
                "enable_graph": getattr(runner.enable_graph, "__name__", str(runner.enable_graph)),
                "piecewise_manager": repr(getattr(runner, "_piecewise_graph_manager", None)),
                "capture_batch_sizes": self.live_sizes, "graph_keys": list(self.observer.capture_order),
                "model": type(runner.model).__name__, "dtype": str(agent.model_config.dtype),
                "block_size": self.block_size, "num_gpu_blocks": self.num_blocks,
                "reserved_blocks": agent.cache_config.num_reserved_gpu_blocks,
                "max_prefill_token_num": agent.cache_config.max_prefill_token_num,
                "kv_cache": [[tuple(t.shape) for t in layer] for layer in agent.cache_engine.gpu_cache[:1]],
                "kv_dtype": str(agent.cache_engine.gpu_cache[0][0].dtype)}


def build_executor(folder, engine_config):
    """LMDeploy's UniExecutor for a PytorchEngineConfig, as `Engine.__init__` makes it."""
    from lmdeploy.pytorch.engine.config_builder import ConfigBuilder
    from lmdeploy.pytorch.engine.executor import build_executor as lmdeploy_build_executor

    engine_config = ConfigBuilder.update_engine_config(engine_config)
    return lmdeploy_build_executor(
        str(folder), cache_config=ConfigBuilder.build_cache_config(engine_config),
        backend_config=ConfigBuilder.build_backend_config(engine_config),
        dist_config=ConfigBuilder.build_dist_config(engine_config),
        misc_config=ConfigBuilder.build_misc_config(engine_config), device_type="cuda",
        distributed_executor_backend="uni", dtype=engine_config.dtype)
