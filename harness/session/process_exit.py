"""The garbage collector around a pytest process's session: what is alive when its tests start
frozen, and at its end the session's garbage collected once, and what survives frozen.

Before the first test, everything alive (torch, the runtime's modules, the collected tests) lives
as long as the session. The harness runs full collections during the run, to measure what a test
left on the device, and each would walk all of it again; frozen after one collection (so that no
garbage is kept), it is out of their way, and they walk only what the tests made.

At the end pytest runs full garbage collections, to surface exceptions raised in finalizers (five
after every plugin's last hook; from pytest 9.2, one in its own pytest_unconfigure, ahead of this
module's, and one after), and the interpreter runs more as it exits. In a process that holds
torch (and, in a worker of the self-tests, transformers and a whole run's objects) each walks
about a million objects that are not garbage. One collection here finalises the session's garbage, with
pytest's hook for unraisable exceptions still installed, so they are reported as before;
`gc.freeze()` then moves the survivors out of the collector's reach, and the remaining
collections find them gone.

Only the outermost session of a process does this: a session run inside a test (pytester's
in-process runs) leaves the process to the session around it. A later session in the same
process (pytest.main called twice) starts with the freeze undone.
"""
from __future__ import annotations

import gc

import pytest

# Sessions open in this process, and whether this module froze the collector's objects: a count
# for the process, since pytester runs sessions inside another session's test.
_open = 0
_frozen = False


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    global _open, _frozen
    if _open == 0 and _frozen:
        gc.unfreeze()
        _frozen = False
    _open += 1


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    if _open == 1 and gc.isenabled():
        _collect_and_freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    global _open
    _open -= 1
    if _open == 0 and gc.isenabled():
        _collect_and_freeze()


def _collect_and_freeze() -> None:
    """One collection, so that no garbage is kept, then what survives out of later collections' way."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True
