"""Finding runtimes: the entry-point group, the plugin hook, and `package.module:factory`."""
from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

from harness.protocol import Capabilities, RuntimeUnavailable
from harness.runtime import validate
from harness.reliability.safe import describe_exception, safe_repr

ENTRY_POINT_GROUP = "cudagraph_conformance.runtimes"
DEFAULT_RUNTIME = "reference"


class RuntimeLoadError(Exception):
    pass


@dataclass
class RuntimeEntry:
    name: str
    origin: str  # where it came from, for messages
    factory: Callable | None = None
    error: str | None = None  # why it could not be loaded


def discover(pluginmanager=None, only: str | None = None) -> dict[str, RuntimeEntry]:
    """Every runtime this environment offers, loaded or with the reason it could not be; with
    `only`, the entry points of that name alone are loaded (another package's runtime may import
    torch or an engine: a run must not pay for runtimes it does not use)."""
    entries: dict[str, RuntimeEntry] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if only is not None and ep.name != only:
            continue
        origin = f"entry point {ep.value}"
        try:
            entries[ep.name] = RuntimeEntry(ep.name, origin, factory=ep.load())
        except Exception as exc:  # a broken package must not hide the others
            entries[ep.name] = RuntimeEntry(ep.name, origin, error=describe_exception(exc))
    if pluginmanager is not None:
        for plugin_result in pluginmanager.hook.pytest_cudagraph_runtimes():
            for name, factory in dict(plugin_result or {}).items():
                if name in entries and entries[name].factory is not factory:
                    raise RuntimeLoadError(
                        f"runtime name {name!r} is offered twice: by {entries[name].origin} and by a "
                        "pytest_cudagraph_runtimes hook; rename one of them"
                    )
                entries[name] = RuntimeEntry(name, "pytest_cudagraph_runtimes hook", factory=factory)
    return entries


def resolve(spec: str, pluginmanager=None, option: str = "--runtime"):
    """Turn `--runtime` (or the `option` a script names) into a runtime instance, or raise
    RuntimeLoadError with what would work."""
    if ":" in spec:
        factory = _import_factory(spec, option)
        origin = spec
    else:
        entry = discover(pluginmanager, only=spec).get(spec)
        if entry is None:
            raise RuntimeLoadError(f"unknown runtime {spec!r}. {describe_available(discover(pluginmanager))}")
        if entry.error:
            raise RuntimeLoadError(f"runtime {spec!r} ({entry.origin}) failed to import: {entry.error}")
        factory, origin = entry.factory, entry.origin
    try:
        runtime = factory()
    except RuntimeUnavailable as exc:
        raise RuntimeLoadError(f"runtime {spec!r} ({origin}) cannot start here: {exc}") from None
    except ModuleNotFoundError as exc:
        raise RuntimeLoadError(f"runtime {spec!r} ({origin}) cannot start here: {exc} (a package it needs is not "
                               "installed in this environment)") from None
    except Exception as exc:
        raise RuntimeLoadError(
            f"runtime {spec!r} ({origin}) failed to start: {describe_exception(exc)}\n{traceback.format_exc(limit=3)}"
        ) from None
    check(runtime, origin)
    return runtime


def describe_available(entries: dict[str, RuntimeEntry]) -> str:
    if not entries:
        return (
            "No runtimes are installed: install this project (pip install -e .) or register one through "
            f"the {ENTRY_POINT_GROUP!r} entry-point group, or pass --runtime package.module:factory."
        )
    lines = ["Available runtimes:"]
    for name in sorted(entries):
        entry = entries[name]
        state = f"failed to import: {entry.error}" if entry.error else entry.origin
        lines.append(f"  {name:<20} {state}")
    lines.append("or --runtime package.module:factory")
    return "\n".join(lines)


def check(runtime, origin: str) -> None:
    for attr in ("name", "version", "capabilities"):
        if not hasattr(runtime, attr):
            raise RuntimeLoadError(f"{origin} returned {safe_repr(runtime)}, which has no {attr!r}: not a runtime")
    for attr in ("name", "version"):  # they name reports and files, and appear in every message
        if not isinstance(getattr(runtime, attr), str) or not getattr(runtime, attr):
            raise RuntimeLoadError(f"{origin}: {attr} must be a non-empty str, got {safe_repr(getattr(runtime, attr))}")
    if not isinstance(runtime.capabilities, Capabilities):
        raise RuntimeLoadError(
            f"{origin}: capabilities must be a harness.protocol.Capabilities, got {type(runtime.capabilities).__name__}"
        )
    problem = validate.declarations(runtime.capabilities)
    if problem:
        raise RuntimeLoadError(f"{origin}: {problem}")


def _import_factory(spec: str, option: str):
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RuntimeLoadError(f"{option} {spec}: module {module_name!r} failed to import: {describe_exception(exc)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RuntimeLoadError(f"{option} {spec}: module {module_name!r} has no attribute {attr!r}") from None


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "ENTRY_POINT_GROUP", "DEFAULT_RUNTIME", "RuntimeLoadError", "RuntimeEntry", "discover",
    "resolve", "describe_available", "check",
]
