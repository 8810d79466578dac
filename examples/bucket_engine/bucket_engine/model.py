"""A Llama decoder in plain torch, read from a Hugging Face checkpoint folder (config.json and
model.safetensors): RMSNorm, fused QKV projection, rotary positions (transformers' convention:
rotate_half over the two halves of each head), grouped-query attention, SwiGLU MLP.

Attention is the engine's (it owns the KV cache): `forward` calls `attention(layer, q, k, v)`
with q [T, heads, head_dim] and k, v [T, kv_heads, head_dim], and takes [T, heads * head_dim].
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file
from torch.nn.functional import linear, silu


def rope_theta(config: dict) -> float:
    """transformers 4.x writes rope_theta; 5.x moved it into rope_parameters."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or parameters
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ValueError("the bucket engine implements default RoPE only, not scaled variants")
    return float(config.get("rope_theta") or parameters.get("rope_theta", 10000.0))


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
        config = json.loads((folder / "config.json").read_text())
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise ValueError(f"checkpoint {folder} has projection biases; the bucket engine's Llama has none")
        self.hidden, self.vocab = config["hidden_size"], config["vocab_size"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or self.hidden // self.heads
        self.num_layers, self.eps = config["num_hidden_layers"], config["rms_norm_eps"]
        self.max_positions = config["max_position_embeddings"]
        w = {name: t.to(device, dtype) for name, t in load_file(folder / "model.safetensors").items()}
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)  # tied embeddings have no lm_head
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(dict(
                input_norm=w[p + "input_layernorm.weight"], post_norm=w[p + "post_attention_layernorm.weight"],
                qkv=torch.cat([w[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]),
                o=w[p + "self_attn.o_proj.weight"], down=w[p + "mlp.down_proj.weight"],
                gate_up=torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])))
        # cos and sin of every position, computed once in fp32 and indexed by position in a step.
        inv_freq = 1.0 / rope_theta(config) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        angles = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq).repeat(1, 2)
        self.cos, self.sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        return x * cos + rotate_half(x) * sin

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attention: Callable) -> torch.Tensor:
        """Logits [T, vocab] for T tokens; every op is per token except attention."""
        h = self.embed[token_ids]
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        for index, layer in enumerate(self.layers):
            q, k, v = linear(rms_norm(h, layer["input_norm"], self.eps), layer["qkv"]).split(sizes, dim=-1)
            q = self.rope(q.view(-1, self.heads, self.head_dim), positions)
            k = self.rope(k.view(-1, self.kv_heads, self.head_dim), positions)
            h = h + linear(attention(index, q, k, v.view(-1, self.kv_heads, self.head_dim)), layer["o"])
            gate, up = linear(rms_norm(h, layer["post_norm"], self.eps), layer["gate_up"]).chunk(2, dim=-1)
            h = h + linear(silu(gate) * up, layer["down"])
        return linear(rms_norm(h, self.final_norm, self.eps), self.lm_head)
