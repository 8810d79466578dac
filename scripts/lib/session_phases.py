"""A pytest plugin for scripts/time_breakdown.py: when each process of a run reached each phase.

Loaded with `-p session_phases` (this folder on PYTHONPATH) and SESSION_PHASES_FILE set, every
process of the run (the pytest process, a supervised child, each xdist worker) appends
`EVENT PID TIME` lines to that file, TIME from time.time(): pytest configured, collection finished,
each test's start and end, the session finished, pytest unconfigured. The parent then splits the
run into what came before the first test, the tests, and what came after the last.
"""
from __future__ import annotations

import os
import time

import pytest


def _mark(event: str) -> None:
    path = os.environ.get("SESSION_PHASES_FILE")
    if path:
        with open(path, "a") as file:
            file.write(f"{event} {os.getpid()} {time.time():.6f}\n")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    _mark("configured")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    _mark("collected")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location) -> None:
    _mark("test-start")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location) -> None:
    _mark("test-end")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    _mark("session-finished")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    _mark("unconfigured")
