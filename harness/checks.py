"""The `check` fixture's object: every failure names the invariant, the runtime, the case, where
the expected value came from, the first difference and a command that reproduces it.

    def test_x(check, runtime):
        check.equal(runtime.padded_size(config, 5), 8, what="padded size of batch 5",
                    source=SPEC, case=config)
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest

from harness.reliability.safe import safe_repr
from harness.session.known_failures import DIFFERENCE_KEY

WINDOW = 8  # list elements shown on each side of the first difference


def describe(value) -> str:
    """A dataclass shown by its non-default fields, so a config reads as what is special about it."""
    if is_dataclass(value) and not isinstance(value, type):
        parts = [f"{f.name}={getattr(value, f.name)!r}" for f in fields(value)
                 if f.default is not getattr(value, f.name) and f.default != getattr(value, f.name)]
        return f"{type(value).__name__}({', '.join(parts)})"
    return value if isinstance(value, str) else safe_repr(value)


def first_difference(actual, expected) -> tuple[int | None, str] | None:
    """(index or None, text) of the first difference; None when equal."""
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        for index, (a, e) in enumerate(zip(actual, expected)):
            if a != e:
                return index, f"at index {index}: expected {safe_repr(e)}, got {safe_repr(a)}"
        if len(actual) != len(expected):
            return min(len(actual), len(expected)), f"length: expected {len(expected)}, got {len(actual)}"
        return None
    if is_dataclass(actual) and is_dataclass(expected) and type(actual) is type(expected):
        for f in fields(actual):
            a, e = getattr(actual, f.name), getattr(expected, f.name)
            if a != e:
                inner = first_difference(a, e)
                return None, f"{f.name}: " + (inner[1] if inner else f"expected {safe_repr(e)}, got {safe_repr(a)}")
        return None
    return None if actual == expected else (None, f"expected {safe_repr(expected)}, got {safe_repr(actual)}")


def window(value, around: int | None) -> str:
    """A long list shown as a window around `around`, with its length; anything else in full."""
    if not isinstance(value, (list, tuple)) or len(value) <= 2 * WINDOW + 1:
        return safe_repr(value)
    centre = around if around is not None else 0
    start, stop = max(0, centre - WINDOW), min(len(value), centre + WINDOW + 1)
    shown = ", ".join(safe_repr(v) for v in value[start:stop])
    before = f"... {start} before, " if start else ""
    after = f", ... {len(value) - stop} after" if stop < len(value) else ""
    return f"[{before}{shown}{after}] (length {len(value)}, from index {start})"


class Check:
    """Assertions for one test. Built by the `check` fixture; suites never format messages."""

    def __init__(self, invariant: str, runtime, reproduce: str, node=None):
        self.invariant = invariant
        self.runtime = runtime
        self.reproduce = reproduce
        self._node = node

    # -- the assertions ---------------------------------------------------------------------
    def equal(self, actual, expected, *, what: str, source: str, case=None) -> None:
        difference = first_difference(actual, expected)
        if difference is not None:
            index, text = difference
            self.fail(what, case=case, expected=window(expected, index), source=source,
                      actual=window(actual, index), difference=text)

    def that(self, condition, *, what: str, source: str | None = None, case=None, **details) -> None:
        if not condition:
            self.fail(what, case=case, source=source, **details)

    def rejects(self, call, *, what: str, source: str, case=None, mentions: tuple[str, ...] = ()):
        """The runtime must reject the case with a ValueError whose message names what is wrong."""
        try:
            result = call()
        except ValueError as exc:
            text = str(exc)
            missing = [word for word in mentions if word.lower() not in text.lower()]
            self.that(not missing, what=f"{what}: the error message should mention {missing}", source=source,
                      case=case, message=text)
            return exc
        self.fail(f"{what}: expected a ValueError, got a result", case=case, source=source, actual=safe_repr(result))

    def same_bits(self, actual, expected, *, what: str, source: str, case=None, **details) -> None:
        """Bit-equality of tensors (torch.equal, NaN by bit pattern); records the largest difference.
        `details` are lines of the failure message (a diagnosis the caller made)."""
        from harness.expectations.equality import first_mismatch, largest_difference

        mismatch = first_mismatch(actual, expected)
        if mismatch is not None:
            self.note_difference(largest_difference(actual, expected))
            self.fail(what, case=case, source=source, mismatch=mismatch, **details)

    # -- reporting --------------------------------------------------------------------------
    def note_difference(self, difference: float | None) -> None:
        """Remember the largest numeric deviation, for known-failure bounds (max_difference)."""
        if self._node is not None and difference is not None:
            self._node.stash[DIFFERENCE_KEY] = max(difference, self._node.stash.get(DIFFERENCE_KEY, 0.0))

    def message(self, what: str, *, case=None, source: str | None = None, expected=None, actual=None,
                difference: str | None = None, **details) -> str:
        lines = [f"[{self.invariant}] runtime {self.runtime.name!r}: {what}"]
        if case is not None:
            lines.append(f"  case:     {describe(case)}")
        if expected is not None:
            lines.append(f"  expected: {expected}" + (f"  (from {source})" if source else ""))
        elif source:
            lines.append(f"  expected by: {source}")
        if actual is not None:
            lines.append(f"  actual:   {actual}")
        if difference:
            lines.append(f"  first difference: {difference}")
        lines += [f"  {key}: {window(value, None) if isinstance(value, (list, tuple)) else safe_repr(value)}"
                  for key, value in details.items()]
        lines.append(f"  reproduce: {self.reproduce}")
        return "\n".join(lines)

    def fail(self, what: str, **parts) -> None:
        pytest.fail(self.message(what, **parts), pytrace=False)

    def skip(self, why: str) -> None:
        pytest.skip(f"runtime {self.runtime.name!r}: {why}")


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "Check", "describe", "first_difference", "window", "WINDOW",
]
