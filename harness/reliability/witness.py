"""A witness outside the process that runs the tests: when that process dies, someone says so.

A process killed by a signal, ended by `os._exit`, or ended by the watchdog can say nothing
afterwards. Its witness can: in a plain run the supervisor (harness.supervisor: pytest
forks, the child runs the session, the parent waits for it), under xdist the controller
(harness.reliability.workers). Over a Unix socket, the test process tells its witness which test
and phase it is in, and hands it pytest's capture files (what a test prints goes there, and each
phase starts them empty); when it dies, the witness knows the test, the phase, how the process
ended (the signal or exit code) and the last lines the test wrote.

The normal path costs a few small writes a test.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
import time

import pytest

from harness.reliability.hangs import REPORT_PLUGIN, kind_of
from harness.reliability.safe import bounded

CLIENT = "cudagraph-conformance-witness"  # the test process's side, as a registered plugin
SOCKET_KEY = "cudagraph_conformance_witness"  # xdist workerinput: the controller's socket path
LAST_LINES = 20
LAST_CHARS = 3000


def role(config) -> str:
    """'worker' (an xdist worker), 'controller' (the xdist controller: runs no test) or 'plain'."""
    if hasattr(config, "workerinput"):
        return "worker"
    numprocesses = config.getoption("numprocesses", None)
    if numprocesses in ("auto", "logical") or (numprocesses or 0) > 0 or config.getoption("dist", "no") != "no":
        return "controller"
    return "plain"


class Client:
    """The test process's side: says what runs, hands over its capture files, and, for a plain run's
    supervisor (`everything`), each test's report entry and the end of the session."""

    def __init__(self, sock: socket.socket, config, everything: bool):
        self.sock: socket.socket | None = sock
        self.config = config
        self.everything = everything
        self.lock = threading.Lock()  # the watchdog's thread writes too
        self.files_sent = False
        self.exitstatus = None

    def send(self, message: dict, fds=()) -> None:
        if self.sock is None:
            return
        data = (json.dumps(message, default=str) + "\n").encode()
        locked = self.lock.acquire(timeout=2)  # not got: a thread stopped mid-write; say it anyway
        try:
            if fds:
                socket.send_fds(self.sock, [data[:1]], list(fds))  # the files ride on the message's first byte
                data = data[1:]
            self.sock.sendall(data)
        except OSError:  # the witness is gone: nothing more to tell
            self.sock = None
        finally:
            if locked:
                self.lock.release()

    def note(self, nodeid: str, when: str, reason: str, hang: dict | None = None) -> None:
        """Just before the process ends itself (the watchdog): the test, and why."""
        self.send({"crash": {"nodeid": nodeid, "when": when, "reason": reason, "hang": hang}})

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        worker = getattr(self.config, "workerinput", {}).get("workerid")
        self.send({"hello": {"pid": os.getpid(), "worker": worker}})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        if self.everything:
            report = self.config.pluginmanager.get_plugin(REPORT_PLUGIN)
            header = {k: v for k, v in report.as_dict().items() if k != "tests"} if report is not None else None
            self.send({"collected": [item.nodeid for item in session.items], "header": header})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.send({"start": item.nodeid, "kind": kind_of(item), "at": time.time()})

    # Not wrappers: these run inside pytest's capture, when fds 1 and 2 are its capture files.
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if not self.files_sent:
            self.files_sent = True
            files = [fd for fd in (1, 2) if _regular(fd)]
            self.send({"files": [("stdout", "stderr")[fd - 1] for fd in files]}, fds=files)
        self.send({"phase": "setup"})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        self.send({"phase": "call"})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        self.send({"phase": "teardown"})

    def pytest_runtest_logfinish(self, nodeid, location):
        report = self.config.pluginmanager.get_plugin(REPORT_PLUGIN) if self.everything else None
        self.send({"end": nodeid, **({"entry": report.results.get(nodeid)} if report is not None else {})})

    def pytest_sessionfinish(self, session, exitstatus):
        self.exitstatus = int(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        if self.everything:
            self.send({"finished": self.exitstatus})
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class Witnessed:
    """One test process as its witness saw it, from its messages."""

    def __init__(self):
        self.pid: int | None = None
        self.worker: str | None = None
        self.files: dict[str, int] = {}  # "stdout"/"stderr" -> the capture file, as a descriptor of the witness's
        self.running: str | None = None
        self.kind: str | None = None
        self.phase: str | None = None
        self.started: float | None = None  # time.time() when the running test started, in its process
        self.crash: dict | None = None  # the harness's own word before it ended the process
        self.collected: list[str] = []
        self.header: dict | None = None
        self.entries: dict[str, dict] = {}
        self.finished: int | None = None  # the session's exit status, once it ended
        self._buffer = b""
        self._pending_fds: list[int] = []

    def receive(self, sock: socket.socket) -> int | None:
        """Read what is there: bytes read (0: nothing yet, on a non-blocking socket), None at the end."""
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            return None
        self._pending_fds += fds
        if not data:
            return None
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                self._handle(json.loads(line))
            except ValueError:
                continue
        return len(data)

    def drain(self, sock: socket.socket) -> bool:
        """Read everything already sent, without waiting; False once the sender closed its end."""
        sock.setblocking(False)
        while (read := self.receive(sock)):
            pass
        return read is not None

    def _handle(self, message: dict) -> None:
        if "hello" in message:
            self.pid, self.worker = message["hello"]["pid"], message["hello"]["worker"]
        elif "files" in message:
            self.files.update(zip(message["files"], self._pending_fds))
            self._pending_fds = []
        elif "start" in message:
            self.running, self.kind, self.phase, self.started = message["start"], message.get("kind"), None, \
                message.get("at")
        elif "phase" in message:
            self.phase = message["phase"]
        elif "end" in message:
            if message.get("entry"):
                self.entries[message["end"]] = message["entry"]
            self.running = None
        elif "crash" in message:
            self.crash = message["crash"]
        elif "collected" in message:
            self.collected, self.header = message["collected"], message.get("header")
        elif "finished" in message:
            self.finished = message["finished"]

    def last_lines(self) -> str:
        """What the running test's phase wrote last, by stream; '' when nothing (or not captured)."""
        parts = []
        for name, fd in sorted(self.files.items(), reverse=True):  # stdout, then stderr
            try:
                size = os.fstat(fd).st_size
                data = os.pread(fd, min(size, 1 << 16), max(0, size - (1 << 16)))
            except OSError:
                continue
            lines = data.decode("utf-8", "replace").rstrip().splitlines()[-LAST_LINES:]
            if lines:
                text = bounded("\n".join(lines), LAST_CHARS)
                parts.append(f"last lines it wrote to {name}:\n" + "\n".join("    " + line for line in text.splitlines()))
        return "\n".join(parts)

    def forget_output(self) -> None:
        """Empty the capture files: pytest's own clean-up in a supervisor would print them again."""
        for fd in self.files.values():
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass

    def close(self) -> None:
        for fd in [*self.files.values(), *self._pending_fds]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.files, self._pending_fds = {}, []


class Ending:
    """How a process ended: by a signal, or with an exit code."""

    def __init__(self, signum: int | None = None, code: int | None = None):
        self.signum, self.code = signum, code

    @classmethod
    def from_wait_status(cls, status: int) -> "Ending":
        if os.WIFSIGNALED(status):
            return cls(signum=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status))

    @classmethod
    def from_waitid(cls, result) -> "Ending":
        if result.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return cls(signum=result.si_status)
        return cls(code=result.si_status)

    @property
    def shell_status(self) -> int:
        """What a shell would report: 128 + the signal, or the exit code."""
        return 128 + self.signum if self.signum is not None else self.code

    def describe(self) -> str:
        if self.signum is None:
            return f"exited with code {self.code}"
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return f"was killed by {name} (signal {self.signum})"

    def cause(self, seconds: float | None, timeout: float) -> str:
        """What can end a process this way, for the reason a report gives."""
        if self.signum == signal.SIGKILL:
            return ("SIGKILL comes from outside the process or from a runtime that kills itself; the kernel's "
                    "out-of-memory killer sends it when memory runs out (give the run a limit: docs/reliability.md)")
        if self.signum in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
            return ("a crash in native code (a bad pointer, an illegal instruction); faulthandler wrote the Python "
                    "stacks to stderr")
        if self.signum == signal.SIGABRT:
            return ("an abort: abort() in native code, a failed C assert or a C++ exception nobody caught; "
                    "faulthandler wrote the Python stacks to stderr")
        if self.signum is not None:
            return "a signal sent to it, by the runtime or from outside"
        late = seconds is not None and timeout and seconds >= timeout
        if self.code == 1 and late:
            return ("a test blocked in native code past --test-timeout and its grace, holding the GIL: "
                    "faulthandler's last-resort timer ends such a hang")
        return ("the process ended itself without finishing the session: os._exit() or exit() from native code "
                "(by the runtime, or by a library it called)")
