"""The lock that lets a test measure a whole GPU while xdist's other workers share it
(harness/session/device_share.py): shared for ordinary tests, exclusive for `alone_on_device`,
and an exclusive holder that waits is not passed by shared ones that come after it."""
from __future__ import annotations

import fcntl
import multiprocessing
import os
import time

import pytest

from harness.session import device_share
from harness.session.device_share import DeviceLock

WAIT = 30.0  # seconds an event that must happen may take; a test never waits this long when it passes
SETTLE = 0.3  # how long a process that must stay blocked is given to (wrongly) get through


def hold(directory, alone, holding, release, order, name):
    lock = DeviceLock(directory, 0)
    with lock.held(alone=alone):
        order.put(name)
        holding.set()
        release.wait(WAIT)


def start(context, tmp_path, alone, order, name):
    holding, release = context.Event(), context.Event()
    process = context.Process(target=hold, args=(tmp_path, alone, holding, release, order, name))
    process.start()
    return process, holding, release


@pytest.fixture
def context():
    return multiprocessing.get_context("fork")


def test_shared_holders_run_together(context, tmp_path):
    order = context.Queue()
    first = start(context, tmp_path, False, order, "a")
    second = start(context, tmp_path, False, order, "b")
    assert first[1].wait(WAIT) and second[1].wait(WAIT), "two ordinary tests must hold the GPU at once"
    for process, _, release in (first, second):
        release.set()
        process.join(WAIT)


def test_an_exclusive_holder_waits_for_shared_ones_and_blocks_later_ones(context, tmp_path):
    order = context.Queue()
    early = start(context, tmp_path, False, order, "early")
    assert early[1].wait(WAIT)
    alone = start(context, tmp_path, True, order, "alone")
    assert not alone[1].wait(SETTLE), "the exclusive holder got in beside a shared one"
    late = start(context, tmp_path, False, order, "late")
    assert not late[1].wait(SETTLE), "a later shared holder passed the exclusive one waiting in front of it"
    early[2].set()
    assert alone[1].wait(WAIT), "the exclusive holder never got the lock once the shared one left"
    assert not late[1].wait(SETTLE), "a shared holder got in beside the exclusive one"
    alone[2].set()
    assert late[1].wait(WAIT)
    late[2].set()
    for process, _, _ in (early, alone, late):
        process.join(WAIT)
    assert [order.get(timeout=WAIT) for _ in range(3)] == ["early", "alone", "late"]


def test_a_holder_that_dies_gives_the_lock_back(context, tmp_path):
    order = context.Queue()
    dead = start(context, tmp_path, True, order, "dead")
    assert dead[1].wait(WAIT)
    dead[0].kill()
    dead[0].join(WAIT)
    after = start(context, tmp_path, True, order, "after")
    assert after[1].wait(WAIT), "a killed holder kept the lock"
    after[2].set()
    after[0].join(WAIT)


class _Config:
    def __init__(self, workerinput=None):
        if workerinput is not None:
            self.workerinput = workerinput


def test_only_xdist_workers_on_cuda_lock_the_device():
    assert device_share.for_worker(_Config(), "cuda") is None  # one process: nothing else is on the GPU
    assert device_share.for_worker(_Config({"workerid": "gw1", "testrunuid": "x"}), "emulated") is None


def test_two_runs_naming_one_directory_lock_each_other(tmp_path, monkeypatch):
    """Two lanes on one GPU (two pytest runs with other run ids) share their locks where both set
    CUDAGRAPH_DEVICE_SHARE_DIR; without it each run has a directory of its own."""
    monkeypatch.setattr(device_share.machine, "worker_device", lambda index: 0)
    own = [device_share.for_worker(_Config({"workerid": "gw0", "testrunuid": run}), "cuda") for run in ("a", "b")]
    assert own[0].lock._lock != own[1].lock._lock and all(own)
    monkeypatch.setenv(device_share.SHARED_DIR, str(tmp_path))
    shared = [device_share.for_worker(_Config({"workerid": "gw0", "testrunuid": run}), "cuda") for run in ("a", "b")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu0.lock", "gpu0.turnstile"]
    with shared[0].lock.held(alone=True):  # the other run cannot take the device meanwhile
        other = os.open(tmp_path / "gpu0.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.close(other)
    for share in own + shared:
        share.lock.close()
