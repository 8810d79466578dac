"""The folder LMDeploy is pointed at: the harness's checkpoint with a tokenizer (harness.kit.
checkpoint). LMDeploy's model agent loads a tokenizer when it is made (`BaseModelAgent.__init__`:
`Tokenizer(model_path)`, for guided decoding), and the harness's checkpoints have none; this
runtime sends token ids, so it is never used (as the 2026-12-02 probe found,
../shared/lmdeploy_gpu/probe.py).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.kit.checkpoint import head_dim, with_tokenizer  # noqa: F401  (head_dim: runtime.py's name for it)


def model_dir(checkpoint: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The LMDeploy folder of a checkpoint folder, written once."""
    return with_tokenizer(checkpoint, root or Path(tempfile.gettempdir()) / "cudagraph-lmdeploy")


# LMDeploy's Triton attention multiplies each head with tl.dot, whose inner size must be 16 or more
# (Triton: "Input shapes should have M >= 1, N >= 1 and K >= 16"): narrower heads fail to compile.
MIN_HEAD_DIM = 16
