"""The `reference` runtime: this project's engine behind the harness protocol.

Registered through the `cudagraph_conformance.runtimes` entry point, exactly as a third-party
runtime would be; the suites reach it only through this object.
"""
from __future__ import annotations

from functools import lru_cache

from harness import protocol as p

from . import __version__, policy
from .engine.inspection import FILLS


# The protocol's PolicyConfig fields this conversion handles, each by name below. A field the protocol
# gains must be added here and converted (tests/test_reference_engine.py fails until it is): a field
# dropped unread would change no answer, silently.
CONVERTED_FIELDS = frozenset({
    "max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens", "platform_max", "capture_sizes",
    "max_capture_size", "mode", "max_loras", "specialize_lora", "specialize_active_loras", "rules",
})


def to_policy_config(config: p.PolicyConfig) -> policy.PolicyConfig:
    """The reference policy's config. Its release is vLLM 0.33, the one it declares (Capabilities.rules):
    of the config's rules it takes the runner, which the reference policy models for both of vLLM's."""
    try:
        return _policy_config(config)
    except TypeError:  # a field given as a list (unhashable): converted each time
        return _policy_config.__wrapped__(config)


@lru_cache(maxsize=1024)
def _policy_config(config: p.PolicyConfig) -> policy.PolicyConfig:
    # Cached: the suites ask the same config many questions.
    return policy.PolicyConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        num_speculative_tokens=config.num_speculative_tokens, platform_max=config.platform_max,
        capture_sizes=config.capture_sizes, max_capture_size=config.max_capture_size, mode=config.mode,
        max_loras=config.max_loras, specialize_lora=config.specialize_lora,
        specialize_active_loras=config.specialize_active_loras, runner=config.vllm_runner,
    )


@lru_cache(maxsize=256)
def _padding_table(sizes: tuple[int, ...]) -> policy.PaddingTable:
    return policy.PaddingTable(list(sizes))


@lru_cache(maxsize=256)
def _dispatcher(config: p.PolicyConfig) -> policy.Dispatcher:
    dispatcher = policy.Dispatcher(to_policy_config(config))
    dispatcher.initialize_keys()
    return dispatcher


def _descriptor(key: policy.BatchDescriptor) -> p.Descriptor:
    return p.Descriptor(key.num_padded_tokens, key.num_padded_rows, key.uniform, key.has_lora, key.num_active_loras)


class ReferenceRuntime:
    name = "reference"
    version = __version__
    capabilities = p.Capabilities(
        capture_sizes=True, rules="vllm-0.33", dispatch=True, mode_resolution=True, data_parallel=True, lora=True,
        speculative=True, execution=True, speculative_steps=True, rejected_drafts=True, graph_backends=("emulated", "cuda"),
        attention_backends=(("static", "ALWAYS"), ("uniform", "UNIFORM_BATCH"),
                            ("decode", "UNIFORM_SINGLE_TOKEN_DECODE"), ("varlen", "NEVER")),
        padding_fills=FILLS, loads_checkpoint=True, kv_inspection=True,
        input_inspection=True, address_checks=True, data_parallel_execution=True, lora_steps=True, precision="ieee",
        notes="execution on the CPU uses the harness's graph emulator (same contract as CUDA graphs, no GPU timing)",
    )

    # -- policy -------------------------------------------------------------------------
    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return policy.capture_sizes(to_policy_config(config))

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        # The table of the sizes this runtime answers (a subclass may answer others), built once per grid.
        return _padding_table(tuple(self.capture_sizes(config))).padded(num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0) -> p.Dispatch:
        mode, key = _dispatcher(config).dispatch(num_real_tokens, num_real_rows, uniform, num_active_loras)
        return p.Dispatch(mode.name, _descriptor(key))

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        result = policy.resolve_mode(
            request.mode, request.support, num_speculative_tokens=request.num_speculative_tokens,
            attention_in_splitting_ops=request.attention_in_splitting_ops,
            splitting_ops_empty=request.splitting_ops_empty,
            # True leaves capture to the splitting ops (the calculator's None); False takes it away.
            piecewise_capture=None if getattr(request, "piecewise_capture", True) else False,
        )
        return p.Resolution(result.requested.name, result.resolved.name, result.warnings)

    def dp_dispatch(self, config: p.PolicyConfig, ranks) -> list[p.Dispatch]:
        batches = [(r.num_real_tokens, r.num_real_rows, r.uniform) for r in ranks]
        return [p.Dispatch(mode.name, _descriptor(key)) for mode, key in policy.dp_dispatch(_dispatcher(config), batches)]

    # -- execution ----------------------------------------------------------------------
    def build(self, config: p.EngineConfig):
        """The engine is the model runner itself: it speaks the protocol's Engine."""
        from .engine.runner import ModelRunner

        return ModelRunner(runner_config(config))


def runner_config(config: p.EngineConfig):
    """The runner's configuration for an engine the harness asks for."""
    from .engine.runner import RunnerConfig

    if config.checkpoint is None:
        raise ValueError("the reference runtime loads its weights from a checkpoint folder "
                         "(EngineConfig.checkpoint, a Hugging Face Llama folder); none was given")
    block_size = RunnerConfig.__dataclass_fields__["block_size"].default
    blocks = {"num_blocks": max(2, -(-config.kv_tokens // block_size) + 1)} if config.kv_tokens else {}
    return RunnerConfig(
        checkpoint=str(config.checkpoint), policy=to_policy_config(config.policy), dtype=config.dtype,
        device=config.device, graph_backend=config.graph_backend,
        attention_backends=tuple(config.attention_backends) or ("static",), max_model_len=config.max_model_len,
        data_parallel=config.data_parallel, lora_adapters=tuple(config.lora_adapters), **blocks,
    )
