"""The garbage collector around a session (harness/session/process_exit.py). When the tests start,
one collection, then what is alive frozen, so that the harness's full collections walk only what
the tests made; at the end of the process, the same, so that pytest's own passes and the
interpreter's walk nothing. What pytest's passes were for still happens: an exception raised in a
finalizer of the session's garbage is reported. A session run inside a test leaves the collector
to the session around it."""
from __future__ import annotations

import gc
from pathlib import Path

from tests.test_hostile_runtimes import PLUGIN, importable_from_anywhere  # noqa: F401 (a fixture)

LEAVES_A_CYCLE = '''
import gc


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        raise ValueError("raised in a finalizer at the end")


def test_leaves_garbage_with_a_raising_finalizer():
    gc.disable()  # no collection before the end of the session finds it
    Cycle()
    gc.enable()
'''

# Where the process ends: whether the collector's objects were frozen by then.
CONFTEST = '''
import atexit
import gc

import harness.session.process_exit as process_exit


@atexit.register
def _frozen_at_exit():
    with open("frozen-at-exit.txt", "w") as out:
        out.write(str(gc.get_freeze_count() > 0))
'''
# A process end built to slip past the check: frozen without the collection first.
SKIPS_THE_COLLECTION = '''
import types

process_exit.gc = types.SimpleNamespace(collect=lambda: 0, freeze=gc.freeze, unfreeze=gc.unfreeze,
                                        isenabled=gc.isenabled)
'''


def run_ending(pytester, conftest: str):
    pytester.makeconftest(CONFTEST + conftest)
    pytester.makepyfile(test_cycle=LEAVES_A_CYCLE)
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "-p", "no:xdist")


def test_an_exception_in_a_finalizer_at_the_end_is_reported_and_the_process_ends_frozen(pytester):
    result = run_ending(pytester, "")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output[-3000:]
    assert "PytestUnraisableExceptionWarning" in output and "raised in a finalizer at the end" in output, output[-3000:]
    assert (Path(pytester.path) / "frozen-at-exit.txt").read_text() == "True"


# The harness's end without its collection, run ahead of every other plugin's end: pytest from 9.2
# collects in its own pytest_unconfigure, before the harness's (trylast), and would find the garbage
# first; before 9.2 it collects only after every plugin's end. Run first, the variant slips past on both.
ENDS_FIRST = '''
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    process_exit.pytest_unconfigure(config)
'''


def test_a_process_end_that_freezes_without_collecting_is_caught(pytester):
    """The check above, shown failing: frozen first, the garbage is never finalised, and nothing is reported."""
    result = run_ending(pytester, SKIPS_THE_COLLECTION + ENDS_FIRST)
    output = result.stdout.str() + result.stderr.str()
    assert "raised in a finalizer at the end" not in output, output[-3000:]


# Garbage made before the tests start, that only an explicit collection finds (automatic ones are
# off: a threshold of 0), and a test that asks whether it was collected before the freeze.
GARBAGE_BEFORE_THE_TESTS = '''
import weakref

gc.set_threshold(0)


class Cycle:
    def __init__(self):
        self.me = self


GARBAGE = weakref.ref(Cycle())
'''
ASKS_AT_THE_FIRST_TEST = '''
import gc

from conftest import GARBAGE


def test_first():
    assert gc.get_freeze_count() > 0, "nothing was frozen before the first test"
    assert GARBAGE() is None, "garbage made before the tests was frozen with the rest: it is never freed"
'''


def run_start(pytester, conftest: str):
    pytester.makeconftest(CONFTEST + GARBAGE_BEFORE_THE_TESTS + conftest)
    pytester.makepyfile(test_first=ASKS_AT_THE_FIRST_TEST)
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "-p", "no:xdist")


def test_what_is_alive_when_the_tests_start_is_frozen_and_garbage_is_not(pytester):
    result = run_start(pytester, "")
    assert result.ret == 0, (result.stdout.str() + result.stderr.str())[-3000:]


def test_a_start_that_freezes_without_collecting_is_caught(pytester):
    """The check above, shown failing: garbage alive when the freeze came is kept for ever."""
    result = run_start(pytester, SKIPS_THE_COLLECTION)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*garbage made before the tests was frozen with the rest*"])


def test_a_session_inside_a_test_leaves_the_collector_to_the_session_around_it(pytester, monkeypatch):
    """Neither frozen nor unfrozen by the inner session (the count of frozen objects can drop while
    it runs: a frozen object freed by its reference count leaves the frozen generation)."""
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret == 0
    assert calls == []
    assert gc.isenabled()
