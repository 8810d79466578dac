"""Assertion helpers: every failure names the invariant, the runtime, the case, the first
difference and a command that reproduces it."""
from __future__ import annotations

import os
import shlex
from dataclasses import fields, is_dataclass

import pytest


# What `--runtime` said, set by the plugin: the reproduction must select the same runtime,
# which may be `package.module:factory` rather than the runtime's display name.
RUNTIME_OPTION: str | None = None


def reproduce_command(runtime=None) -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    nodeid = current.rsplit(" (", 1)[0] if current else "<test id>"
    command = f"pytest {shlex.quote(nodeid)}"
    selected = RUNTIME_OPTION or (getattr(runtime, "name", None) if runtime is not None else None)
    if selected:
        command += f" --runtime {shlex.quote(selected)}"
    return command


def describe(value) -> str:
    """A dataclass shown by its non-default fields, so a config reads as what is special about it."""
    if is_dataclass(value) and not isinstance(value, type):
        parts = []
        for f in fields(value):
            current = getattr(value, f.name)
            if f.default is not current and f.default != current:
                parts.append(f"{f.name}={current!r}")
        return f"{type(value).__name__}({', '.join(parts)})"
    return repr(value)


def first_difference(actual, expected) -> str | None:
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        for index, (a, e) in enumerate(zip(actual, expected)):
            if a != e:
                return f"at index {index}: expected {e!r}, got {a!r}"
        if len(actual) != len(expected):
            return f"length: expected {len(expected)}, got {len(actual)}"
        return None
    if is_dataclass(actual) and is_dataclass(expected) and type(actual) is type(expected):
        for f in fields(actual):
            a, e = getattr(actual, f.name), getattr(expected, f.name)
            if a != e:
                inner = first_difference(a, e)
                return f"{f.name}: " + (inner if inner else f"expected {e!r}, got {a!r}")
        return None
    return None if actual == expected else f"expected {expected!r}, got {actual!r}"


def violation(invariant: str, runtime, what: str, *, case=None, expected=None, actual=None,
              difference: str | None = None) -> str:
    lines = [f"[{invariant}] runtime {getattr(runtime, 'name', runtime)!r}: {what}"]
    if case is not None:
        lines.append(f"  case:     {describe(case) if not isinstance(case, str) else case}")
    if expected is not None or actual is not None:
        lines.append(f"  expected: {expected!r}")
        lines.append(f"  actual:   {actual!r}")
    if difference:
        lines.append(f"  first difference: {difference}")
    lines.append(f"  reproduce: {reproduce_command(runtime)}")
    return "\n".join(lines)


def expect_equal(actual, expected, *, invariant: str, runtime, what: str, case=None) -> None:
    difference = first_difference(actual, expected)
    if difference is not None:
        pytest.fail(violation(invariant, runtime, what, case=case, expected=expected, actual=actual,
                              difference=difference), pytrace=False)


def expect(condition: bool, *, invariant: str, runtime, what: str, case=None, **details) -> None:
    if not condition:
        message = violation(invariant, runtime, what, case=case)
        if details:
            message += "\n" + "\n".join(f"  {k}: {v!r}" for k, v in details.items())
        pytest.fail(message, pytrace=False)


def expect_error(call, *, invariant: str, runtime, what: str, case=None, mentions: tuple[str, ...] = ()):
    """The runtime must reject the case with a ValueError whose message names what is wrong."""
    try:
        result = call()
    except ValueError as exc:
        text = str(exc)
        missing = [word for word in mentions if word.lower() not in text.lower()]
        expect(not missing, invariant=invariant, runtime=runtime, case=case,
               what=f"{what}: the error message should mention {missing}", message=text)
        return exc
    pytest.fail(violation(invariant, runtime, f"{what}: expected a ValueError, got a result", case=case,
                          actual=result), pytrace=False)
