"""Under xdist the controller is its workers' witness (harness.reliability.witness).

Each worker connects to a Unix socket of the controller's and tells it what it runs. When xdist
reports that a worker crashed while running a test, the controller reads the worker's last
messages and its exit status (a peek at the child's status that leaves it for execnet to reap),
and the test's report says how the worker ended (the signal or exit code, or the watchdog's own
word for a native hang), in which phase, and the last lines the test wrote. xdist then replaces
the worker and runs the rest; tests left unrun when it stops replacing workers are reported as
"not run" with the reason. A hang that ended a worker is counted (harness.reliability.hangs) and
handed to the workers started after it. When the session ends, whatever the workers left running
(re-parented here, a child subreaper) is ended.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import pytest

from harness.reliability import processes
from harness.reliability.hangs import KIND_ATTRIBUTE, REPORT_PLUGIN, Hang, HangRecord
from harness.reliability.witness import CLIENT, SOCKET_KEY, Client, Ending, Witnessed, role

HANGS_KEY = "cudagraph_conformance_hangs"  # xdist workerinput: hangs in a row so far
ENDED_KEY = "cudagraph_conformance_ended"  # xdist workeroutput: what a worker ended as its session ended
WITNESS = "cudagraph-conformance-workers"
STATUS_WAIT_S = 3.0  # for a crashed worker's exit status to be there


def attach(config, runtime_name: str) -> None:
    """Under xdist: the controller listens to its workers, each worker tells it what runs."""
    if role(config) == "controller":
        config.pluginmanager.register(WorkerWitness(config, runtime_name), WITNESS)
    elif role(config) == "worker" and SOCKET_KEY in config.workerinput:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(config.workerinput[SOCKET_KEY])
        except OSError:  # no witness: the controller still reports the crash, with less to say
            sock.close()
            return
        config.pluginmanager.register(Client(sock, config, everything=False), CLIENT)


class WorkerWitness:
    def __init__(self, config, runtime_name: str):
        self.config, self.runtime_name = config, runtime_name
        self.timeout = float(config.getoption("test_timeout") or 0)
        self.directory = tempfile.mkdtemp(prefix="cudagraph-conformance-")
        self.path = os.path.join(self.directory, "witness")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.workers: list[tuple[socket.socket, Witnessed]] = []
        self.hangs = HangRecord()
        self.crashed: list[str] = []
        self.collected: set[str] = set()
        self.reported: set[str] = set()
        self.ended_by_workers: list[str] = []
        self.watch = processes.ProcessWatch()

    # -- xdist's hooks --------------------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        node.workerinput[SOCKET_KEY] = self.path
        node.workerinput[HANGS_KEY] = self.hangs.as_json()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.ended_by_workers += getattr(node, "workeroutput", {}).get(ENDED_KEY, [])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.collected.update(ids)

    def pytest_runtest_logstart(self, nodeid, location):
        self._drain()  # a few small messages a test: read them as they come, so no worker ever waits

    def pytest_runtest_logreport(self, report):
        self.reported.add(report.nodeid)
        kind = getattr(report, KIND_ATTRIBUTE, None)
        if kind:  # a test of that kind ended without hanging
            self.hangs.ended(kind)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        """A worker ended while running a test: say how, and what the test wrote last."""
        self._drain()
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        seen = next((w for _, w in reversed(self.workers) if w.worker == worker), None) or Witnessed()
        ending = _peek(seen.pid)
        elapsed = time.time() - seen.started if seen.started is not None and seen.running == crashitem else None
        phase = seen.phase if seen.running == crashitem else None
        crash = seen.crash if seen.crash and seen.crash.get("nodeid") == crashitem else None
        if crash is not None:
            how = crash["reason"]
        elif ending is None:
            how = "the worker process ended (its exit status could not be read)"
        else:
            how = f"the worker process {ending.describe()}" + (f" during {phase}" if phase else "") \
                  + (f", {elapsed:.1f} s into the test" if elapsed is not None else "") \
                  + f": {ending.cause(elapsed, self.timeout)}"
        hang = self._hang(crashitem, crash, ending, elapsed, seen)
        if hang is not None:
            self.hangs.hung(hang)
        lines = seen.last_lines()
        self.crashed.append(crashitem)
        report.longrepr = (f"{report.longrepr}: {how}" + (f"\n{lines}" if lines else "")
                           + "\nxdist replaces the worker (at most --max-worker-restart times) and runs the rest on "
                             "the new one; the old worker's stderr has the stacks faulthandler or the watchdog wrote")

    def _hang(self, nodeid, crash, ending, elapsed, seen) -> Hang | None:
        if crash is not None and crash.get("hang"):
            return Hang(**crash["hang"])
        held_the_gil = (ending is not None and ending.code == 1 and elapsed is not None and self.timeout
                        and elapsed >= self.timeout)
        if held_the_gil and seen.kind:
            return Hang(nodeid, seen.phase or "call", self.timeout, seen.kind, "faulthandler ended the worker")
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        """Tests no worker ran once xdist stopped replacing crashed workers: reported, with the reason."""
        run_report = self.config.pluginmanager.get_plugin(REPORT_PLUGIN)
        missing = sorted(self.collected - self.reported)
        if not (self.crashed and missing and run_report is not None):
            return
        reason = (f"not run: the run ended before any worker ran this test, after {len(self.crashed)} worker(s) "
                  f"crashed (the last while running {self.crashed[-1]}); xdist replaces at most "
                  "--max-worker-restart of them")
        for nodeid in missing:
            run_report.not_run(nodeid, reason)

    def pytest_unconfigure(self, config):
        for sock, seen in self.workers:
            seen.close()
            sock.close()
        self.listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        # After xdist tore its workers down; one still exiting is left to execnet, which waits for it.
        workers = {seen.pid for _, seen in self.workers if seen.pid}
        ended = self.ended_by_workers + self.watch.end_of_session(processes.AFTER_EXIT_S, spare=workers)
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if ended and terminal is not None:
            terminal.write_line(f"cudagraph-conformance: ended {len(ended)} process(es) left running when the "
                                f"session ended: {'; '.join(ended)}", yellow=True)

    # -- the workers' messages ------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            self.workers.append((sock, Witnessed()))
        for sock, seen in self.workers:
            seen.drain(sock)


def _peek(pid: int | None) -> Ending | None:
    """How a child ended, read without reaping it (execnet still waits for it); None if unknown."""
    if pid is None:
        return None
    deadline = time.monotonic() + STATUS_WAIT_S
    while True:
        try:
            result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped, or not a child of this process
            return None
        if result is not None:
            return Ending.from_waitid(result)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)

