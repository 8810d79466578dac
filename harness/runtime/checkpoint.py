"""One verdict for a checkpoint the engine cannot load.

An engine that cannot load the harness's checkpoint (it lacks llama3 RoPE, a activation, biases)
raises `harness.protocol.UnsupportedCheckpoint` from `build()`, naming what it lacks. The first
such build ends its test as a skip with one reason, and every later build that needs the checkpoint
skips with the same reason without asking the engine again: pytest folds them into one summary
line with their count, the report counts them under `checkpoint`, and the tests that need no
checkpoint run as before. Any other error from `build()` stays that test's failure.
"""
from __future__ import annotations

import pytest

from harness.expectations import presets
from harness.protocol import UnsupportedCheckpoint

# The refusal's reason, once this process has seen one (each xdist worker learns it on its own).
REFUSED: dict[str, str] = {}
MARK = "cannot load the harness's checkpoint"  # in every such skip's reason: the report counts them


def version(preset: str) -> str:
    """The checkpoint's version: its preset, weight recipe and fingerprint (a changed field or
    recipe is a new version)."""
    return f"{preset} recipe {presets.WEIGHT_RECIPE} ({presets.fingerprint(preset)})"


def build(runtime, config):
    """`runtime.build(config)`, or a skip naming the refusal where the engine refused the checkpoint."""
    if config.checkpoint is None:
        return runtime.build(config)
    if config.preset not in REFUSED:
        try:
            return runtime.build(config)
        except UnsupportedCheckpoint as exc:
            REFUSED[config.preset] = (f"runtime {runtime.name!r} {MARK} {version(config.preset)}: {exc} "
                                      "(not run: every test that needs the checkpoint; docs/authoring.md, "
                                      "'The checkpoint')")
    pytest.skip(REFUSED[config.preset])  # one call site: pytest folds every such skip into one line


def report_entry(runtime, preset: str, tests: list[dict]) -> dict:
    """The report's `checkpoint`: its version, and the refusal with the number of tests not run."""
    refused = [t for t in tests if t.get("outcome") == "skipped" and MARK in (t.get("reason") or "")]
    return {"preset": preset, "version": version(preset) if runtime.capabilities.loads_checkpoint else None,
            "refused": refused[0]["reason"] if refused else None, "not_run": len(refused)}


def transformers_problem(runtime, preset: str = "tiny") -> str | None:
    """Why this session's transformers cannot give the anchor's expected logits, or None; asked at
    configure time, for runtimes the anchor runs on, so the run refuses in one line instead of
    blaming the runtime for every anchored step."""
    if not runtime.capabilities.loads_checkpoint or preset not in presets.ANCHORED:
        return None
    return presets.untrusted_transformers(preset)
