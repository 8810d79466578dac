"""The engine kit's checkpoint folder (harness/kit/checkpoint.py): a preset's checkpoint linked, with
a tokenizer over its vocabulary, written once; and the width of its attention heads."""
import json

import pytest

from harness.expectations import presets
from harness.kit.checkpoint import head_dim, with_tokenizer


def test_the_folder_links_the_checkpoint_has_a_tokenizer_over_its_vocabulary_and_is_written_once(tmp_path):
    from transformers import AutoTokenizer

    checkpoint = presets.checkpoint("tiny")
    folder = with_tokenizer(checkpoint, tmp_path / "engine")
    assert (folder / "config.json").is_symlink()
    assert (folder / "config.json").resolve() == (checkpoint / "config.json").resolve()
    assert with_tokenizer(checkpoint, tmp_path / "engine") == folder
    assert [p.name for p in (tmp_path / "engine").iterdir()] == [folder.name]  # no staging folder left behind
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == presets.preset("tiny").vocab and tokenizer.convert_tokens_to_ids("t5") == 5


def test_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        with_tokenizer(tmp_path, tmp_path / "engine")


def test_head_dim_is_the_configs_own_else_hidden_over_heads(tmp_path):
    assert head_dim(presets.checkpoint("tiny")) == presets.preset("tiny").head_dim  # not hidden / heads
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 512, "num_attention_heads": 8}))
    assert head_dim(tmp_path) == 64
