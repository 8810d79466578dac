"""The folder LMDeploy is pointed at: the harness's checkpoint (its files linked, not copied) plus
a tokenizer. LMDeploy's model agent loads a tokenizer when it is made (`BaseModelAgent.__init__`:
`Tokenizer(model_path)`, for guided decoding), and the harness's checkpoints have none. This
runtime sends token ids, so the tokenizer is never used: a word-level one over the preset's
vocabulary ("t0" .. "t{vocab-1}"), as the 2026-12-02 probe made (../shared/lmdeploy_gpu/probe.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


def model_dir(checkpoint: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The LMDeploy folder of a checkpoint folder, written once (concurrent writers race safely:
    each writes a private folder and renames it into place)."""
    checkpoint = Path(checkpoint).resolve()
    config = checkpoint / "config.json"
    if not config.is_file():
        raise ValueError(f"{checkpoint} is not a Hugging Face checkpoint folder: it has no config.json")
    root = Path(root or Path(tempfile.gettempdir()) / "cudagraph-lmdeploy")
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


# LMDeploy's Triton attention multiplies each head with tl.dot, whose inner size must be 16 or more
# (Triton: "Input shapes should have M >= 1, N >= 1 and K >= 16"): narrower heads fail to compile.
MIN_HEAD_DIM = 16


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
