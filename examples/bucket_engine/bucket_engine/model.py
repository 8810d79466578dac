"""A Llama decoder in plain torch, read from a Hugging Face checkpoint folder (config.json and
model.safetensors): RMSNorm, fused QKV projection, rotary positions (transformers' convention:
rotate_half over the two halves of each head; plain or Llama 3.1's scaled frequencies), grouped-query
attention with its own head_dim, a gated MLP with the checkpoint's activation, projection biases
where the config has them, and a head tied to the embedding where the config says so.

Attention is the engine's (it owns the KV cache): `forward` calls `attention(layer, q, k, v)`
with q [T, heads, head_dim] and k, v [T, kv_heads, head_dim], and takes [T, heads * head_dim].
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file
from torch.nn.functional import gelu, linear, relu, silu


def inv_freq(config: dict, head_dim: int) -> torch.Tensor:
    """RoPE's frequencies, plain or with Llama 3.1's scaling. transformers 5.x keeps RoPE's settings
    in rope_parameters; 4.x wrote rope_theta and rope_scaling beside the other fields."""
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if kind == "default":
        return freq
    if kind != "llama3":
        raise ValueError(f"the bucket engine implements default and llama3 RoPE, not {kind!r}")
    # Llama 3.1: slow the low frequencies down by `factor`, keep the high ones, blend in between,
    # with the bands set by the pretraining context length.
    context, factor = rope["original_max_position_embeddings"], rope["factor"]
    low_band, high_band = context / rope["low_freq_factor"], context / rope["high_freq_factor"]
    wavelength = 2 * math.pi / freq
    t = (context / wavelength - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
    blended = (1 - t) * freq / factor + t * freq
    out = torch.where(wavelength > low_band, freq / factor, blended)
    return torch.where(wavelength < high_band, freq, out)


ACTIVATIONS = {"silu": silu, "gelu": gelu, "gelu_pytorch_tanh": lambda x: gelu(x, approximate="tanh"), "relu": relu}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # In fp32, cast back before the weight, as transformers' LlamaRMSNorm does.
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    def __init__(self, folder: str | Path, dtype: torch.dtype, device: torch.device):
        folder = Path(folder)
        if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
            raise ValueError(f"checkpoint {folder} needs config.json and model.safetensors (one shard)")
        config = self.read_config(folder)
        self.hidden, self.vocab = config["hidden_size"], config["vocab_size"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or self.hidden // self.heads
        self.num_layers, self.eps = config["num_hidden_layers"], config["rms_norm_eps"]
        self.max_positions = config["max_position_embeddings"]
        if config.get("hidden_act", "silu") not in ACTIVATIONS:
            raise ValueError(f"hidden_act {config['hidden_act']!r}: the bucket engine has {', '.join(ACTIVATIONS)}")
        self.act = ACTIVATIONS[config.get("hidden_act", "silu")]
        w = {name: t.to(device, dtype) for name, t in load_file(folder / "model.safetensors").items()}
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.head(config, w)
        self.final_norm = w["model.norm.weight"]
        attention_bias, mlp_bias = config.get("attention_bias", False), config.get("mlp_bias", False)

        def fused(names: list[str], has_bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
            """The projections' weights stacked (one matmul), and their biases (None: none)."""
            weight = torch.cat([w[name + ".weight"] for name in names])
            return weight, torch.cat([w[name + ".bias"] for name in names]) if has_bias else None

        self.layers = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            qkv, qkv_bias = fused([p + f"self_attn.{x}_proj" for x in "qkv"], attention_bias)
            o, o_bias = fused([p + "self_attn.o_proj"], attention_bias)
            gate_up, gate_up_bias = fused([p + "mlp.gate_proj", p + "mlp.up_proj"], mlp_bias)
            down, down_bias = fused([p + "mlp.down_proj"], mlp_bias)
            self.layers.append(dict(
                input_norm=w[p + "input_layernorm.weight"], post_norm=w[p + "post_attention_layernorm.weight"],
                qkv=qkv, qkv_bias=qkv_bias, o=o, o_bias=o_bias, gate_up=gate_up, gate_up_bias=gate_up_bias,
                down=down, down_bias=down_bias))
        # cos and sin of every position, computed once in fp32 and indexed by position in a step.
        angles = torch.outer(torch.arange(self.max_positions, dtype=torch.float32),
                             inv_freq(config, self.head_dim)).repeat(1, 2)
        self.cos, self.sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)

    @staticmethod
    def read_config(folder: Path) -> dict:
        """The checkpoint's config.json: every field the forward reads comes from here."""
        return json.loads((folder / "config.json").read_text())

    def head(self, config: dict, weights: dict) -> torch.Tensor:
        """The output projection. Tied embeddings: the checkpoint has no lm_head.weight; the head is the embedding."""
        return weights["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else weights["lm_head.weight"]

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        return x * cos + rotate_half(x) * sin

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attention: Callable) -> torch.Tensor:
        """Logits [T, vocab] for T tokens; every op is per token except attention."""
        h = self.embed[token_ids]
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        for index, layer in enumerate(self.layers):
            x = rms_norm(h, layer["input_norm"], self.eps)
            q, k, v = linear(x, layer["qkv"], layer["qkv_bias"]).split(sizes, dim=-1)
            q = self.rope(q.view(-1, self.heads, self.head_dim), positions)
            k = self.rope(k.view(-1, self.kv_heads, self.head_dim), positions)
            h = h + linear(attention(index, q, k, v.view(-1, self.kv_heads, self.head_dim)), layer["o"], layer["o_bias"])
            x = rms_norm(h, layer["post_norm"], self.eps)
            gate, up = linear(x, layer["gate_up"], layer["gate_up_bias"]).chunk(2, dim=-1)
            h = h + linear(self.act(gate) * up, layer["down"], layer["down_bias"])
        return linear(rms_norm(h, self.final_norm, self.eps), self.lm_head)
