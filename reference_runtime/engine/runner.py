"""The model runner: pad, dispatch, and run a step eager, PIECEWISE or FULL.

Capture follows vLLM: an eager warm-up per size, PIECEWISE graphs before FULL ones, the
largest size first, every graph in one memory pool, the garbage collector frozen meanwhile.
After the capture phase no graph can be added. A step picks a graph through the dispatcher,
copies its data into the static buffers (a FULL graph does that copy as its first nodes),
replays, and returns a copy of the real rows.

What is not that path lives beside it: the memory budget (memory.py), the hooks the harness
uses to look inside (inspection.py), and compiling the pieces (compiled.py).
"""
from __future__ import annotations

import gc
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from harness.graphs import make_backend

from ..policy import CUDAGraphMode, Dispatcher, PolicyConfig, resolve_mode, weakest_support
from . import inspection
from .attention import make_backends
from .buffers import Request, StaticBuffers, plan_layout, query_len_if_uniform
from .kv_cache import BlockAllocator, KVCache
from .model import Decoder, load_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RunnerConfig:
    preset: str = "tiny"
    checkpoint: str | None = None  # a Hugging Face Llama folder; None: the preset's seeded weights
    dtype: str = "float32"
    device: str = "cpu"
    graph_backend: str = "emulated"  # "cuda" or "emulated"
    mode: str = "FULL_AND_PIECEWISE"  # requested; resolved against the attention backends
    attention_backends: tuple[str, ...] = ("static",)
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(max_num_seqs=16, max_num_batched_tokens=64))
    seed: int = 0
    block_size: int = 16
    num_blocks: int = 256  # ignored when gpu_memory_utilization sizes the cache
    gpu_memory_utilization: float | None = None  # CUDA: size the KV cache from this share of the device
    max_model_len: int = 128
    debug: bool = False  # check graph input addresses on every replay, not only the first
    compile: bool = False  # torch.compile the pieces (Inductor, without its own graphs)
    data_parallel: tuple[int, int] | None = None  # (rank, world): steps agree across ranks (data_parallel.py)


@dataclass
class StepOutput:
    logits: torch.Tensor  # [real tokens, vocab], a copy the caller owns
    runtime_mode: str
    num_tokens: int
    padded_num_tokens: int


@dataclass
class CaptureSummary:
    graphs: dict[str, int]
    seconds: float
    memory_bytes: int | None
    pool_stats: dict
    order: list[tuple[str, int]]
    backend: str
    estimate_bytes: int | None = None  # what the memory budget set aside before capture


class ModelRunner:
    def __init__(self, config: RunnerConfig):
        if config.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.graphs = make_backend(config.graph_backend, self.device, debug=config.debug)
        self.model = Decoder.from_weights(*load_weights(config.checkpoint, config.preset, config.seed))
        self.model = self.model.to(self.device, self.dtype).eval()
        if config.max_model_len > self.model.max_positions:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {self.model.max_positions} positions")
        # With a memory budget the cache is sized after the graph estimate (memory.py); until then a minimal one.
        self.num_blocks = 2 if config.gpu_memory_utilization is not None else config.num_blocks
        self.cache = KVCache(self.model.num_layers, self.num_blocks, config.block_size, self.model.kv_heads,
                             self.model.head_dim, self.dtype, self.device)
        self.backends = make_backends(config.attention_backends, self.model.num_layers, self.cache,
                                      self.model.head_dim ** -0.5)
        support = weakest_support(b.support for b in self.backends)
        self.resolution = resolve_mode(config.mode, support, num_speculative_tokens=config.policy.num_speculative_tokens)
        for message in self.resolution.warnings:
            warnings.warn(message, stacklevel=2)
        self.policy = replace(config.policy, mode=self.resolution.resolved)
        self.q = self.policy.query_len
        self.dispatcher = Dispatcher(self.policy)
        self.dispatcher.initialize_keys()
        max_tokens = max(self.dispatcher.table.max_size if self.dispatcher.table else 0, self.policy.batched_tokens)
        self.max_rows = max_tokens + 1  # a dummy row for padding beyond the real requests
        self.buffers = StaticBuffers(max_tokens, self.max_rows, -(-config.max_model_len // config.block_size),
                                     config.max_model_len, self.device)
        self.attn_buffer = torch.zeros(max_tokens, self.model.heads * self.model.head_dim, dtype=self.dtype,
                                       device=self.device)
        if config.compile:
            from .compiled import compiled_pieces

            self.pieces = compiled_pieces(self.model)
        else:
            self.pieces = self.model
        self.full_graphs: dict = {}
        self.piece_graphs: dict[int, list] = {}
        self.capture_summary: CaptureSummary | None = None
        self.graph_memory_estimate: int | None = None
        self.allocator = BlockAllocator(self.num_blocks, config.block_size)
        self.last_layout = None
        self._dispatched: dict[tuple[int, int, bool], tuple] = {}  # see _dispatch
        self.data_parallel = None
        if config.data_parallel is not None:
            from .data_parallel import DataParallel

            self.data_parallel = DataParallel(*config.data_parallel, self.device)
        if config.gpu_memory_utilization is not None:
            from .memory import size_kv_cache

            size_kv_cache(self, config.gpu_memory_utilization)

    # -- forward paths ----------------------------------------------------------------------
    def _attention(self, meta):
        return lambda layer, q, k, v: self.backends[layer](layer, q, k, v, meta)

    # The eager paths build no autograd state. A FULL replay runs no torch op on the host, so the step
    # itself does not enter the mode (a few microseconds of a step at batch 1).
    @torch.inference_mode()
    def _forward(self, meta) -> torch.Tensor:
        n = meta.num_tokens
        return self.model.forward(self.buffers.input_ids[:n], self.buffers.positions[:n], self._attention(meta),
                                  pieces=self.pieces)

    @torch.inference_mode()
    def _run_pieces(self, meta) -> torch.Tensor:
        """Replay each piece; attention runs eagerly in between, into the static attention buffer."""
        n, graphs = meta.num_tokens, self.piece_graphs[meta.num_tokens]
        inputs = lambda: self.graph_inputs(with_attention=True)  # noqa: E731 - built only when checked, as FULL's
        graphs[0].replay(inputs)
        for layer, graph in enumerate(graphs[1:]):
            _, q, k, v = graphs[layer].output
            self.attn_buffer[:n].copy_(self.backends[layer](layer, q, k, v, meta))
            graph.replay(inputs)
        return graphs[-1].output

    def graph_inputs(self, with_attention: bool = False) -> dict[str, torch.Tensor]:
        """The static inputs graphs read, by name (pieces also read the attention buffer)."""
        inputs = self.buffers.tensors()
        return inputs | {"attn": self.attn_buffer} if with_attention else inputs

    # -- capture ----------------------------------------------------------------------------
    def capture(self) -> CaptureSummary:
        if self.capture_summary is not None:
            raise RuntimeError("graphs are already captured; the capture phase is over")
        order = []
        start = time.perf_counter()
        with self.capture_phase():
            for mode, keys in self.dispatcher.capture_keys():
                for key in keys:
                    self.capture_key(mode, key)
                    order.append((mode.name, key.num_tokens))
        self.graphs.close_capture_phase()
        seconds = time.perf_counter() - start
        pool = self.graphs.pool_stats()
        # What the graphs' pools hold. Not free device memory before minus after (vLLM's figure):
        # the driver can hand back a block it kept, and free memory then does not move.
        memory = pool["bytes"]
        counts = {"FULL": len(self.full_graphs), "PIECEWISE": sum(len(g) for g in self.piece_graphs.values())}
        self.capture_summary = CaptureSummary(counts, seconds, memory, pool, order, self.graphs.name,
                                              self.graph_memory_estimate)
        return self.capture_summary

    def capture_key(self, mode, key) -> None:
        if mode is CUDAGraphMode.PIECEWISE:
            self._capture_pieces(key.num_tokens)
        else:
            self._capture_full(key)

    @contextmanager
    def capture_phase(self):
        # No collection during capture: a finalizer run mid-capture could free or allocate device
        # memory inside a graph's recording. Freezing and disabling is enough for that; collecting
        # the garbage first (as vLLM does) would only free memory sooner, at a tenth of a second
        # per capture phase in a process holding torch.
        gc.freeze()
        gc.disable()
        try:
            with torch.inference_mode():
                yield
        finally:
            gc.enable()
            gc.unfreeze()

    def _load_dummy(self, num_tokens: int, uniform: bool):
        layout = plan_layout([], self.allocator, num_tokens, self.q, self.max_rows, uniform=uniform)
        self.buffers.load(layout)
        return layout

    def _capture_pieces(self, n: int) -> None:
        meta = self.buffers.metadata(self._load_dummy(n, uniform=False))
        self._forward(meta)  # warm-up
        ids, pos, attn = self.buffers.input_ids[:n], self.buffers.positions[:n], self.attn_buffer[:n]
        inputs = self.graph_inputs(with_attention=True)
        graphs = [self.graphs.capture(lambda: self.pieces.first_piece(ids, pos), static_inputs=inputs,
                                      name=f"PIECEWISE n={n} piece 0")]
        for index in range(1, self.model.num_layers):
            hidden = graphs[-1].output[0]
            graphs.append(self.graphs.capture(lambda i=index, h=hidden: self.pieces.middle_piece(i, h, attn, pos),
                                              static_inputs=inputs, name=f"PIECEWISE n={n} piece {index}"))
        hidden = graphs[-1].output[0]
        graphs.append(self.graphs.capture(lambda: self.pieces.last_piece(hidden, attn), static_inputs=inputs,
                                          name=f"PIECEWISE n={n} piece {self.model.num_layers}"))
        self.piece_graphs[n] = graphs

    def _capture_full(self, key) -> None:
        layout = self._load_dummy(key.num_tokens, uniform=key.uniform)
        meta = self.buffers.metadata(layout)
        self._forward(meta)  # warm-up
        staged = self.buffers.stage(layout, rows=self.full_rows(key))

        def step():  # the graph copies its inputs in itself (buffers.py)
            self.buffers.transfer(staged)
            return self._forward(meta)
        self.full_graphs[key] = self.graphs.capture(step, static_inputs=self.graph_inputs(), name=f"FULL {key}")

    def full_rows(self, key) -> int:
        """The request rows a FULL graph copies in, fixed at capture: n / q in a uniform layout; in a
        mixed one at most a row per token and the padding's dummy row."""
        n = key.num_tokens
        return n // self.q if key.uniform else min(n + 1, self.max_rows)

    # -- steps ------------------------------------------------------------------------------
    def step(self, requests: list[Request], padding_fill: str | None = None) -> StepOutput:
        """Pad, dispatch and run one step as in service."""
        n = sum(len(r.token_ids) for r in requests)
        uniform = query_len_if_uniform(requests, self.q) is not None
        if self.data_parallel is not None:  # the ranks agree first (an idle rank runs padding rows only)
            mode, key = self.data_parallel.dispatch(self.dispatcher, n, len(requests), uniform,
                                                    captured=self.capture_summary is not None)
            size = key.num_tokens
        else:
            mode, key = self._dispatch(n, len(requests), uniform)
            if mode is not CUDAGraphMode.NONE and self.capture_summary is None:
                mode = CUDAGraphMode.NONE  # nothing captured yet: run eager, unpadded
            size = key.num_tokens if mode is not CUDAGraphMode.NONE else n
        layout_uniform = key.uniform if mode is CUDAGraphMode.FULL else None
        return self._run(requests, mode, size, layout_uniform, key, padding_fill)

    def _dispatch(self, num_tokens: int, num_reqs: int, uniform: bool):
        """The dispatcher's answer for a batch of this shape. Its keys are fixed when the runner is
        built (initialize_keys), so each shape is looked up once (at batch 1 the lookup was a tenth
        of the step's host time)."""
        shape = (num_tokens, num_reqs, uniform)
        answer = self._dispatched.get(shape)
        if answer is None:
            answer = self.dispatcher.dispatch(num_tokens, num_reqs, uniform)
            if len(self._dispatched) < 4096:  # a bound for long services of mixed batches
                self._dispatched[shape] = answer
        return answer

    def eager_step(self, requests: list[Request], padded_num_tokens: int) -> StepOutput:
        """The same step run eagerly at a given padded size, with the layout a graph there would use."""
        n = sum(len(r.token_ids) for r in requests)
        uniform = query_len_if_uniform(requests, self.q) is not None
        mode, key = self.dispatcher.dispatch(n, len(requests), uniform)
        layout_uniform = key.uniform if mode is CUDAGraphMode.FULL and key.num_tokens == padded_num_tokens else None
        return self._run(requests, CUDAGraphMode.NONE, padded_num_tokens, layout_uniform, None)

    def _run(self, requests, mode, size, layout_uniform, key, padding_fill=None) -> StepOutput:
        if mode is CUDAGraphMode.FULL and padding_fill is None and key.uniform:
            # A decode step like the last one: update the layout and rows it kept (buffers.py).
            layout = self.buffers.restage(requests, self.allocator, size, self.full_rows(key))
            if layout is not None:
                self.last_layout = layout
                return self._execute(layout, mode, key)
        layout = plan_layout(list(requests), self.allocator, size, self.q, self.max_rows, uniform=layout_uniform)
        if padding_fill is None:
            return self._load_and_execute(layout, mode, key)
        with inspection.padding_filled(self, layout, padding_fill) as filled:
            return self._load_and_execute(filled, mode, key)

    def _load_and_execute(self, layout, mode, key) -> StepOutput:
        if mode is CUDAGraphMode.FULL:
            self.buffers.stage(layout, rows=self.full_rows(key))  # the graph's first nodes copy it in
        else:
            self.buffers.load(layout)
        self.last_layout = layout
        return self._execute(layout, mode, key)

    def _execute(self, layout, mode, key) -> StepOutput:
        n = layout.num_real_tokens
        if mode is CUDAGraphMode.FULL:
            graph = self.full_graphs[key]
            graph.replay(self.graph_inputs)  # built only when the addresses are checked
            logits = graph.output
        elif mode is CUDAGraphMode.PIECEWISE:
            logits = self._run_pieces(self.buffers.metadata(layout))
        else:
            logits = self._forward(self.buffers.metadata(layout))
        return StepOutput(logits[:n].clone(), mode.name, n, layout.num_tokens)

    def release(self, request_id: int) -> None:
        self.allocator.release(request_id)
