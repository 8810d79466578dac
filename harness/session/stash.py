"""Where this run's `Conformance` (harness.plugin) is kept: the config's stash, under one key.

The key lives here, below the plugin, so that the session's own pytest plugins (the anchor's helper)
find the run's choices without importing the plugin that registers them.
"""
from __future__ import annotations

import pytest

CONFORMANCE = pytest.StashKey["Conformance"]()


def conformance_of(config) -> "Conformance":  # noqa: F821 (harness.plugin.Conformance, a floor above)
    return config.stash[CONFORMANCE]
