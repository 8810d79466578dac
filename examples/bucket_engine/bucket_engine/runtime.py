"""The bucket engine behind the harness protocol: its policy answers and its engines.

Registered as `bucket-engine` (entry point group cudagraph_conformance.runtimes). The
capabilities say what is true of it and nothing more: its own buckets (not vLLM's), FULL graphs
only, one attention backend that holds any batch in a graph (ALWAYS), speculative verify
batches of q tokens, and every inspection hook the suites use.
"""
from __future__ import annotations

from harness.protocol import Capabilities, EngineConfig, PolicyConfig, ResolveRequest

from . import __version__, policy
from .engine import ATTENTION, PADDING_FILLS, BucketEngine


class BucketRuntime:
    name = "bucket-engine"
    version = __version__
    engine_class = BucketEngine
    capabilities = Capabilities(
        capture_sizes=True, dispatch=True, mode_resolution=True, speculative=True, execution=True, speculative_steps=True,
        rejected_drafts=True,
        graph_backends=("emulated", "cuda"), attention_backends=(ATTENTION,), padding_fills=PADDING_FILLS,
        loads_checkpoint=True, kv_inspection=True, input_inspection=True, address_checks=True,
        notes="powers-of-two buckets keyed by padded token count, FULL graphs only (no PIECEWISE); "
              "padding fills nan/inf poison the KV row only padded tokens read",
    )

    def capture_sizes(self, config: PolicyConfig) -> list[int]:
        return policy.capture_sizes(config)

    def padded_size(self, config: PolicyConfig, num_real_tokens: int) -> int | None:
        return policy.padded_size(config, num_real_tokens)

    def dispatch(self, config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False):
        return policy.dispatch(config, num_real_tokens, num_real_rows, uniform)

    def resolve_mode(self, request: ResolveRequest):
        # vLLM's compilation options (attention_in_splitting_ops, ...) do not exist here.
        return policy.resolve_mode(request.mode, request.support, request.num_speculative_tokens)

    def build(self, config: EngineConfig) -> BucketEngine:
        return self.engine_class(config)
