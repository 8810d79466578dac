"""The config checks every runtime that drives one engine on one GPU makes before a build: each
refusal is one ValueError line saying what was asked and what this runtime runs."""
from __future__ import annotations

from harness import protocol as p


def check_one_gpu_config(config: p.EngineConfig, runtime: str, attention: str, attention_words: str) -> None:
    """CUDA graphs on a CUDA device, a checkpoint folder, one rank, and the one attention backend
    `attention` (described in messages as `attention_words`)."""
    if config.graph_backend != "cuda" or not str(config.device).startswith("cuda"):
        raise ValueError(f"{runtime} runs CUDA graphs on a GPU; got graph_backend={config.graph_backend!r}, "
                         f"device={config.device!r}")
    if not config.checkpoint:
        raise ValueError(f"{runtime} loads a Hugging Face checkpoint: EngineConfig.checkpoint must be a folder")
    if config.data_parallel is not None:
        raise ValueError(f"{runtime} runs one rank; data_parallel is not supported")
    asked = set(config.attention_backends or (attention,))
    if asked != {attention}:
        raise ValueError(f"{runtime} runs {attention_words} only; asked for {sorted(asked)}")


def check_mode(config: p.EngineConfig) -> None:
    if config.policy.mode not in p.CONFIG_MODES:
        raise ValueError(f"unknown config mode {config.policy.mode!r}; expected one of {', '.join(p.CONFIG_MODES)}")


def check_built(engine, built: tuple, answered: tuple, label: str, engine_name: str, events) -> None:
    """The built engine closed and refused where it resolved, sized and keyed its graphs (`built`)
    other than its runtime's policy answers for its config (`answered`): the policy questions would
    be answered for another engine. Both are (resolved mode, capture sizes, graph descriptors)."""
    if built != answered:
        events.event(f"{label}: BUILD CHECK FAILED: engine {built}; policy {answered}")
        engine.close()
        raise RuntimeError(f"{label}: {engine_name}'s engine resolved {built[0]}, capture sizes {built[1]}, graphs "
                           f"{built[2]}; this runtime's policy answers {answered[0]}, {answered[1]}, {answered[2]} "
                           "for the same config: the policy questions would be answered for another engine")


def require_cuda(runtime: str, what: str) -> None:
    """RuntimeUnavailable (the harness shows why, and skips) where torch sees no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise p.RuntimeUnavailable(f"{runtime} runs {what} on a CUDA GPU, and torch sees none here")


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "check_one_gpu_config", "check_mode", "require_cuda", "check_built",
]
