"""The model runner: pad, dispatch, and run a step eager, PIECEWISE or FULL.

Capture follows vLLM: an eager warm-up per size, PIECEWISE graphs before FULL ones, the
largest size first, every graph in one memory pool, the garbage collector frozen meanwhile.
After the capture phase no graph can be added. A step copies its data into the static buffers,
picks a graph through the dispatcher, replays it, and returns a copy of the real rows.
"""
from __future__ import annotations

import gc
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from ..graphs import make_backend
from ..policy import CUDAGraphMode, Dispatcher, PolicyConfig, resolve_mode, weakest_support
from .attention import make_backends
from .buffers import Request, StaticBuffers, plan_layout, query_len_if_uniform
from .kv_cache import BlockAllocator, KVCache
from .model import Decoder, seeded_hf_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RunnerConfig:
    preset: str = "tiny"
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
        self.graphs = make_backend(config.graph_backend, self.device)
        self.graphs.debug = config.debug
        hf = seeded_hf_model(config.preset, config.seed)
        self.model = Decoder.from_hf(hf).to(self.device, self.dtype).eval()
        if config.max_model_len > self.model.max_positions:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {self.model.max_positions} positions")
        sized_by_memory = config.gpu_memory_utilization is not None
        if sized_by_memory and self.device.type != "cuda":
            raise ValueError("gpu_memory_utilization sizes the KV cache from device memory; it needs device='cuda'")
        if sized_by_memory and not 0 < config.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {config.gpu_memory_utilization}")
        # With a memory budget the cache is sized after the graph estimate; until then a minimal one.
        self.num_blocks = 2 if sized_by_memory else config.num_blocks
        self.cache = KVCache(self.model.num_layers, self.num_blocks, config.block_size, self.model.kv_heads,
                             self.model.head_dim, self.dtype, self.device)
        self.backends = make_backends(config.attention_backends, self.model.num_layers, self.cache,
                                      self.model.head_dim ** -0.5)
        support = weakest_support(b.support for b in self.backends)
        self.resolution = resolve_mode(config.mode, support,
                                       num_speculative_tokens=config.policy.num_speculative_tokens)
        for message in self.resolution.warnings:
            warnings.warn(message, stacklevel=2)
        self.mode = self.resolution.resolved
        policy = replace(config.policy, mode=self.mode)
        self.policy = policy
        self.q = policy.query_len
        self.dispatcher = Dispatcher(policy)
        self.dispatcher.initialize_keys()
        max_tokens = max(self.dispatcher.table.max_size if self.dispatcher.table else 0, policy.batched_tokens)
        self.max_rows = max_tokens + 1  # a dummy row for padding beyond the real requests
        self.buffers = StaticBuffers(max_tokens, self.max_rows, -(-config.max_model_len // config.block_size),
                                     config.max_model_len, self.device)
        attn_width = self.model.heads * self.model.head_dim
        self.attn_buffer = torch.zeros(max_tokens, attn_width, dtype=self.dtype, device=self.device)
        self.pieces = self._compiled_pieces() if config.compile else self.model
        self.full_graphs: dict = {}
        self.piece_graphs: dict[int, list] = {}
        self.capture_summary: CaptureSummary | None = None
        self.graph_memory_estimate: int | None = None
        self.allocator = BlockAllocator(self.num_blocks, config.block_size)
        if sized_by_memory:
            self._size_kv_cache(config.gpu_memory_utilization)
            self.allocator = BlockAllocator(self.num_blocks, config.block_size)

    # -- memory budget (vLLM: KV cache = budget - model and activations - graph estimate) ------
    def _size_kv_cache(self, utilization: float) -> None:
        self.graph_memory_estimate = self._estimate_graph_memory()
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free  # the model, buffers and the allocator's cache so far
        per_block = self.cache.data[:, :, : self.config.block_size].numel() * self.cache.data.element_size()
        available = int(utilization * total) - used - self.graph_memory_estimate
        blocks = available // per_block
        if blocks < 2:
            raise ValueError(
                f"no memory left for the KV cache: {utilization:.0%} of {total / 2**30:.1f} GiB minus "
                f"{used / 2**30:.2f} GiB in use and a {self.graph_memory_estimate / 2**30:.2f} GiB graph estimate "
                f"leaves {available / 2**30:.2f} GiB; raise gpu_memory_utilization or shrink the capture sizes"
            )
        self.num_blocks = int(blocks)
        self.cache = KVCache(self.model.num_layers, self.num_blocks, self.config.block_size, self.model.kv_heads,
                             self.model.head_dim, self.dtype, self.device)
        for backend in self.backends:
            backend.cache = self.cache

    def _estimate_graph_memory(self) -> int:
        """Capture the two largest keys of each mode in a throwaway pool; extrapolate the rest.

        The largest costs what it costs; each further graph is charged what the second one added
        (smaller graphs reuse the larger one's blocks), with vLLM's 1 MiB floor per graph.
        """
        real, self.graphs = self.graphs, make_backend("cuda", self.device)
        estimate = 0
        try:
            with self._capture_phase():
                for mode, keys in self.dispatcher.capture_keys():
                    deltas = []
                    for key in keys[:2]:
                        before = self._free_memory()
                        self._capture_key(mode, key)
                        deltas.append(before - self._free_memory())
                    per_graph = max(deltas[-1], 2**20)
                    estimate += deltas[0] + per_graph * (len(keys) - 1)
        finally:
            self.graphs, self.full_graphs, self.piece_graphs = real, {}, {}
            gc.collect()
            torch.cuda.empty_cache()
        return estimate

    # -- forward paths ----------------------------------------------------------------------
    def _attention(self, meta):
        return lambda layer, q, k, v: self.backends[layer](layer, q, k, v, meta)

    def _forward(self, meta) -> torch.Tensor:
        n = meta.num_tokens
        return self.model.forward(self.buffers.input_ids[:n], self.buffers.positions[:n], self._attention(meta),
                                  pieces=self.pieces)

    def _run_pieces(self, meta) -> torch.Tensor:
        """Replay each piece; attention runs eagerly in between, into the static attention buffer."""
        n, graphs = meta.num_tokens, self.piece_graphs[meta.num_tokens]
        inputs = self.buffers.tensors() | {"attn": self.attn_buffer}
        graphs[0].replay(inputs)
        for layer, graph in enumerate(graphs[1:]):
            _, q, k, v = graphs[layer].output
            self.attn_buffer[:n].copy_(self.backends[layer](layer, q, k, v, meta))
            graph.replay(inputs)
        return graphs[-1].output

    def _compiled_pieces(self):
        """Compilation is its own axis (SPEC 2): Inductor fuses each piece; graphs still submit them."""
        import types

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * self.model.num_layers)
        options = {"triton.cudagraphs": False}
        return types.SimpleNamespace(**{
            name: torch.compile(getattr(self.model, name), dynamic=False, options=options)
            for name in ("first_piece", "middle_piece", "last_piece")
        })

    # -- capture ----------------------------------------------------------------------------
    def capture(self) -> CaptureSummary:
        if self.capture_summary is not None:
            raise RuntimeError("graphs are already captured; the capture phase is over")
        order, free_before = [], self._free_memory()
        start = time.perf_counter()
        with self._capture_phase():
            for mode, keys in self.dispatcher.capture_keys():
                for key in keys:
                    self._capture_key(mode, key)
                    order.append((mode.name, key.num_tokens))
        self.graphs.close_capture_phase()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        free_after = self._free_memory()
        memory = None if free_before is None else free_before - free_after
        counts = {"FULL": len(self.full_graphs), "PIECEWISE": sum(len(g) for g in self.piece_graphs.values())}
        self.capture_summary = CaptureSummary(counts, seconds, memory, self.graphs.pool_stats(), order,
                                              self.graphs.name, self.graph_memory_estimate)
        return self.capture_summary

    def _capture_key(self, mode, key) -> None:
        if mode is CUDAGraphMode.PIECEWISE:
            self._capture_pieces(key.num_tokens)
        else:
            self._capture_full(key)

    @contextmanager
    def _capture_phase(self):
        # Objects freed mid-capture could hand their memory to a graph; freeze the collector.
        gc.collect()
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
        layout = self._load_dummy(n, uniform=False)
        meta = self.buffers.metadata(layout)
        self._forward(meta)  # warm-up
        ids, pos, attn = self.buffers.input_ids[:n], self.buffers.positions[:n], self.attn_buffer[:n]
        inputs = self.buffers.tensors() | {"attn": self.attn_buffer}
        graphs = [self.graphs.capture(lambda: self.pieces.first_piece(ids, pos), static_inputs=inputs,
                                      name=f"PIECEWISE n={n} piece 0")]
        for index in range(1, self.model.num_layers):
            hidden = graphs[-1].output[0]
            graphs.append(self.graphs.capture(
                lambda i=index, h=hidden: self.pieces.middle_piece(i, h, attn, pos),
                static_inputs=inputs, name=f"PIECEWISE n={n} piece {index}"))
        hidden = graphs[-1].output[0]
        graphs.append(self.graphs.capture(lambda: self.pieces.last_piece(hidden, attn), static_inputs=inputs,
                                          name=f"PIECEWISE n={n} piece {self.model.num_layers}"))
        self.piece_graphs[n] = graphs

    def _capture_full(self, key) -> None:
        layout = self._load_dummy(key.num_tokens, uniform=key.uniform)
        meta = self.buffers.metadata(layout)
        self._forward(meta)  # warm-up
        self.full_graphs[key] = self.graphs.capture(lambda: self._forward(meta), static_inputs=self.buffers.tensors(),
                                                    name=f"FULL {key}")

    def _free_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.mem_get_info(self.device)[0]

    # -- steps ------------------------------------------------------------------------------
    def step(self, requests: list[Request], padding_fill: str | None = None) -> StepOutput:
        """Pad, dispatch and run one step as in service."""
        n = sum(len(r.token_ids) for r in requests)
        uniform = query_len_if_uniform(requests, self.q) is not None
        mode, key = self.dispatcher.dispatch(n, len(requests), uniform)
        if mode is not CUDAGraphMode.NONE and self.capture_summary is None:
            mode = CUDAGraphMode.NONE  # nothing captured yet: run eager, unpadded
        size = key.num_tokens if mode is not CUDAGraphMode.NONE else n
        layout_uniform = key.uniform if mode is CUDAGraphMode.FULL else None
        return self._run(requests, mode, size, layout_uniform, key, padding_fill)

    def eager_step(self, requests: list[Request], padded_num_tokens: int) -> StepOutput:
        """The same step run eagerly at a given padded size, with the layout a graph there would use."""
        n = sum(len(r.token_ids) for r in requests)
        uniform = query_len_if_uniform(requests, self.q) is not None
        mode, key = self.dispatcher.dispatch(n, len(requests), uniform)
        layout_uniform = key.uniform if mode is CUDAGraphMode.FULL and key.num_tokens == padded_num_tokens else None
        return self._run(requests, CUDAGraphMode.NONE, padded_num_tokens, layout_uniform, None)

    @torch.inference_mode()
    def _run(self, requests, mode, size, layout_uniform, key, padding_fill=None) -> StepOutput:
        n = sum(len(r.token_ids) for r in requests)
        layout = plan_layout(list(requests), self.allocator, size, self.q, self.max_rows, uniform=layout_uniform)
        self.buffers.load(layout)
        with self._padding_filled(layout, padding_fill):
            return self._execute(layout, mode, key, n)

    def _execute(self, layout, mode, key, n) -> StepOutput:
        size = layout.num_tokens
        meta = self.buffers.metadata(layout)
        if mode is CUDAGraphMode.FULL:
            graph = self.full_graphs[key]
            graph.replay(self.buffers.tensors())
            logits = graph.output
        elif mode is CUDAGraphMode.PIECEWISE:
            logits = self._run_pieces(meta)
        else:
            logits = self._forward(meta)
        return StepOutput(logits[:n].clone(), mode.name, n, size)

    PADDING_FILLS = ("zeros", "random", "nan", "inf")

    @contextmanager
    def _padding_filled(self, layout, fill: str | None):
        """Put other values in the padded rows: real rows must not change (SPEC 7, invariant 2).

        Token ids and positions of padded rows get zeros or random valid values; for "nan" and
        "inf" the null block and the scratch slot, which only padded rows read, are poisoned too.
        The slot mapping stays -1: padded rows must still write nothing.
        """
        n, size = layout.num_real_tokens, layout.num_tokens
        if fill is None or size == n:
            yield
            return
        if fill not in self.PADDING_FILLS:
            raise ValueError(f"padding_fill must be one of {', '.join(self.PADDING_FILLS)}, got {fill!r}")
        generator = torch.Generator().manual_seed(size)
        pad = size - n
        if fill == "zeros":
            ids = positions = torch.zeros(pad, dtype=torch.long)
        else:
            ids = torch.randint(0, self.model.vocab, (pad,), generator=generator)
            positions = torch.randint(0, self.config.max_model_len, (pad,), generator=generator)
        self.buffers.input_ids[n:size].copy_(ids)
        self.buffers.positions[n:size].copy_(positions)
        poisoned = self.cache.data[:, :, : self.config.block_size]  # the null block
        if fill in ("nan", "inf"):
            value = float(fill)
            poisoned.fill_(value)
            self.cache.data[:, :, self.cache.scratch_slot].fill_(value)
        try:
            yield
        finally:
            if fill in ("nan", "inf"):
                poisoned.zero_()
                self.cache.data[:, :, self.cache.scratch_slot].zero_()

    def release(self, request_id: int) -> None:
        self.allocator.release(request_id)

    def kv_snapshot(self) -> torch.Tensor:
        """Every real slot, slot first: [slots, layers, k/v, kv_heads, head_dim]."""
        return self.cache.real_blocks().permute(2, 0, 1, 3, 4).clone()

    def launch_counts(self) -> dict[str, int]:
        """Operations one step submits, per runtime mode, as far as this backend can count them."""
        counts = {"input_copies": 1}
        if self.full_graphs:
            counts["FULL_graph_launches"] = 1
            counts["FULL_ops_in_graph"] = next(iter(self.full_graphs.values())).num_ops
        if self.piece_graphs:
            counts["PIECEWISE_graph_launches"] = self.model.num_layers + 1
        return counts
