"""A Llama-architecture decoder in plain torch, split into pieces at the attention ops.

The forward is: embed, then per layer [norm, fused QKV, RoPE] -> attention -> [output
projection, residual, norm, gated MLP, residual], then final norm and LM head. Every config field
transformers' Llama reads is honoured: head_dim, the key-value heads, rms_norm_eps, RoPE's theta
and Llama 3.1 scaling, hidden_act, attention and MLP biases, tied embeddings. The parts
between two attention calls are the *pieces* that PIECEWISE mode captures one graph each for;
attention itself is a callable the engine passes in (eager between pieces, or inside one FULL
graph). Weights come from a Hugging Face Llama checkpoint folder (the harness writes one per preset).
"""
from __future__ import annotations

import json
import math
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


def rope_parameters(config) -> dict:
    """RoPE's settings: transformers 5.x keeps them in config.rope_parameters; 4.x wrote rope_theta
    and rope_scaling beside the other fields."""
    parameters = dict(getattr(config, "rope_scaling", None) or {})
    parameters.update(getattr(config, "rope_parameters", None) or {})
    parameters.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    parameters.setdefault("rope_type", parameters.get("type", "default"))
    return parameters


def inverse_frequencies(config, head_dim: int) -> torch.Tensor:
    """RoPE's frequency per pair of dimensions: plain, or scaled as Llama 3.1 does ("llama3")."""
    rope = rope_parameters(config)
    frequencies = 1.0 / (float(rope["rope_theta"]) ** (torch.arange(0, head_dim, 2).float() / head_dim))
    if rope["rope_type"] == "default":
        return frequencies
    if rope["rope_type"] != "llama3":
        raise ValueError(f"RoPE type {rope['rope_type']!r} is not implemented; this decoder has default and llama3")
    # Llama 3.1: wavelengths shorter than the pretraining length / high_freq_factor keep their
    # frequency, those longer than it / low_freq_factor are slowed by factor, and between the two
    # the frequency moves smoothly from one to the other.
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    pretrained = float(rope["original_max_position_embeddings"])
    wavelength = 2 * math.pi / frequencies
    blend = ((pretrained / wavelength - low) / (high - low)).clamp(0, 1)
    scaled = (1 - blend) * frequencies / factor + blend * frequencies
    return torch.where(wavelength < pretrained / high, frequencies,
                       torch.where(wavelength > pretrained / low, frequencies / factor, scaled))


# The activations of transformers' ACT2FN that a Llama checkpoint may name in hidden_act.
ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, intermediate, attention_bias: bool, mlp_bias: bool):
        super().__init__()
        self.input_norm = nn.Parameter(torch.ones(hidden))
        self.post_norm = nn.Parameter(torch.ones(hidden))
        self.qkv = nn.Parameter(torch.empty((heads + 2 * kv_heads) * head_dim, hidden))
        self.o_proj = nn.Parameter(torch.empty(hidden, heads * head_dim))
        self.gate_up = nn.Parameter(torch.empty(2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(hidden, intermediate))
        # Biases only where the checkpoint's config says the projections have them (None: no bias).
        self.qkv_bias = nn.Parameter(torch.zeros(self.qkv.shape[0])) if attention_bias else None
        self.o_bias = nn.Parameter(torch.zeros(hidden)) if attention_bias else None
        self.gate_up_bias = nn.Parameter(torch.zeros(2 * intermediate)) if mlp_bias else None
        self.down_bias = nn.Parameter(torch.zeros(hidden)) if mlp_bias else None


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
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        act = getattr(config, "hidden_act", "silu")
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not implemented; this decoder has {', '.join(ACTIVATIONS)}")
        self.act = ACTIVATIONS[act]
        self.embed = nn.Parameter(torch.empty(self.vocab, self.hidden))
        self.layers = nn.ModuleList(
            Layer(self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate,
                  bool(getattr(config, "attention_bias", False)), bool(getattr(config, "mlp_bias", False)))
            for _ in range(self.num_layers)
        )
        self.final_norm = nn.Parameter(torch.ones(self.hidden))
        self.lm_head = nn.Parameter(torch.empty(self.vocab, self.hidden))
        angles = torch.outer(torch.arange(self.max_positions).float(), inverse_frequencies(config, self.head_dim))
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
            # Tied embeddings: the checkpoint has no lm_head.weight; the head is the embedding.
            model.lm_head.copy_(sd["model.embed_tokens.weight"] if model.tied else sd["lm_head.weight"])
            for i, layer in enumerate(model.layers):
                p = f"model.layers.{i}."
                layer.input_norm.copy_(sd[p + "input_layernorm.weight"])
                layer.post_norm.copy_(sd[p + "post_attention_layernorm.weight"])
                for kind in ("weight",) + (("bias",) if layer.qkv_bias is not None else ()):
                    fused = torch.cat([sd[p + f"self_attn.{n}_proj.{kind}"] for n in "qkv"])
                    (layer.qkv if kind == "weight" else layer.qkv_bias).copy_(fused)
                for kind in ("weight",) + (("bias",) if layer.gate_up_bias is not None else ()):
                    fused = torch.cat([sd[p + f"mlp.gate_proj.{kind}"], sd[p + f"mlp.up_proj.{kind}"]])
                    (layer.gate_up if kind == "weight" else layer.gate_up_bias).copy_(fused)
                layer.o_proj.copy_(sd[p + "self_attn.o_proj.weight"])
                layer.down.copy_(sd[p + "mlp.down_proj.weight"])
                if layer.o_bias is not None:
                    layer.o_bias.copy_(sd[p + "self_attn.o_proj.bias"])
                if layer.down_bias is not None:
                    layer.down_bias.copy_(sd[p + "mlp.down_proj.bias"])
        return model

    # -- pieces: everything between two attention ops -------------------------------------
    def pre_attention(self, index: int, hidden: torch.Tensor, positions: torch.Tensor, lora: Callable | None = None):
        """Norm, fused QKV and RoPE of one layer: q [T, H, D], k and v [T, KVH, D]. `lora(layer, x)`:
        what the rows' adapters add to the fused QKV output (lora.py); None: no adapter op."""
        layer = self.layers[index]
        normed = rms_norm(hidden, layer.input_norm, self.eps)
        qkv = nn.functional.linear(normed, layer.qkv, layer.qkv_bias)
        if lora is not None:
            qkv = qkv + lora(index, normed)
        qkv = qkv.view(-1, self.heads + 2 * self.kv_heads, self.head_dim)
        # q and k sit side by side in the fused projection: rotate them together (half the kernels).
        qk = qkv[:, : self.heads + self.kv_heads]
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(qk.dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(qk.dtype)
        q, k = (qk * cos + rotate_half(qk) * sin).split([self.heads, self.kv_heads], dim=1)
        return q, k, qkv[:, self.heads + self.kv_heads:]

    def post_attention(self, index: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, norm, gated MLP (SwiGLU under silu), residual."""
        layer = self.layers[index]
        hidden = hidden + nn.functional.linear(attn, layer.o_proj, layer.o_bias)
        normed = rms_norm(hidden, layer.post_norm, self.eps)
        gate, up = nn.functional.linear(normed, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
        return hidden + nn.functional.linear(self.act(gate) * up, layer.down, layer.down_bias)

    def first_piece(self, input_ids, positions, lora: Callable | None = None):
        hidden = self.embed.index_select(0, input_ids)
        return (hidden, *self._pre_attention(0, hidden, positions, lora))

    def middle_piece(self, index: int, hidden, attn, positions, lora: Callable | None = None):
        """Finish layer index - 1, start layer index."""
        hidden = self.post_attention(index - 1, hidden, attn)
        return (hidden, *self._pre_attention(index, hidden, positions, lora))

    def _pre_attention(self, index, hidden, positions, lora):
        # Without adapters, called as a model without LoRA is (a replaced model's pre_attention
        # need not take the argument).
        if lora is None:
            return self.pre_attention(index, hidden, positions)
        return self.pre_attention(index, hidden, positions, lora)

    def last_piece(self, hidden, attn):
        hidden = self.post_attention(self.num_layers - 1, hidden, attn)
        return nn.functional.linear(rms_norm(hidden, self.final_norm, self.eps), self.lm_head)

    def forward(self, input_ids, positions, attention: Callable, lora: Callable | None = None) -> torch.Tensor:
        """The whole step, pieces and attention interleaved: logits [T, vocab]."""
        adapters = {} if lora is None else {"lora": lora}  # a replaced piece without LoRA need not take it
        hidden, q, k, v = self.first_piece(input_ids, positions, **adapters)
        for index in range(1, self.num_layers):
            attn = attention(index - 1, q, k, v)
            hidden, q, k, v = self.middle_piece(index, hidden, attn, positions, **adapters)
        return self.last_piece(hidden, attention(self.num_layers - 1, q, k, v))
