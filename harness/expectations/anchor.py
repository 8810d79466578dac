"""The numerical anchor: transformers' own forward over the harness's checkpoint, independent of
any engine. Every expected logit row is computed from a request's whole sequence (prompt and
every token since), with no KV cache, no padding and no graphs.

How far an engine's logits may lie from the anchor follows from how it declares its arithmetic
(`Capabilities.precision`) by one rule, `tolerance()` (docs/spec.md section 10): rounding
errors of the model's matrix products, added up as independent errors, scaled by the size of
the logits, with a stated margin. `scripts/precision_calibration.py` measures the rule against
emulated TF32, bfloat16 and float16 forwards (reports/precision/).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.expectations import presets
from harness.vocabulary import PRECISIONS

# Unit roundoff of a matrix product's inputs (and, for a dtype, of every value stored between
# products): float32 keeps 24 significant bits, TF32 11, bfloat16 8, float16 11.
UNIT_ROUNDOFF = {"ieee": 2.0 ** -24, "tf32": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# The spread of a sum of independent rounding errors is a few of its standard deviations at the
# extreme of the ~10^5 logits a test compares; 4 leaves room for correlated layers.
MARGIN = 4.0
PROBE_TOKENS = 64  # the anchor's own scale: the largest |logit| over a fixed sequence this long


@dataclass(frozen=True)
class Tolerance:
    """The largest |engine - anchor| logit difference allowed, and how the rule arrived at it."""

    value: float
    precision: str
    products: int  # matrix products on the path from the embedding to a logit
    inner: int  # the longest inner dimension one of them sums over
    scale: float  # the largest |logit| of the anchor

    def explain(self) -> str:
        return (f"{self.value:.3g}, the tolerance for declared precision {self.precision!r} (Capabilities.precision): "
                f"{MARGIN:g} x sqrt({self.products} matrix products) x (u={UNIT_ROUNDOFF[self.precision]:.3g} + "
                f"float32 accumulation {UNIT_ROUNDOFF['ieee']:.3g} x sqrt({self.inner})) x the anchor's largest "
                f"|logit| {self.scale:.3g} (docs/spec.md section 10)")


def tolerance(precision: str, preset: str, scale: float) -> Tolerance:
    """The rule (docs/spec.md section 10). Each of the M = 6 x layers + 1 matrix products of a
    Llama (QKV, scores, values, output, gate/up, down, and the head) is off by its inputs'
    unit roundoff u plus float32 accumulation over its inner dimension K, both relative to its
    result; independent errors of M products add to sqrt(M) of one; the logits carry them at
    their own size."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    shape = presets.preset(preset)
    products = 6 * shape.layers + 1
    inner = max(shape.hidden, shape.intermediate)
    per_product = UNIT_ROUNDOFF[precision] + UNIT_ROUNDOFF["ieee"] * math.sqrt(inner)
    return Tolerance(MARGIN * math.sqrt(products) * per_product * scale, precision, products, inner, scale)


def preload() -> None:
    """What building an Anchor imports (transformers' Llama), imported ahead of the first one."""
    from transformers import LlamaForCausalLM  # noqa: F401


class Anchor:
    def __init__(self, checkpoint: str, device: str = "cpu"):
        from transformers import LlamaForCausalLM

        self.device = device
        self.model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                      attn_implementation="eager").to(device).eval()
        probe = [1 + (7 * i) % (self.model.config.vocab_size - 1) for i in range(PROBE_TOKENS)]
        self.scale = float(self.logits(probe).abs().max())

    @torch.inference_mode()
    def logits(self, sequence: list[int]) -> torch.Tensor:
        """[len(sequence), vocab] fp32 logits on the CPU: row i predicts the token after position i."""
        ids = torch.tensor([sequence], device=self.device)
        return self.model(input_ids=ids).logits[0].float().cpu()

    def tolerance(self, precision: str, preset: str) -> Tolerance:
        return tolerance(precision, preset, self.scale)

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
