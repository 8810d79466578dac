"""The bucket engine (examples/bucket_engine) reading the harness's checkpoint wrong, one way each:
a config field ignored and transformers' default used instead, the head not tied, the softmax
scale from the wrong head width, the norm weights left at one. On a checkpoint of defaults (main
6b958b5's) every one computes transformers' numbers; on the harness's, where nothing is a default
(harness/expectations/presets.py), the numerical anchor catches each
(tests/test_broken_example_engines.py).
"""
from __future__ import annotations

import torch

from tests.broken_example_engines import Engine, broken
from bucket_engine.model import Llama

# field -> (the default used instead, whether it sits in rope_parameters). max_position_embeddings is
# not here: Llama 3.1's RoPE is the same at any length, so its default changes no number; it is the
# model's limit, which suites/test_context_end.py holds at its last position.
IGNORED_FIELDS = {
    "rms_norm_eps": (1e-6, False),
    "hidden_act": ("silu", False),
    "attention_bias": (False, False),
    "mlp_bias": (False, False),
    "rope_theta": (10000.0, True),
    "rope_type": ("default", True),  # plain RoPE: Llama 3.1's scaling ignored
}


def ignoring(field: str) -> type:
    default, in_rope = IGNORED_FIELDS[field]

    class _Model(Llama):
        @staticmethod
        def read_config(folder):
            config = Llama.read_config(folder)
            if in_rope:
                config["rope_parameters"] = {**config["rope_parameters"], field: default}
            else:
                config[field] = default
            return config

    name = "".join(part.title() for part in field.split("_"))
    engine = type(f"_Ignores{name}", (Engine,), {
        "model_class": _Model,
        "__doc__": f"Reads every config field but {field}, for which it takes transformers' default {default!r}."})
    return broken(f"ignores-{field.replace('_', '-')}", engine)


class _UntiedModel(Llama):
    def head(self, config, weights):
        # As loaders that skip names a checkpoint lacks leave the buffer they allocated.
        return weights.get("lm_head.weight", torch.zeros_like(weights["model.embed_tokens.weight"]))


class _HeadNotTied(Engine):
    """Ignores tie_word_embeddings: takes its head from lm_head.weight, and where a tied checkpoint
    has none, keeps the head it allocated (zeros here; uninitialised memory in engines that skip
    missing weights)."""

    model_class = _UntiedModel


class _ScaleFromHiddenSize(Engine):
    """Scales attention scores by (hidden_size / heads) ** -0.5, the head width when head_dim is
    left at its default, instead of the checkpoint's head_dim ** -0.5."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = (self.model.hidden // self.model.heads) ** -0.5


class _OnesForNorms(Llama):
    def __init__(self, folder, dtype, device):
        super().__init__(folder, dtype, device)
        self.final_norm = torch.ones_like(self.final_norm)
        for layer in self.layers:
            layer["input_norm"], layer["post_norm"] = torch.ones_like(layer["input_norm"]), torch.ones_like(layer["post_norm"])


class _NormWeightsNotLoaded(Engine):
    """Its loader misses the RMSNorm weights and keeps their initial ones (transformers starts them
    at one too, so a freshly initialised checkpoint cannot tell)."""

    model_class = _OnesForNorms




HeadNotTied = broken("head-not-tied", _HeadNotTied)
ScaleFromHiddenSize = broken("scale-from-hidden-size", _ScaleFromHiddenSize)
NormWeightsNotLoaded = broken("norm-weights-not-loaded", _NormWeightsNotLoaded)
IgnoresRmsNormEps, IgnoresHiddenAct, IgnoresAttentionBias, IgnoresMlpBias, IgnoresRopeTheta, IgnoresRopeType = (
    ignoring(field) for field in IGNORED_FIELDS)
MUTANTS = [IgnoresRmsNormEps, IgnoresHiddenAct, IgnoresAttentionBias, IgnoresMlpBias, IgnoresRopeTheta,
           IgnoresRopeType, HeadNotTied, ScaleFromHiddenSize, NormWeightsNotLoaded]
