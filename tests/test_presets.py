"""The harness's checkpoints leave no default untested (harness/expectations/presets.py): on every
preset the numerical anchor runs on, each field transformers' Llama reads differs from
transformers' own default, the weights it starts at a constant are drawn, and a tied checkpoint
has no head of its own; a changed preset is a new checkpoint folder, never an old one reused.

Defaults come from transformers' LlamaConfig itself, not from the presets under test.
"""
import json

import pytest
import torch
from transformers import LlamaConfig

from harness.expectations import presets

# Sizes an engine cannot ignore: a wrong one does not load. (num_key_value_heads and head_dim,
# whose defaults are derived from them, are held apart below.)
SHAPES = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}
DERIVED = {"num_key_value_heads", "head_dim"}


def defaults_of(config) -> dict:
    """transformers' default for every field LlamaConfig declares, for this preset's shape."""
    values = {field: getattr(LlamaConfig(), field) for field in LlamaConfig.__annotations__}
    values.update(num_key_value_heads=config.num_attention_heads,
                  head_dim=config.hidden_size // config.num_attention_heads)
    return values


def test_every_field_llama_declares_is_judged():
    """A field a newer transformers adds must be set, or said to be inert, before it can hide a bug."""
    judged = SHAPES | DERIVED | set(presets.INERT) | {"rope_parameters"} | set(presets.NOT_DEFAULT) | {
        "hidden_act", "max_position_embeddings"}
    assert set(LlamaConfig.__annotations__) <= judged, set(LlamaConfig.__annotations__) - judged


@pytest.mark.parametrize("name", presets.ANCHORED)
def test_no_field_the_forward_reads_is_at_its_default(name):
    config = presets.hf_config(name)
    defaults, kept = defaults_of(config), presets.KEPT_AT_DEFAULT.get(name, {})
    at_default = [field for field in LlamaConfig.__annotations__
                  if field not in SHAPES | set(presets.INERT) | {"rope_parameters"} | set(kept)
                  and getattr(config, field) == defaults[field]]
    assert not at_default, f"preset {name!r} leaves {at_default} at transformers' default"
    rope = config.rope_parameters
    assert rope["rope_type"] != "default" and rope["rope_theta"] != LlamaConfig().rope_parameters["rope_theta"], rope
    assert all(getattr(config, field) == defaults[field] for field in kept), "a field said to be kept is not"


def test_the_weights_transformers_starts_at_a_constant_are_drawn(tmp_path):
    model = presets.seeded_model("tiny")
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    assert norms and not any(torch.equal(p, torch.ones_like(p)) for p in norms)
    assert len(biases) == 7 * presets.preset("tiny").layers and all(bool(p.abs().min() > 0) for p in biases)
    folder = presets.checkpoint("tiny", root=tmp_path)
    from safetensors.torch import load_file

    assert "lm_head.weight" not in load_file(folder / "model.safetensors"), "a tied checkpoint carries no head"
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True


def test_a_changed_preset_is_a_new_checkpoint(monkeypatch):
    before = presets.fingerprint("tiny")
    monkeypatch.setitem(presets.NOT_DEFAULT, "rms_norm_eps", 1e-4)
    assert presets.fingerprint("tiny") != before
    monkeypatch.setattr(presets, "WEIGHT_RECIPE", presets.WEIGHT_RECIPE + 1)
    monkeypatch.setitem(presets.NOT_DEFAULT, "rms_norm_eps", 1e-5)
    assert presets.fingerprint("tiny") != before
