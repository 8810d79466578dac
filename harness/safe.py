"""Turning anything a runtime hands back (values, exceptions) into bounded text, whatever it does.

A runtime's objects can have a `__repr__` or `__str__` that raises, loops for ever on a huge
value, or returns megabytes. Everything the harness prints from a runtime goes through here.
"""
from __future__ import annotations

LIMIT = 2000  # characters


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} ... [{len(text) - limit} characters cut] ... {text[-limit // 2:]}"


def safe_repr(value, limit: int = LIMIT) -> str:
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError(f"__repr__ returned {type(text).__name__}")
    except BaseException as exc:  # noqa: BLE001 - a failing repr must not take the harness down
        if isinstance(exc, KeyboardInterrupt):
            raise
        text = f"<{_type_name(value)} object; repr() failed: {_type_name(exc)}>"
    return _bounded(text, limit)


def safe_str(value, limit: int = LIMIT) -> str:
    try:
        text = str(value)
        if not isinstance(text, str):
            raise TypeError(f"__str__ returned {type(text).__name__}")
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return safe_repr(value, limit)
    return _bounded(text, limit)


def describe_exception(exc: BaseException, limit: int = LIMIT) -> str:
    """`Type: message`, first line only where the message has many."""
    message = safe_str(exc, limit)
    first = message.splitlines()[0] if message.strip() else ""
    return f"{_type_name(exc)}: {first}" if first else _type_name(exc)


def _type_name(value) -> str:
    try:
        return type(value).__name__
    except BaseException:  # noqa: BLE001
        return "object"
