"""The harness's checkpoint as an engine reads it. The presets' checkpoints (harness.expectations.
presets) hold a config and weights, no tokenizer; an engine that loads a tokenizer when it is made
(LMDeploy's model agent does, for guided decoding) is given a folder of its own: the checkpoint's
files linked, not copied, plus a word-level tokenizer over the vocabulary ("t0" .. "t{vocab-1}").
A runtime sends token ids, so that tokenizer is never used.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


def with_tokenizer(checkpoint: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The checkpoint's folder with a tokenizer, under `root`, written once (concurrent writers race
    safely: each writes a private folder and renames it into place)."""
    checkpoint = Path(checkpoint).resolve()
    config = checkpoint / "config.json"
    if not config.is_file():
        raise ValueError(f"{checkpoint} is not a Hugging Face checkpoint folder: it has no config.json")
    root = Path(root)
    digest = hashlib.sha256(str(checkpoint).encode()).hexdigest()[:12]
    folder = root / f"{checkpoint.name}-{digest}"
    if (folder / TOKENIZER_FILE).exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    for item in checkpoint.iterdir():
        if item.is_file():
            os.symlink(item, staging / item.name)
    vocab = json.loads(config.read_text())["vocab_size"]
    write_tokenizer(staging, vocab)
    try:
        staging.rename(folder)
    except OSError:  # another process got there first: its folder is the same
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def head_dim(checkpoint: str | os.PathLike) -> int:
    """The width of the checkpoint's attention heads (config.json's head_dim, else hidden / heads)."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def write_tokenizer(folder: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(folder)


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "with_tokenizer", "head_dim",
]
