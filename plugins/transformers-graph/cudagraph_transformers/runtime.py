"""Runtimes over transformers' LlamaForCausalLM + StaticCache: eager, a manual CUDA graph of
the decode step, and torch.compile(mode="reduce-overhead").

Their bucket policy is their own: StaticCache fixes the batch at max_num_seqs rows, so every
decode step runs all rows, one bucket. They declare that, not vLLM's grid.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from harness.protocol import Capabilities, Resolution

KNOWN_FAILURES = Path(__file__).with_name("known_failures.toml")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class _TransformersRuntime:
    graph: str | None = None
    version = "0.1.0"
    # What a requested mode becomes here; everything else warns.
    modes = {"NONE": "NONE"}

    def __init__(self):
        import transformers

        self.version = f"0.1.0 (transformers {transformers.__version__})"
        needs_cuda = self.graph is not None
        runs = not needs_cuda or _cuda()
        self.capabilities = Capabilities(
            capture_sizes=True,
            loads_checkpoint=True,
            execution=runs,
            graph_backends=(("cuda",) if needs_cuda else ("emulated", "cuda")) if runs else (),
            address_checks=self.graph == "manual",
            lazy_capture=self.graph == "compile",  # graph trees record while serving
            outputs_alias_graph_buffers=False,
            notes=("StaticCache: one row per request, all rows every step, one write offset for every row; "
                   + ("no CUDA device here: no graphs, so the execution suites skip" if not runs else
                      f"graphs: {self.graph or 'none'}")),
        )
        self.known_failures = KNOWN_FAILURES if KNOWN_FAILURES.exists() else None

    # -- policy: one bucket of max_num_seqs rows ----------------------------------------------
    def capture_sizes(self, config):
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if self.graph is None or self.modes.get(config.mode, "NONE") == "NONE":
            return []
        return [config.max_num_seqs]

    def padded_size(self, config, num_real_tokens):
        sizes = self.capture_sizes(config)
        return sizes[0] if sizes and num_real_tokens <= sizes[0] else None

    def resolve(self, requested: str) -> Resolution:
        resolved = self.modes.get(requested, "NONE")
        notes = () if resolved == requested else (
            f"cudagraph_mode {requested} -> {resolved}: {self.name} graphs only the single-token decode step",)
        return Resolution(requested, resolved, notes)

    def build(self, config):
        from .engine import StaticCacheEngine

        resolution = self.resolve(config.policy.mode)
        for message in resolution.warnings:
            warnings.warn(message, stacklevel=2)
        return StaticCacheEngine(config, self.graph, resolution)


class TransformersEager(_TransformersRuntime):
    name = "transformers-eager"


class TransformersGraph(_TransformersRuntime):
    name = "transformers-graph"
    graph = "manual"
    modes = {"NONE": "NONE", "FULL": "FULL_DECODE_ONLY", "FULL_DECODE_ONLY": "FULL_DECODE_ONLY",
             "FULL_AND_PIECEWISE": "FULL_DECODE_ONLY"}


class TransformersCompile(_TransformersRuntime):
    name = "transformers-compile"
    graph = "compile"

    def __init__(self):
        import torch._inductor.config

        # Compile in this process: Inductor's worker pool would be processes a test leaves running.
        torch._inductor.config.compile_threads = 1
        super().__init__()
    modes = TransformersGraph.modes
