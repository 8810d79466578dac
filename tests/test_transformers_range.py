"""The checkpoint's RoPE reaches transformers 4.x and 5.x alike (both key forms in config.json),
and a transformers that drops it is refused at configure time in one line, never blamed on the
runtime as anchor failures."""
import json
import textwrap
from pathlib import Path

from harness.expectations import presets

ROOT = Path(__file__).resolve().parent.parent


def test_config_json_carries_both_forms_of_the_rope(tmp_path):
    written = json.loads((presets.checkpoint("tiny", root=tmp_path) / "config.json").read_text())
    declared = presets.config_fields("tiny")["rope_parameters"]
    assert written["rope_parameters"] == declared
    assert dict(written["rope_scaling"], rope_theta=written["rope_theta"]) == declared
    assert presets.untrusted_transformers("tiny") is None  # this session's transformers applies it


def test_a_transformers_that_drops_the_rope_is_named(monkeypatch):
    from transformers import LlamaConfig

    fields = {k: v for k, v in presets.config_fields("tiny").items()
              if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    monkeypatch.setattr(presets, "hf_config", lambda name: LlamaConfig(**fields))  # what 4.57 built from 0.1's fields
    problem = presets.untrusted_transformers("tiny")
    assert problem is not None and "does not build the checkpoint's RoPE" in problem and "rope_type" in problem
    assert "\n" not in problem


def test_the_run_refuses_in_one_line(pytester):
    pytester.syspathinsert()
    pytester.makepyfile(drop_rope=textwrap.dedent("""
        from transformers import LlamaConfig
        from harness.expectations import presets
        fields = {k: v for k, v in presets.config_fields("tiny").items()
                  if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
        presets.hf_config = lambda name: LlamaConfig(**fields)
    """))
    result = pytester.runpytest_subprocess(str(ROOT / "suites" / "test_numerical_anchor.py"), "--runtime", "reference",
                                           "-p", "drop_rope", "-p", "no:cacheprovider", "-p", "no:xdist",
                                           "--rootdir", str(pytester.path))
    assert result.ret == 4  # a usage error: nothing ran, nothing blamed on the runtime
    errors = [line for line in result.stderr.lines if "does not build the checkpoint's RoPE" in line]
    assert len(errors) == 1 and "failed" not in result.stdout.str()
