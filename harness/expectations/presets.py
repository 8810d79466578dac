"""Model presets and the harness's own Hugging Face checkpoints of them.

A preset is a Llama shape; with a seed it is a set of weights: a randomly initialised
`transformers` LlamaForCausalLM, saved as a checkpoint folder (config.json + safetensors, no
tokenizer, no hub). Runtimes that declare `loads_checkpoint` are handed that folder, and the
numerical anchor (harness.expectations.anchor) computes the expected logits from the same folder with
transformers' own forward, independently of the engine under test.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Preset:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int = 2048


PRESETS = {
    "tiny": Preset(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, max_positions=512),
    "small": Preset(layers=8, hidden=512, heads=8, kv_heads=4, intermediate=1408, vocab=32000),
    "medium": Preset(layers=24, hidden=1024, heads=16, kv_heads=8, intermediate=2816, vocab=32000),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return PRESETS[name]


def hf_config(name: str):
    """The transformers LlamaConfig of a preset."""
    from transformers import LlamaConfig

    p = preset(name)
    return LlamaConfig(
        vocab_size=p.vocab, hidden_size=p.hidden, intermediate_size=p.intermediate, num_hidden_layers=p.layers,
        num_attention_heads=p.heads, num_key_value_heads=p.kv_heads, max_position_embeddings=p.max_positions,
        tie_word_embeddings=False,
    )


def seeded_model(name: str, seed: int = 0):
    """A randomly initialised LlamaForCausalLM (fp32, CPU, eager attention); same seed, same weights."""
    import torch
    from transformers import LlamaForCausalLM

    config = hf_config(name)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only: torch.manual_seed would reseed every CUDA device too, which
        # fork_rng(devices=[]) does not put back (harness.reliability.isolation counts that as taint).
        torch.default_generator.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def checkpoint(name: str, seed: int = 0, root: str | os.PathLike | None = None) -> Path:
    """The checkpoint folder of a preset and seed, written once and shared by every process.

    Written to a private folder and renamed into place, so concurrent writers (xdist workers)
    never see half a checkpoint.
    """
    from importlib import metadata

    root = Path(root or os.environ.get("CUDAGRAPH_CHECKPOINTS") or Path(tempfile.gettempdir()) / "cudagraph-checkpoints")
    folder = root / f"{name}-seed{seed}-transformers{metadata.version('transformers')}"
    if (folder / "config.json").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    seeded_model(name, seed).save_pretrained(staging, safe_serialization=True)
    try:
        staging.rename(folder)
    except OSError:  # another process got there first; theirs is the same weights
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return folder
