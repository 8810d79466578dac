"""Turning anything a runtime hands back (values, exceptions) into bounded text, whatever it does.

A runtime's objects can have a `__repr__` or `__str__` that raises (anything: SystemExit and
KeyboardInterrupt included), returns something that is not a string, or returns megabytes.
Everything the harness prints from a runtime goes through here, and nothing here raises.
A `__repr__` that never returns is out of reach; the test's timeout (harness.reliability.robustness) bounds it.
"""
from __future__ import annotations

LIMIT = 2000  # characters


def bounded(text: str, limit: int = LIMIT) -> str:
    """The text, or its two ends with how much was cut between them."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} ... [{len(text) - limit} characters cut] ... {text[-(limit // 2):]}"


def _call_text(method, value) -> str:
    text = method(value)
    if not isinstance(text, str):
        raise TypeError(f"returned {type_name(text)}, not str")
    return text


def safe_repr(value, limit: int = LIMIT) -> str:
    try:
        text = _call_text(repr, value)
    except BaseException as exc:  # noqa: BLE001 - a failing repr must not take the harness down
        text = f"<{type_name(value)} object; repr() raised {type_name(exc)}>"
    return bounded(text, limit)


def safe_str(value, limit: int = LIMIT) -> str:
    try:
        text = _call_text(str, value)
    except BaseException:  # noqa: BLE001
        return safe_repr(value, limit)
    return bounded(text, limit)


def describe_exception(exc: BaseException, limit: int = LIMIT) -> str:
    """`Type: message`, first line only where the message has many; never raises."""
    try:
        message = _call_text(str, exc)
    except BaseException as failure:  # noqa: BLE001
        message = f"<str() of the exception raised {type_name(failure)}>"
    lines = message.strip().splitlines()
    first = lines[0].strip() if lines else ""
    more = f" [+{len(lines) - 1} more lines]" if len(lines) > 1 else ""
    return bounded(f"{type_name(exc)}: {first}{more}" if first else type_name(exc), limit)


def type_name(value) -> str:
    try:
        name = type(value).__qualname__
        return name if isinstance(name, str) else "object"
    except BaseException:  # noqa: BLE001
        return "object"
