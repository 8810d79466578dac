"""LoRA adapters on the fused QKV projection: loaded from PEFT folders, applied per token row.

Each adapter gets a slot: slot i holds adapter id i (Request.lora), slot 0 holds zeros, so a row
without an adapter (and every padded row) adds an exact zero. A step stages each token row's
adapter id (the static buffer `lora_ids`); the forward gathers that row's A and B and adds
`(alpha / r) * B A x` to the projections the adapter targets. The scale is folded into B at load.

Which graphs hold this op is the policy's (policy/lora.py, vLLM's): a key with no active adapter
is captured without it, as vLLM captures its no-LoRA graphs without LoRA kernels; a key with k is
captured with it. A step runs the op when its key (or, eager, its batch) has adapters.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

TARGETS = ("q_proj", "k_proj", "v_proj")  # the fused projection's parts, in its order


class Adapters(nn.Module):
    """A [layers, slots, ranks, hidden] and B [layers, slots, qkv rows, ranks], slot 0 zeros. Each
    target's A rows and B columns sit in a block of their own, so one gathered pair of matmuls
    computes every target at once."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor):
        super().__init__()
        self.register_buffer("A", A)
        self.register_buffer("B", B)

    @property
    def count(self) -> int:
        return self.A.shape[1] - 1

    @classmethod
    def load(cls, folders, model) -> "Adapters":
        """The adapters of PEFT folders for `model` (a Decoder), adapter id i from folders[i - 1]."""
        from safetensors.torch import load_file

        widths = {"q_proj": model.heads * model.head_dim, "k_proj": model.kv_heads * model.head_dim,
                  "v_proj": model.kv_heads * model.head_dim}
        starts = {"q_proj": 0, "k_proj": widths["q_proj"], "v_proj": widths["q_proj"] + widths["k_proj"]}
        configs = [json.loads((Path(f) / "adapter_config.json").read_text()) for f in folders]
        rank = max(int(c["r"]) for c in configs)
        A = torch.zeros(model.num_layers, len(folders) + 1, rank * len(TARGETS), model.hidden)
        B = torch.zeros(model.num_layers, len(folders) + 1, sum(widths.values()), rank * len(TARGETS))
        for slot, (folder, config) in enumerate(zip(folders, configs), start=1):
            targets = set(config["target_modules"])
            if not targets <= set(TARGETS) or config.get("use_dora") or config.get("bias", "none") != "none":
                raise ValueError(f"adapter {folder}: this engine applies LoRA to {', '.join(TARGETS)} without DoRA "
                                 f"or biases; it targets {sorted(targets)} (use_dora={config.get('use_dora')}, "
                                 f"bias={config.get('bias')})")
            r, scale = int(config["r"]), float(config["lora_alpha"]) / int(config["r"])
            weights = load_file(str(Path(folder) / "adapter_model.safetensors"))
            for layer in range(model.num_layers):
                for t, target in enumerate(TARGETS):
                    key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
                    if target not in targets:
                        continue
                    a, b = weights[f"{key}.lora_A.weight"], weights[f"{key}.lora_B.weight"]
                    A[layer, slot, t * rank: t * rank + r] = a
                    B[layer, slot, starts[target]: starts[target] + widths[target], t * rank: t * rank + r] = b * scale
        return cls(A, B)

    def delta(self, layer: int, x: torch.Tensor, lora_ids: torch.Tensor) -> torch.Tensor:
        """What each row's adapter adds to the fused QKV output of `x` [tokens, hidden]."""
        a = self.A[layer].index_select(0, lora_ids)  # [tokens, ranks, hidden]
        b = self.B[layer].index_select(0, lora_ids)  # [tokens, qkv rows, ranks]
        return torch.bmm(b, torch.bmm(a, x.unsqueeze(-1))).squeeze(-1)


def active_adapters(requests) -> int:
    """The number of distinct adapters a batch's requests name (vLLM's num_active_loras)."""
    return len({r.lora for r in requests if getattr(r, "lora", None) is not None})
