"""The reference model's step under torch.compile(mode="reduce-overhead").

PyTorch's CUDA graph trees warm a function up per input shape the first time they see it, record
a graph the next time and replay it after; they skip graphs when they must (mutated inputs, CPU
work, data-dependent shapes). There is no capture phase and no padding: every batch size is its
own shape. Each step reports the path its graph trees took, observed from their manager
(harness.graphs.trees): NONE for a warm-up or a skip, FULL for a recording or a replay.
"""
from __future__ import annotations

import warnings
from dataclasses import replace

from pathlib import Path

from harness.protocol import Capabilities, Resolution
from reference_runtime.adapter import runner_config

KNOWN_FAILURES = Path(__file__).with_name("known_failures.toml")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class ReferenceCompile:
    """No policy operations: the compiler decides what to record, shape by shape."""

    name = "reference-compile"

    def __init__(self):
        import torch

        self.version = f"0.1.0 (torch {torch.__version__})"
        # Compile in this process: Inductor's worker pool would be processes a test leaves running.
        torch._inductor.config.compile_threads = 1
        runs = _cuda()
        self.known_failures = KNOWN_FAILURES
        self.capabilities = Capabilities(
            execution=runs, graph_backends=("cuda",) if runs else (), loads_checkpoint=True, lazy_capture=True,
            notes="torch.compile reduce-overhead: graphs recorded lazily per exact shape, no padding, "
                  "no capture phase" + ("" if runs else "; no CUDA device here, so the execution suites skip"),
        )


    def build(self, config):
        from .runner import compiled_runner

        base = runner_config(config)
        runner = compiled_runner(replace(base, graph_backend="cuda", policy=replace(base.policy, mode="NONE")))
        requested = config.policy.mode
        resolved = "NONE" if requested == "NONE" else "FULL"
        runner.resolution = Resolution(requested, resolved, () if resolved == requested else (
            f"cudagraph_mode {requested} -> {resolved}: torch.compile graphs whole steps, lazily, per shape",))
        for message in runner.resolution.warnings:
            warnings.warn(message, stacklevel=2)
        runner.strategy.graphs_enabled = resolved != "NONE"
        return runner
