"""The harness's own LoRA adapters for its checkpoints: small, random, seeded, in PEFT's layout.

An adapter folder holds what PEFT's `save_pretrained()` writes (huggingface.co/docs/peft,
"PEFT checkpoint format"): `adapter_config.json` (peft_type, r, lora_alpha, target_modules, ...)
and `adapter_model.safetensors`, whose keys are the base model's module path under
`base_model.model.` with `lora_A.weight` ([r, in]) and `lora_B.weight` ([out, r]). A projection
targeted by the adapter computes `W x + (lora_alpha / r) * B A x`.

PEFT starts B at zero, so a fresh adapter changes nothing; these draw B too, so that every
targeted row's output moves and a suite can tell a row that ran the adapter from one that did
not. No download and no peft import: the files are written from torch and safetensors alone.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import presets

RANK = 4
ALPHA = 8
TARGET_MODULES = ("q_proj", "v_proj")
ADAPTER_RECIPE = 1  # bump when adapter() draws weights differently: the folder's name changes
# B's scale: large enough that a targeted row's logits move well past float noise, small enough
# that the model stays a model (the delta is a fraction of the projection's own output).
B_STD = 0.2


def _shapes(name: str) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection an adapter may target, from the preset's shape."""
    p = presets.preset(name)
    return {"q_proj": (p.heads * p.head_dim, p.hidden), "k_proj": (p.kv_heads * p.head_dim, p.hidden),
            "v_proj": (p.kv_heads * p.head_dim, p.hidden), "o_proj": (p.hidden, p.heads * p.head_dim)}


def adapter_config(name: str, base: str | os.PathLike | None = None) -> dict:
    """adapter_config.json of the harness's adapter for a preset."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "target_modules": list(TARGET_MODULES), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "modules_to_save": None, "inference_mode": True,
        "base_model_name_or_path": str(base) if base is not None else None,
    }


def adapter_weights(name: str, seed: int = 0, index: int = 1) -> dict:
    """The adapter's tensors by PEFT key (fp32): A and B for each target of every layer."""
    import torch

    shapes, layers = _shapes(name), presets.preset(name).layers
    generator = torch.Generator().manual_seed(10_000 * (seed + 1) + index)
    weights = {}
    for layer in range(layers):
        for target in TARGET_MODULES:
            out_features, in_features = shapes[target]
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            weights[f"{key}.lora_A.weight"] = torch.randn(RANK, in_features, generator=generator) / in_features ** 0.5
            weights[f"{key}.lora_B.weight"] = torch.randn(out_features, RANK, generator=generator) * B_STD
    return weights


def fingerprint(name: str) -> str:
    text = json.dumps([presets.fingerprint(name), RANK, ALPHA, TARGET_MODULES, B_STD, ADAPTER_RECIPE])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def adapter(name: str, seed: int = 0, index: int = 1, root: str | os.PathLike | None = None) -> Path:
    """The folder of adapter `index` (1, 2, ...: each draws other weights) for a preset's checkpoint
    and seed, written once and shared by every process (written aside, then renamed into place)."""
    from safetensors.torch import save_file

    def write(staging: Path) -> None:
        save_file({k: v.contiguous() for k, v in adapter_weights(name, seed, index).items()},
                  str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        (staging / "adapter_config.json").write_text(json.dumps(adapter_config(name), indent=2, sort_keys=True) + "\n")

    folder = presets.checkpoint_root(root) / f"{name}-seed{seed}-lora{index}-{fingerprint(name)}"
    return presets.written_once(folder, "adapter_config.json", write)


def adapters(name: str, count: int, seed: int = 0, root: str | os.PathLike | None = None) -> tuple[str, ...]:
    """`count` adapter folders, adapter id i (1-based, as Request.lora names it) at position i - 1."""
    return tuple(str(adapter(name, seed, index, root)) for index in range(1, count + 1))


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = ["RANK", "ALPHA", "TARGET_MODULES", "adapter_config", "adapter_weights", "adapter", "adapters"]
