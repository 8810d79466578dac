"""Tests that measure a whole GPU run alone on it, when xdist's workers share that GPU.

Free device memory is the device's, not the process's: a test that reads it (graph memory
against what the harness measured, `@pytest.mark.alone_on_device`) would count another worker's
engine builds as its own. So workers that share a GPU hold a lock on it for each test, shared by
ordinary tests and exclusive for a test marked `alone_on_device`: while it runs, every other
worker waits between tests. A turnstile in front of the lock keeps new shared holders from
passing an exclusive one that waits. The locks are files (`fcntl.flock`), so a worker that dies
holding one gives it back with its process.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.session import machine

MARKER = "alone_on_device"
# Two runs on one GPU at once (two lanes of one device call) share their locks where both name the
# same directory here; by default each run has its own.
SHARED_DIR = "CUDAGRAPH_DEVICE_SHARE_DIR"
MARKER_HELP = (f"{MARKER}: the test measures the whole device (its free memory); under xdist no other "
               "worker's test runs on its GPU meanwhile (harness/session/device_share.py)")


class DeviceLock:
    """One GPU's lock among the processes of one run (`directory` is the run's own)."""

    def __init__(self, directory: Path, device: int):
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile = os.open(directory / f"gpu{device}.turnstile", os.O_CREAT | os.O_RDWR, 0o600)
        self._lock = os.open(directory / f"gpu{device}.lock", os.O_CREAT | os.O_RDWR, 0o600)

    @contextmanager
    def held(self, alone: bool):
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._turnstile)
        os.close(self._lock)


class DeviceShare:
    """The pytest plugin an xdist worker on CUDA registers: each test holds its GPU's lock."""

    def __init__(self, lock: DeviceLock):
        self.lock = lock

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        with self.lock.held(alone=item.get_closest_marker(MARKER) is not None):
            yield

    def pytest_unconfigure(self):
        self.lock.close()


def for_worker(config, graph_backend: str | None) -> DeviceShare | None:
    """The plugin for an xdist worker whose tests run on CUDA; None elsewhere (one process, or no
    GPU: nothing else measures the device)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or graph_backend != "cuda":
        return None
    device = machine.worker_device(int(workerinput["workerid"].lstrip("gw")))
    directory = Path(os.environ.get(SHARED_DIR) or
                     Path(tempfile.gettempdir()) / f"cudagraph-conformance-{workerinput['testrunuid']}")
    return DeviceShare(DeviceLock(directory, device))
