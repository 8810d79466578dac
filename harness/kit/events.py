"""An event log for a runtime that drives a real engine: one line about each stage (build,
capture, a first step, a failure) to a logger and, where an environment variable names a file,
appended there, so that a GPU run that dies still says how far it got and how long each stage took."""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager


class EventLog:
    """`event(message)` and `timed(what)` for one runtime: `logger` names the package, `variable`
    the environment variable that may name the events file."""

    def __init__(self, logger: str, variable: str):
        self.name, self.variable = logger, variable
        self._log = logging.getLogger(logger)

    def event(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        self._log.info(line)
        path = os.environ.get(self.variable)
        if path:
            try:
                with open(path, "a") as handle:
                    handle.write(line + "\n")
            except OSError as exc:  # the log is a help, never a reason to fail a test
                print(f"{self.name}: cannot append to {path}: {exc}", file=sys.stderr)

    @contextmanager
    def timed(self, what: str):
        """The stage's seconds as an event, or FAILED with the error where it raises."""
        start = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            self.event(f"FAILED {what} after {time.perf_counter() - start:.1f}s: {type(exc).__name__}: {exc}")
            raise
        self.event(f"{what}: {time.perf_counter() - start:.1f}s")

    def trace_calls(self, owner, name: str, variable: str, label: str, describe) -> bool:
        """An opt-in probe: where the environment variable `variable` names part of a test id, wrap
        `owner.name` (once) so that every call made during such a test is one event, `label`, the test
        and `describe(*args, **kwargs)`'s line. Off, and nothing wrapped, where the variable is unset.
        A probe must not change the run it watches: a `describe` that raises is a "not traced" line."""
        wanted = os.environ.get(variable)
        if not wanted:
            return False
        original = getattr(owner, name)
        if getattr(original, "traced", False):
            return True

        def traced(*args, **kwargs):
            test = os.environ.get("PYTEST_CURRENT_TEST", "")
            if wanted in test:
                try:
                    line = describe(*args, **kwargs)
                except Exception as error:
                    line = f"not traced: {error!r}"
                self.event(f"{label} {test.split(' ')[0]} {line}")
            return original(*args, **kwargs)

        traced.traced = True
        setattr(owner, name, traced)
        return True


class _Collected(logging.Handler):
    def __init__(self, word: str):
        super().__init__(logging.WARNING)
        self.word, self.messages = word.lower(), []

    def emit(self, record):
        message = record.getMessage()
        if self.word in message.lower() and message not in self.messages:
            self.messages.append(message)


@contextmanager
def collected_warnings(logger: str, word: str):
    """The engine's warnings (WARNING or above on `logger`) that name `word`, each once, while active.
    A logger set above WARNING (VLLM_LOGGING_LEVEL=ERROR, say) is lowered to WARNING meanwhile: its
    level filters records before any handler sees them, and a downgrade's warning is the engine's word."""
    engine_logger = logging.getLogger(logger)
    handler, level = _Collected(word), engine_logger.level
    engine_logger.addHandler(handler)
    if level > logging.WARNING:
        engine_logger.setLevel(logging.WARNING)
    try:
        yield handler.messages
    finally:
        engine_logger.removeHandler(handler)
        engine_logger.setLevel(level)


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "EventLog", "collected_warnings",
]
