"""The numerical anchor: transformers' own forward over the harness's checkpoint, independent of
any engine. Every expected logit row is computed from a request's whole sequence (prompt and
every token since), with no KV cache, no padding and no graphs.

Tolerances are per engine dtype, against an fp32 anchor; docs/authoring.md gives the measured
differences they were set from.
"""
from __future__ import annotations

import torch

# Largest |engine - anchor| logit difference allowed, by the engine's dtype.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.05}


class Anchor:
    def __init__(self, checkpoint: str, device: str = "cpu"):
        from transformers import LlamaForCausalLM

        self.device = device
        self.model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                      attn_implementation="eager").to(device).eval()

    @torch.inference_mode()
    def logits(self, sequence: list[int]) -> torch.Tensor:
        """[len(sequence), vocab] fp32 logits on the CPU: row i predicts the token after position i."""
        ids = torch.tensor([sequence], device=self.device)
        return self.model(input_ids=ids).logits[0].float().cpu()

    def step(self, requests, history: dict[int, list[int]]) -> torch.Tensor:
        """The rows a step's logits should hold, in request order: for each request, the positions
        its tokens occupy after the `history` (its tokens before this step)."""
        rows = []
        for r in requests:
            before = history.get(r.request_id, [])
            if len(before) != r.context_len:
                raise ValueError(f"request {r.request_id} says {r.context_len} tokens are cached; its history has "
                                 f"{len(before)}")
            rows.append(self.logits(before + list(r.token_ids))[r.context_len:])
        return torch.cat(rows)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Per row, the gap between the best and the second-best logit."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]
