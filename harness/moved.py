"""Modules that moved, kept importable at their old paths for at least one minor release.

Each old path is a one-line shim (`harness/presets.py` and so on) that calls `alias`: the import
warns with a DeprecationWarning naming the new path, then hands back the new module itself, so
old and new names share one module and its state. CHANGELOG.md lists each move under Deprecated.
"""
from __future__ import annotations

import importlib
import sys
import warnings

SINCE = "0.2.0"
REMOVED_IN = "0.3.0"  # the earliest release that may drop the shims

# old module -> new module (0.1.0 kept every harness module at the top; 0.2.0 gave each concern a room)
MOVED = {
    "harness.anchor": "harness.expectations.anchor",
    "harness.equality": "harness.expectations.equality",
    "harness.expected": "harness.expectations.expected",
    "harness.kv": "harness.expectations.kv",
    "harness.oracle": "harness.expectations.oracle",
    "harness.presets": "harness.expectations.presets",
    "harness.batches": "harness.scenarios.batches",
    "harness.distributed": "harness.runtime.ranks",
    "harness.serving": "harness.scenarios.serving",
    "harness.strategies": "harness.scenarios.strategies",
    "harness.boundary": "harness.runtime.boundary",
    "harness.observe": "harness.runtime.observe",
    "harness.registry": "harness.runtime.registry",
    "harness.validate": "harness.runtime.validate",
    "harness.isolation": "harness.reliability.isolation",
    "harness.robustness": "harness.reliability.robustness",
    "harness.safe": "harness.reliability.safe",
    "harness.watchdog": "harness.reliability.watchdog",
    "harness.measurements": "harness.reports.measurements",
    "harness.plots": "harness.reports.plots",
    "harness.records": "harness.reports.records",
    "harness.render": "harness.reports.render",
    "harness.report": "harness.reports.report",
    "harness.timing": "harness.reports.timing",
    "harness.hypothesis_profiles": "harness.session.hypothesis_profiles",
    "harness.known_failures": "harness.session.known_failures",
    "harness.machine": "harness.session.machine",
}


def message(old: str) -> str:
    return (f"{old} moved to {MOVED[old]} in harness {SINCE}; import {MOVED[old]} instead "
            f"({old} may be removed in {REMOVED_IN}; see CHANGELOG.md)")


# The old paths imported in this process. A runtime is imported while pytest configures, before
# pytest records warnings, and Python hides a DeprecationWarning raised outside __main__: the
# report header says each one once (header_lines), so an adopter sees it.
IMPORTED: list[str] = []


def alias(old: str) -> None:
    """Make the module `old` (being imported now) the new module, with a DeprecationWarning."""
    warnings.warn(message(old), DeprecationWarning, stacklevel=3)
    IMPORTED.append(old)
    sys.modules[old] = importlib.import_module(MOVED[old])


def header_lines() -> list[str]:
    return [f"deprecated: {message(old)}" for old in dict.fromkeys(IMPORTED)]
