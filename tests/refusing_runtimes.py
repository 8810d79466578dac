"""Runtimes whose engines cannot load the harness's checkpoint: one refuses it through the
protocol (one verdict for the session), one refuses it with a plain error (a failure per test, as
before 0.2.0: only the protocol's exception earns the verdict)."""
from __future__ import annotations

from harness.protocol import UnsupportedCheckpoint
from reference_runtime.adapter import ReferenceRuntime

LACKS = "llama3 RoPE scaling (rope_type 'llama3'): this engine implements the default RoPE only"


class RefusesTheCheckpoint(ReferenceRuntime):
    name = "refuses-checkpoint"

    def build(self, config):
        if config.checkpoint is not None:
            raise UnsupportedCheckpoint(LACKS)
        return super().build(config)


class RefusesWithAPlainError(ReferenceRuntime):
    name = "refuses-plainly"

    def build(self, config):
        if config.checkpoint is not None:
            raise NotImplementedError(LACKS)
        return super().build(config)
