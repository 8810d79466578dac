"""Model presets and the harness's own Hugging Face checkpoints of them.

A preset is a Llama shape; with a seed it is a set of weights: a randomly initialised
`transformers` LlamaForCausalLM, saved as a checkpoint folder (config.json + safetensors, no
tokenizer, no hub). Runtimes that declare `loads_checkpoint` are handed that folder, and the
numerical anchor (harness.expectations.anchor) computes the expected logits from the same folder with
transformers' own forward, independently of the engine under test.

No default is left untested: every config field the Llama forward reads is set away from
transformers' default (`NOT_DEFAULT`, and each preset's shape: head_dim is not hidden / heads,
fewer key-value heads than heads, an activation other than silu), and the weights transformers
would initialise to a constant (norm weights to one, biases to zero) are drawn too. An engine that
ignores a field, or a norm weight, and assumes the common default then computes other numbers
than transformers. `tests/test_presets.py` holds every preset the anchor runs on to that, and
`tests/broken_example_engines.py` has an engine per field that uses the default instead.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# The fields every preset sets away from transformers' LlamaConfig defaults (named there in the
# comments). RoPE is Llama 3.1's scaled kind; its pretraining length is max_positions / factor.
NOT_DEFAULT = dict(
    rms_norm_eps=1e-5,  # default 1e-6
    tie_word_embeddings=True,  # default False: the checkpoint has no lm_head.weight
    attention_bias=True,  # default False: q, k, v and o projections have biases
    mlp_bias=True,  # default False: gate, up and down projections have biases
)
ROPE = dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0)  # rope_theta: the preset's
# transformers' LlamaConfig leaves these as they are; each does nothing in an inference forward.
INERT = {
    "attention_dropout": "dropout runs in training only",
    "pretraining_tp": "not read by transformers 5's Llama",
    "use_cache": "the anchor runs whole sequences without a cache",
    "pad_token_id": "only zeroes an embedding row at initialisation, which the weights already carry",
    "bos_token_id": "a tokenizer's concern", "eos_token_id": "a tokenizer's concern",
    "initializer_range": "scales the weights drawn at initialisation (Preset.init_std); no forward reads it",
}
# The presets the numerical anchor runs on (--preset): tiny, and small where an engine cannot run
# tiny's shapes. Each is held to NOT_DEFAULT by tests/test_presets.py, save what KEPT_AT_DEFAULT says.
ANCHORED = ("tiny", "small")
KEPT_AT_DEFAULT = {"small": {"hidden_act": "vLLM runs the anchor on small, and its Llama implements silu only"}}
WEIGHT_RECIPE = 2  # bump when seeded_model draws weights differently: the checkpoint folder's name changes


@dataclass(frozen=True)
class Preset:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # never hidden / heads: an engine that derives it from them must fail
    intermediate: int
    vocab: int
    max_positions: int
    hidden_act: str = "gelu_pytorch_tanh"  # default "silu"
    # The weights' scale (transformers' initializer_range, default 0.02). The tiny model's are larger so
    # that its attention is sharp enough for a RoPE error to show in the logits.
    init_std: float = 0.02
    rope_theta: float = 500_000.0  # default 10000; Llama 3's


PRESETS = {
    # max_positions is the suites' max_model_len, so their longest requests reach the model's last position.
    # Heads 8 wide (a quarter of the cost of 16 in attention); a theta that puts one of their four
    # frequencies between Llama 3.1's bands, so RoPE's blend runs too.
    "tiny": Preset(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=8, intermediate=128, vocab=256,
                   max_positions=128, init_std=0.05, rope_theta=500.0),
    # The preset vLLM's engine runs the anchor on: its heads stay 64 wide (vLLM's Triton attention refuses
    # some sizes), and its activation stays silu (KEPT_AT_DEFAULT).
    "small": Preset(layers=8, hidden=512, heads=16, kv_heads=4, head_dim=64, intermediate=1408, vocab=32000,
                    max_positions=1024, hidden_act="silu"),
    # The benchmark lane's alone (no anchor runs on it): its shape is kept so its timings stay comparable.
    "medium": Preset(layers=24, hidden=1024, heads=16, kv_heads=8, head_dim=64, intermediate=2816, vocab=32000,
                     max_positions=4096, hidden_act="silu"),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return PRESETS[name]


def config_fields(name: str) -> dict:
    """The LlamaConfig keyword arguments of a preset."""
    p = preset(name)
    rope = dict(ROPE, rope_theta=p.rope_theta, original_max_position_embeddings=int(p.max_positions // ROPE["factor"]))
    return dict(vocab_size=p.vocab, hidden_size=p.hidden, intermediate_size=p.intermediate,
                num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
                head_dim=p.head_dim, max_position_embeddings=p.max_positions, hidden_act=p.hidden_act,
                rope_parameters=rope, initializer_range=p.init_std, **NOT_DEFAULT, **rope_4x(rope))


def rope_4x(rope: dict) -> dict:
    """The same RoPE in the keys transformers 4.x reads (`rope_theta` beside `rope_scaling`): 4.x
    ignores `rope_parameters`, and 5.x reads these two where `rope_parameters` is absent. The
    checkpoint's config.json carries both forms, so an engine on either release reads one RoPE."""
    return dict(rope_theta=rope["rope_theta"], rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"})


def rope_of(config) -> dict:
    """The RoPE a loaded transformers config will apply: `rope_parameters` (5.x) or `rope_scaling`
    with `rope_theta` (4.x)."""
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    if not parameters.get("rope_type") or parameters.get("rope_type") == "default":
        parameters = dict(getattr(config, "rope_scaling", None) or {}, rope_theta=getattr(config, "rope_theta", None))
    return parameters


def untrusted_transformers(name: str = "tiny") -> str | None:
    """Why this transformers cannot be the anchor's forward, or None: the config it builds from the
    checkpoint's fields must apply the RoPE the checkpoint declares (a release that drops it would
    blame every engine for the harness's wrong expectation)."""
    import transformers

    declared = config_fields(name)["rope_parameters"]
    loaded = rope_of(hf_config(name))
    wrong = {k: (v, loaded.get(k)) for k, v in declared.items() if loaded.get(k) != v}
    if not wrong:
        return None
    return (f"transformers {transformers.__version__} does not build the checkpoint's RoPE "
            f"({', '.join(f'{k}: declared {v!r}, got {got!r}' for k, (v, got) in wrong.items())}); "
            "the numerical anchor cannot trust its forward: install a transformers pyproject.toml allows "
            "that reads rope_parameters or rope_scaling")


def hf_config(name: str):
    """The transformers LlamaConfig of a preset."""
    from transformers import LlamaConfig

    return LlamaConfig(**config_fields(name))


def seeded_model(name: str, seed: int = 0):
    """A randomly initialised LlamaForCausalLM (fp32, CPU, eager attention); same seed, same weights."""
    import torch
    from transformers import LlamaForCausalLM

    config = hf_config(name)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only: torch.manual_seed would reseed every CUDA device too, which
        # fork_rng(devices=[]) does not put back (harness.reliability.isolation counts that as taint).
        torch.default_generator.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    # transformers starts biases at zero and norm weights at one: an engine that drops either would
    # compute the same numbers. Drawn from a generator of their own, so the other weights stay as they were.
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter_name.endswith(".bias"):
                parameter.copy_(noise * config.initializer_range)
            elif parameter_name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * noise)
    return model


def fingerprint(name: str) -> str:
    """Names what a checkpoint holds: a changed preset or weight recipe is a new folder, never an old one reused."""
    text = json.dumps([asdict(preset(name)), config_fields(name), WEIGHT_RECIPE], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


@functools.lru_cache(maxsize=None)
def _transformers_version() -> str:
    """Asked once a process: the engine factory names the checkpoint for every engine it configures,
    and importlib.metadata reads every installed distribution's metadata to answer."""
    from importlib import metadata

    return metadata.version("transformers")


def checkpoint(name: str, seed: int = 0, root: str | os.PathLike | None = None) -> Path:
    """The checkpoint folder of a preset and seed, written once and shared by every process
    (`written_once`)."""

    def write(staging: Path) -> None:
        seeded_model(name, seed).save_pretrained(staging, safe_serialization=True)
        written = json.loads((staging / "config.json").read_text())
        fields = config_fields(name)
        written.update(rope_parameters=fields["rope_parameters"], **rope_4x(fields["rope_parameters"]))  # both releases' keys
        (staging / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")

    folder = checkpoint_root(root) / f"{name}-seed{seed}-transformers{_transformers_version()}-{fingerprint(name)}"
    return written_once(folder, "config.json", write)


def checkpoint_root(root: str | os.PathLike | None = None) -> Path:
    """Where the harness's checkpoints and adapters live: `root`, else $CUDAGRAPH_CHECKPOINTS, else
    a folder in the system's temporary directory."""
    return Path(root or os.environ.get("CUDAGRAPH_CHECKPOINTS") or Path(tempfile.gettempdir()) / "cudagraph-checkpoints")


def written_once(folder: Path, marker: str, write) -> Path:
    """`folder`, written by `write(staging)` unless `folder/marker` is there already: written aside,
    then renamed into place, so concurrent writers (xdist workers) never see half of it."""
    if (folder / marker).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    write(staging)
    try:
        staging.rename(folder)
    except OSError:  # another process got there first; what it wrote is the same
        shutil.rmtree(staging, ignore_errors=True)
    return folder


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "ANCHORED", "NOT_DEFAULT", "ROPE", "WEIGHT_RECIPE", "Preset", "PRESETS", "preset",
    "config_fields", "hf_config", "seeded_model", "fingerprint", "checkpoint", "checkpoint_root", "written_once", "rope_of",
    "untrusted_transformers",
]
