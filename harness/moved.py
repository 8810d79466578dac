"""Modules that moved and protocol names that were renamed, kept working for at least one minor release.

Each old path is a one-line shim (`harness/presets.py` and so on) that calls `alias`: the import
warns with a DeprecationWarning naming the new path, then hands back the new module itself, so
old and new names share one module and its state. CHANGELOG.md lists each move under Deprecated.
"""
from __future__ import annotations

import functools
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
    # 0.4.0's floors (docs/architecture.md): moved above the rooms that import them
    "harness.scenarios.ranks": "harness.runtime.ranks",
    "harness.reliability.supervisor": "harness.supervisor",
}
MOVED_IN = {"harness.scenarios.ranks": "0.4.0", "harness.reliability.supervisor": "0.4.0"}  # else SINCE


def deprecation(old: str, use: str, until: str, moved_in: str | None = None) -> str:
    """Every deprecation's words: the old name, what to use instead (where it moved, in which
    release), and the earliest release that may drop it."""
    head = f"{old} moved to {use} in {moved_in}; import {use} instead" if moved_in else f"{old} is deprecated: use {use}"
    return f"{head} ({old} may be removed in {until}; see CHANGELOG.md)"


def message(old: str) -> str:
    until = NAMES_REMOVED_IN if old in MOVED_IN else REMOVED_IN
    return deprecation(old, MOVED[old], until, f"harness {MOVED_IN.get(old, SINCE)}")


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


# -- renamed names ------------------------------------------------------------------------------
# Fields and keywords of the protocol's dataclasses renamed after 0.3.0 (one name per size: real and
# padded counts named as such). Each old name stays a read-only alias and a constructor keyword,
# both warning with the new name, until NAMES_REMOVED_IN.
NAMES_REMOVED_IN = "0.6.0"
RENAMED: dict[str, str] = {}  # "Class.old" -> "Class.new", for the docs' and the changelog's test
# Names replaced by a value of another shape (harness/protocol.py converts each): "Class.old" -> "Class.new".
REPLACED: dict[str, str] = {}


# Names that moved to another module (0.4.0's floors moved the engine factory out of the step
# proxy's module): "old.module.Name" -> "new.module.Name". The old module reads each through
# `names_moved`, with a DeprecationWarning, until NAMES_REMOVED_IN.
NAMES_MOVED: dict[str, str] = {}


def names_moved(old_module: str, new_module: str, names: tuple[str, ...], since: str):
    """A module `__getattr__` for `old_module`: each of `names` is read from `new_module` (imported on
    first use, so the new module may import the old one) with a DeprecationWarning naming it."""
    for name in names:
        NAMES_MOVED[f"{old_module}.{name}"] = f"{new_module}.{name}"

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(deprecation(f"{old_module}.{name}", f"{new_module}.{name}", NAMES_REMOVED_IN, f"harness {since}"),
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_module), name)
    return __getattr__


# A plugin's modules that moved to another package (0.5.0: vLLM's V1 runtime into a plugin of its own):
# old module -> (new module, the release that moved it). Each old path is a shim calling `module_moved`.
MODULES_MOVED: dict[str, tuple[str, str]] = {}


def module_moved(old: str, new: str, since: str):
    """Make the module `old` (being imported now) the module `new`, with a DeprecationWarning naming it,
    until NAMES_REMOVED_IN; returns the new module."""
    MODULES_MOVED[old] = (new, since)
    warnings.warn(deprecation(old, new, NAMES_REMOVED_IN, since), DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


def name_message(owner: str, old: str, new: str) -> str:
    return deprecation(f"{owner}.{old}", f"{owner}.{new}", NAMES_REMOVED_IN)


def renamed(**old_to_new: str):
    """Class decorator for a dataclass: each old name reads the new field, and the constructor takes
    it as a keyword, each with a DeprecationWarning naming the new name (blamed on the caller)."""
    def decorate(cls):
        owner, init = cls.__name__, cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:  # the old name wins: dataclasses.replace(value, old=...) passes both
                    warnings.warn(name_message(owner, old, new), DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        for old, new in old_to_new.items():
            setattr(cls, old, property(_alias_of(owner, old, new), doc=f"Deprecated alias of {new}."))
            RENAMED[f"{owner}.{old}"] = f"{owner}.{new}"
        return cls
    return decorate


def _alias_of(owner: str, old: str, new: str):
    def read(self):
        warnings.warn(name_message(owner, old, new), DeprecationWarning, stacklevel=2)
        return getattr(self, new)
    return read
