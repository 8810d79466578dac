"""A Llama-architecture decoder in plain torch, split into pieces at the attention ops.

The forward is: embed, then per layer [norm, fused QKV, RoPE] -> attention -> [output
projection, residual, norm, SwiGLU MLP, residual], then final norm and LM head. The parts
between two attention calls are the *pieces* that PIECEWISE mode captures one graph each for;
attention itself is a callable the engine passes in (eager between pieces, or inside one FULL
graph). Weights come from a Hugging Face Llama checkpoint folder (the harness writes one per preset).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
from torch import nn


@lru_cache(maxsize=4)
def load_checkpoint(checkpoint: str):
    """(config, state dict) of a Hugging Face Llama checkpoint folder: config.json and safetensors,
    read without transformers, whose import costs more than the rest of an engine. Cached:
    decoders copy the weights."""
    from safetensors.torch import load_file

    folder = Path(checkpoint)
    config = SimpleNamespace(**json.loads((folder / "config.json").read_text()))
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise ValueError(f"checkpoint {checkpoint} has no *.safetensors weights")
    return config, state


def rope_theta(config) -> float:
    # transformers 4.x has config.rope_theta; 5.x moved it into config.rope_parameters.
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, intermediate):
        super().__init__()
        self.input_norm = nn.Parameter(torch.ones(hidden))
        self.post_norm = nn.Parameter(torch.ones(hidden))
        self.qkv = nn.Parameter(torch.empty((heads + 2 * kv_heads) * head_dim, hidden))
        self.o_proj = nn.Parameter(torch.empty(hidden, heads * head_dim))
        self.gate_up = nn.Parameter(torch.empty(2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(hidden, intermediate))


class Decoder(nn.Module):
    """Attention is passed in as `attention(layer_index, q, k, v) -> [tokens, heads * head_dim]`."""

    def __init__(self, config):
        super().__init__()
        self.hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.heads
        self.intermediate = config.intermediate_size
        self.vocab = config.vocab_size
        self.eps = config.rms_norm_eps
        self.num_layers = config.num_hidden_layers
        self.max_positions = config.max_position_embeddings
        self.embed = nn.Parameter(torch.empty(self.vocab, self.hidden))
        self.layers = nn.ModuleList(
            Layer(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate)
            for _ in range(self.num_layers)
        )
        self.final_norm = nn.Parameter(torch.ones(self.hidden))
        self.lm_head = nn.Parameter(torch.empty(self.vocab, self.hidden))
        inv_freq = 1.0 / (rope_theta(config) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(self.max_positions).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @classmethod
    def from_checkpoint(cls, checkpoint: str) -> "Decoder":
        """The decoder of a Hugging Face Llama checkpoint folder (fp32, CPU)."""
        return cls.from_weights(*load_checkpoint(str(checkpoint)))

    @classmethod
    def from_weights(cls, config, sd) -> "Decoder":
        """From a Llama config and a state dict with Hugging Face's parameter names."""
        model = cls(config)
        with torch.no_grad():
            model.embed.copy_(sd["model.embed_tokens.weight"])
            model.final_norm.copy_(sd["model.norm.weight"])
            model.lm_head.copy_(sd["lm_head.weight"])
            for i, layer in enumerate(model.layers):
                p = f"model.layers.{i}."
                layer.input_norm.copy_(sd[p + "input_layernorm.weight"])
                layer.post_norm.copy_(sd[p + "post_attention_layernorm.weight"])
                layer.qkv.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
                layer.o_proj.copy_(sd[p + "self_attn.o_proj.weight"])
                layer.gate_up.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
                layer.down.copy_(sd[p + "mlp.down_proj.weight"])
        return model

    # -- pieces: everything between two attention ops -------------------------------------
    def pre_attention(self, index: int, hidden: torch.Tensor, positions: torch.Tensor):
        """Norm, fused QKV and RoPE of one layer: q [T, H, D], k and v [T, KVH, D]."""
        layer = self.layers[index]
        qkv = nn.functional.linear(rms_norm(hidden, layer.input_norm, self.eps), layer.qkv)
        qkv = qkv.view(-1, self.heads + 2 * self.kv_heads, self.head_dim)
        # q and k sit side by side in the fused projection: rotate them together (half the kernels).
        qk = qkv[:, : self.heads + self.kv_heads]
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(qk.dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(qk.dtype)
        q, k = (qk * cos + rotate_half(qk) * sin).split([self.heads, self.kv_heads], dim=1)
        return q, k, qkv[:, self.heads + self.kv_heads:]

    def post_attention(self, index: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, norm, SwiGLU MLP, residual."""
        layer = self.layers[index]
        hidden = hidden + nn.functional.linear(attn, layer.o_proj)
        gate, up = nn.functional.linear(rms_norm(hidden, layer.post_norm, self.eps), layer.gate_up).chunk(2, dim=-1)
        return hidden + nn.functional.linear(nn.functional.silu(gate) * up, layer.down)

    def first_piece(self, input_ids, positions):
        hidden = self.embed.index_select(0, input_ids)
        return (hidden, *self.pre_attention(0, hidden, positions))

    def middle_piece(self, index: int, hidden, attn, positions):
        """Finish layer index - 1, start layer index."""
        hidden = self.post_attention(index - 1, hidden, attn)
        return (hidden, *self.pre_attention(index, hidden, positions))

    def last_piece(self, hidden, attn):
        hidden = self.post_attention(self.num_layers - 1, hidden, attn)
        return nn.functional.linear(rms_norm(hidden, self.final_norm, self.eps), self.lm_head)

    def forward(self, input_ids, positions, attention: Callable) -> torch.Tensor:
        """The whole step, pieces and attention interleaved: logits [T, vocab]."""
        hidden, q, k, v = self.first_piece(input_ids, positions)
        for index in range(1, self.num_layers):
            attn = attention(index - 1, q, k, v)
            hidden, q, k, v = self.middle_piece(index, hidden, attn, positions)
        return self.last_piece(hidden, attention(self.num_layers - 1, q, k, v))
