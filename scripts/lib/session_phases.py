"""A pytest plugin for scripts/time_breakdown.py: when each process of a run reached each phase,
and the CPU time each test used.

Loaded with `-p session_phases` (this folder on PYTHONPATH) and SESSION_PHASES_FILE set, every
process of the run (the pytest process, a supervised child, each xdist worker) appends
`EVENT PID TIME` lines to that file, TIME from time.time(): pytest configured, collection finished,
each test's start and end, the session finished, pytest unconfigured. The parent then splits the
run into what came before the first test, the tests, and what came after the last.

After each test it appends `test-cpu PID OWN WAITED NODEID`: the CPU seconds (user and system) the
test's process used from its start to its end, and those of the processes it started and waited
for meanwhile (os.times: a child counts once it has been waited for). On a machine whose cores
are all busy, CPU time says where a run's time goes; a test's wall time also holds its waits.
"""
from __future__ import annotations

import os
import time

import pytest


def _write(line: str) -> None:
    path = os.environ.get("SESSION_PHASES_FILE")
    if path:
        with open(path, "a") as file:
            file.write(line + "\n")


def _mark(event: str) -> None:
    _write(f"{event} {os.getpid()} {time.time():.6f}")


def _cpu() -> tuple[float, float]:
    times = os.times()
    return times.user + times.system, times.children_user + times.children_system


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    _mark("configured")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    _mark("collected")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location) -> None:
    _mark("test-start")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Only where the test runs: an xdist controller sees each test's start and end, not its protocol."""
    own_before, waited_before = _cpu()
    try:
        return (yield)
    finally:
        own, waited = _cpu()
        _write(f"test-cpu {os.getpid()} {own - own_before:.6f} {waited - waited_before:.6f} {item.nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location) -> None:
    _mark("test-end")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    _mark("session-finished")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    _mark("unconfigured")
