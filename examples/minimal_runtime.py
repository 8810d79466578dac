"""A complete minimal runtime: a tiny model, its own bucket policy, static input buffers and one
FULL graph per bucket, held to the same suites as any engine. Copy it to start your own.

    pytest suites/ --runtime examples.minimal_runtime:MinimalRuntime

Policy: buckets are the powers of two up to max_num_seqs (not vLLM's grid); a batch pads up to
the smallest that holds it, and runs eager above the largest. A graph is keyed by its padded
token count alone. Only FULL graphs: PIECEWISE resolves to NONE and FULL_AND_PIECEWISE to FULL.
Model: token embedding + position embedding, a few residual MLP blocks, an output head. No
attention, so no KV cache: a token's logits depend on its id and position only.
(examples/bucket_engine is the whole thing: a Llama from a checkpoint, a KV cache, q > 1.)
"""
from __future__ import annotations

import bisect
import time
import warnings
from dataclasses import replace

import torch

from harness.expectations import presets
from harness.graphs import emulator
from harness.protocol import (Capabilities, CaptureReport, Descriptor, Dispatch, EngineConfig, PolicyConfig,
                              Resolution, StepResult)
from harness.vocabulary import ROUTINES


class MinimalRuntime:
    name = "minimal"
    version = "2.0"
    # Only what is true: its own buckets (no vLLM rules), no attention backends, no KV cache to inspect.
    capabilities = Capabilities(
        capture_sizes=True, dispatch=True, execution=True, graph_backends=("emulated", "cuda"),
        padding_fills=("zeros", "random"), notes="powers-of-two buckets up to max_num_seqs, FULL graphs only")

    def capture_sizes(self, config: PolicyConfig) -> list[int]:
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if "FULL" not in ROUTINES[config.mode]:
            return []  # a mode without FULL graphs captures nothing
        limit = min(config.max_num_seqs, config.max_num_batched_tokens or 8192)
        return [1 << k for k in range(limit.bit_length())]

    def padded_size(self, config: PolicyConfig, num_real_tokens: int) -> int | None:
        sizes = self.capture_sizes(config)
        index = bisect.bisect_left(sizes, num_real_tokens)
        return sizes[index] if index < len(sizes) else None  # None: eager

    def dispatch(self, config: PolicyConfig, num_real_tokens: int, num_real_rows=None, uniform=False) -> Dispatch:
        routine = ROUTINES[config.mode][0 if uniform else 1]  # (uniform decode batches, all others)
        size = self.padded_size(config, num_real_tokens) if routine == "FULL" else None
        return Dispatch("FULL", Descriptor(size)) if size else Dispatch("NONE", Descriptor(num_real_tokens))

    def build(self, config: EngineConfig) -> "MinimalEngine":
        return MinimalEngine(self, config)


class MinimalEngine:
    BLOCKS = 6  # enough work that one graph launch clearly beats its eager ops

    def __init__(self, runtime: MinimalRuntime, config: EngineConfig):
        self.runtime, self.device = runtime, torch.device(config.device)
        self.cg = torch.cuda if self.device.type == "cuda" else emulator  # the one line that differs
        requested = config.policy.mode
        resolved = {"PIECEWISE": "NONE", "FULL_AND_PIECEWISE": "FULL"}.get(requested, requested)
        why = () if resolved == requested else (f"{requested} resolved to {resolved}: only FULL graphs here",)
        for message in why:
            warnings.warn(message, stacklevel=2)
        self.resolution = Resolution(requested, resolved, why)
        self.policy = replace(config.policy, mode=resolved)
        self.sizes = runtime.capture_sizes(self.policy)
        shape, self.length = presets.preset(config.preset), config.max_model_len
        g = torch.Generator().manual_seed(config.seed)

        def weight(*size):
            return (torch.randn(*size, generator=g) / size[-1] ** 0.5).to(self.device, getattr(torch, config.dtype))

        self.embed, self.pos = weight(shape.vocab, shape.hidden), weight(self.length, shape.hidden)
        self.blocks = [(weight(shape.hidden, shape.hidden), weight(shape.hidden, shape.hidden))
                       for _ in range(self.BLOCKS)]
        self.head, self.vocab = weight(shape.vocab, shape.hidden), shape.vocab
        # Static inputs, sized for the largest step: graphs read them by address.
        most = max(self.sizes + [self.policy.max_num_batched_tokens or 8192])
        self.token_ids = torch.zeros(most, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(most, dtype=torch.long, device=self.device)
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, its output buffer)
        self.captured = False

    def forward(self, num_padded_tokens: int) -> torch.Tensor:
        h = self.embed[self.token_ids[:num_padded_tokens]] + self.pos[self.positions[:num_padded_tokens]]
        for up, down in self.blocks:
            h = h + torch.nn.functional.gelu(h @ up.T) @ down.T
        return h @ self.head.T

    def load(self, requests, size: int, padding_fill: str | None = None) -> None:
        """Copy the step's tokens into the static buffers (copy_, never a new tensor), padded to size."""
        ids = [t for r in requests for t in r.token_ids]
        positions = [r.context_len + j for r in requests for j in range(len(r.token_ids))]
        if any(p >= self.length for p in positions):
            raise ValueError(f"a request is longer than max_model_len {self.length}")
        pad = size - len(ids)
        if padding_fill == "random":
            g = torch.Generator().manual_seed(pad)
            ids += torch.randint(0, self.vocab, (pad,), generator=g).tolist()
            positions += torch.randint(0, self.length, (pad,), generator=g).tolist()
        elif padding_fill in (None, "zeros"):
            ids, positions = ids + [0] * pad, positions + [0] * pad
        else:
            raise ValueError(f"padding_fill must be 'zeros' or 'random', got {padding_fill!r}")
        self.token_ids[:size].copy_(torch.tensor(ids))
        self.positions[:size].copy_(torch.tensor(positions))

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        if self.captured:
            raise RuntimeError("graphs are captured once; the capture phase is over")
        self.captured, start, free = True, time.perf_counter(), self.free_memory()
        pool = self.cg.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first, one pool: smaller graphs reuse its memory
            self.load([], size)
            self.forward(size)  # warm up eagerly before capture
            graph = self.cg.CUDAGraph()
            with self.cg.graph(graph, pool=pool):
                output = self.forward(size)
            self.graphs[size] = (graph, output)
        memory = free - self.free_memory() if free is not None else sum(g.held_bytes for g, _ in self.graphs.values())
        return CaptureReport({"FULL": len(self.graphs)}, time.perf_counter() - start, memory,
                             tuple(("FULL", size) for size in reversed(self.sizes)))

    def free_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None  # on the CPU the emulated graphs say what they hold
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]

    @torch.inference_mode()
    def step(self, requests, padding_fill: str | None = None) -> StepResult:
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        uniform = bool(requests) and all(len(r.token_ids) == 1 for r in requests)
        chosen = self.runtime.dispatch(self.policy, num_real_tokens, len(requests), uniform)
        graph = self.graphs.get(chosen.descriptor.num_padded_tokens) if chosen.runtime_mode == "FULL" else None
        size = chosen.descriptor.num_padded_tokens if graph else num_real_tokens  # before capture, eager and unpadded
        self.load(requests, size, padding_fill)
        if graph is None:
            return StepResult(self.forward(num_real_tokens), "NONE", num_real_tokens, num_real_tokens)
        graph[0].replay()
        return StepResult(graph[1][:num_real_tokens].clone(), "FULL", num_real_tokens, size)  # a copy: the next replay overwrites

    @torch.inference_mode()
    def eager_step(self, requests, num_padded_tokens: int) -> StepResult:
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        self.load(requests, num_padded_tokens)
        return StepResult(self.forward(num_padded_tokens)[:num_real_tokens].clone(), "NONE", num_real_tokens, num_padded_tokens)

    def release(self, request_id: int) -> None:
        pass  # no KV cache: nothing to free

    def static_buffer_addresses(self) -> dict[str, int]:
        return {"token_ids": self.token_ids.data_ptr(), "positions": self.positions.data_ptr()}
