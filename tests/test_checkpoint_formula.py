"""docs/authoring.md's llama3 RoPE formula, written out independently here, gives the frequencies
transformers computes for every anchored preset's checkpoint (the one an engine must match)."""
import math

import pytest
import torch

from harness.expectations import presets


def documented_inv_freq(fields: dict, head_dim: int) -> list[float]:
    theta, factor = fields["rope_theta"], fields["factor"]
    original = fields["original_max_position_embeddings"]
    low, high = fields["low_freq_factor"], fields["high_freq_factor"]
    result = []
    for i in range(head_dim // 2):
        inv = theta ** (-2 * i / head_dim)
        wavelen = 2 * math.pi / inv
        if wavelen > original / low:
            inv = inv / factor
        elif wavelen >= original / high:
            smooth = (original / wavelen - low) / (high - low)
            inv = (1 - smooth) * inv / factor + smooth * inv
        result.append(inv)
    return result


@pytest.mark.parametrize("name", presets.ANCHORED)
def test_the_documented_rope_formula_is_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fields = presets.config_fields(name)["rope_parameters"]
    assert fields["rope_type"] == "llama3"
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](presets.hf_config(name), "cpu")
    assert attention_factor == 1.0
    expected = torch.tensor(documented_inv_freq(fields, presets.preset(name).head_dim), dtype=torch.float64)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0)
    # the blend band is exercised: some frequency is neither kept nor divided by factor
    base = torch.tensor([fields["rope_theta"] ** (-2 * i / presets.preset(name).head_dim)
                         for i in range(len(expected))], dtype=torch.float64)
    ratio = expected / base
    assert ((ratio > 1 / fields["factor"] + 1e-9) & (ratio < 1 - 1e-9)).any() or name != "tiny"
