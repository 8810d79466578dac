"""Processes a test leaves running: found, named, and ended by pid, never by name (Linux, /proc).

The harness knows the processes it started: the pytest process, its xdist workers, and the
helpers it keeps itself (`harness_owned`: the data-parallel rank pool). Each pytest process of a
run makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a process that daemonises
(a double fork, `setsid`) is re-parented to it rather than to init, and stays its descendant.

Before and after each test that runs runtime code the harness reads the test process's live
descendants. One that is new and still running once the test ended is a leftover: the test fails,
naming its pid and command line, and the process is ended (SIGTERM, then SIGKILL), through a pidfd
opened on that very process (its start time checked), so a reused pid is never signalled.

A runtime that keeps helper processes on purpose (an engine's worker pool) declares them with an
optional `helper_processes()` returning their pids: they and their descendants are not leftovers
and are ended when the session ends. At the end of every session, each process it started and did
not end (declared or not) is ended too; the harness's own helpers end with the process.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from harness.reliability.safe import bounded, describe_exception, safe_repr

SUPPORTED = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
SETTLE_S = 0.5  # a process the test was ending when it returned gets this long to go by itself
AFTER_EXIT_S = 3.0  # helpers that end with their parent (a multiprocessing fork server) get this long after it
TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL
SHOWN = 8  # leftovers named in one failure; the rest are counted
_PR_SET_CHILD_SUBREAPER = 36

Key = tuple[int, int]  # (pid, start time in clock ticks after boot): one process for its whole life


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    start: int
    state: str  # "R", "S", "Z" (exited, not yet reaped), ...

    @property
    def key(self) -> Key:
        return self.pid, self.start

    def argv(self) -> list[str]:
        """Its whole command line, word by word: what to match on. Empty once it has exited, and for
        a process with no command line (a kernel thread, or one between fork and exec)."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                words = f.read().rstrip(b"\0").split(b"\0")
        except OSError:
            return []
        return [w.decode("utf-8", "replace") for w in words if w]

    def command(self) -> str:
        """Its command line for a message: its two ends where it is long (an interpreter's path of a
        deep virtual environment, say, can push what names the program into the cut)."""
        return bounded(" ".join(self.argv()) or self._comm(), 160)

    def _comm(self) -> str:
        try:
            with open(f"/proc/{self.pid}/comm") as f:
                return f"[{f.read().strip()}]"
        except OSError:
            return "<gone>"


def become_subreaper() -> bool:
    """Orphans of this process's descendants come back to it (not to init): nothing it started escapes."""
    if not SUPPORTED:
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def read(pid: int) -> Process | None:
    # os.open and one os.read, not open(): this runs for every process on the machine before and
    # after each test, and a buffered file object costs more than the read itself.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = text[text.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
    return Process(pid, int(fields[1]), int(fields[19]), fields[0])


def _has_children() -> bool:
    """One system call: False when this process has no child at all (so no descendant either)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s children (zombies too), from its threads' /proc/PID/task/TID/children
    files (a child is listed under the thread that forked it, or took it in as a subreaper)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # it has exited
        return []
    pids = []
    for tid in threads:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
        except OSError:  # the thread has exited
            continue
        try:
            text = b""
            while chunk := os.read(fd, 65536):
                text += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        pids += map(int, text.split())
    return pids


# Whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN, in every common distribution's
# kernel): a walk down from the root then reads only its descendants' files, where the fallback reads
# every process on the machine (a hundred or more) before and after each test.
CHILDREN_FILES = SUPPORTED and os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants(root: int | None = None, *, zombies: bool = False) -> dict[Key, Process]:
    """Every descendant of `root` (this process by default), live ones only unless `zombies`."""
    if not SUPPORTED:
        return {}
    me = os.getpid()
    root = me if root is None else root
    if root == me and not _has_children():
        return {}
    found, queue = {}, [root]
    if CHILDREN_FILES:
        while queue:
            for pid in _children(queue.pop()):
                if (process := read(pid)) is not None:
                    queue.append(pid)
                    if zombies or process.state != "Z":
                        found[process.key] = process
        return found
    children: dict[int, list[Process]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (process := read(int(name))) is not None:
            children.setdefault(process.ppid, []).append(process)
    while queue:
        for process in children.get(queue.pop(), ()):
            queue.append(process.pid)
            if zombies or process.state != "Z":
                found[process.key] = process
    return found


def alive(process: Process) -> bool:
    now = read(process.pid)
    return now is not None and now.start == process.start and now.state != "Z"


def end(processes: Sequence[Process], grace: float = TERM_GRACE_S) -> dict[Key, str]:
    """SIGTERM each, SIGKILL what is left after `grace`: {key: how it ended}. A process is signalled
    through a pidfd opened after its start time was checked, so a pid reused meanwhile is safe."""
    handles = {p.key: _open(p) for p in processes}
    how = {key: "had already exited" for key, handle in handles.items() if handle is None}
    live = {key: handle for key, handle in handles.items() if handle is not None}
    for handle in live.values():
        handle.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and (left := deadline - time.monotonic()) > 0:
        for key in [key for key, handle in live.items() if handle.exited(min(left, 0.05))]:
            how[key] = "ended by SIGTERM"
            live.pop(key).close()
    for key, handle in live.items():
        handle.signal(signal.SIGKILL)
        handle.exited(1.0)
        how[key] = "ended by SIGKILL (it outlived SIGTERM)"
        handle.close()
    return how


def terminate(processes: Sequence[Process]) -> None:
    """SIGTERM each that is still the process it was (see end), and wait for none of them."""
    for process in processes:
        handle = _open(process)
        if handle is not None:
            handle.signal(signal.SIGTERM)
            handle.close()


class _Handle:
    """A process to signal: a pidfd where the kernel has them (Linux 5.3), else its pid."""

    def __init__(self, process: Process, fd: int | None):
        self.process, self.fd = process, fd

    def signal(self, signum: int) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signum)
            elif alive(self.process):  # no pidfd: check the start time just before
                os.kill(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def exited(self, timeout: float) -> bool:
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], timeout)[0])
        time.sleep(timeout)
        return not alive(self.process)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _open(process: Process) -> _Handle | None:
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(process.pid)
        except ProcessLookupError:
            return None
        except OSError:  # a kernel without pidfds
            fd = None
    if not alive(process):  # gone, or the pid now names another process
        if fd is not None:
            os.close(fd)
        return None
    return _Handle(process, fd)


# -- what the harness keeps itself ---------------------------------------------------------------
# Process-wide, as processes are: a pool the harness starts lives as long as this process, across
# sessions run in it (pytester), and any session's check must know it.
_HARNESS_OWNED: dict[Key, str] = {}


@contextmanager
def harness_owned(what: str):
    """Every process that appears while the block runs is the harness's own (`what` names it):
    never a leftover of a test, and ended by whoever started it (`owned(what)` finds them)."""
    before = descendants()
    try:
        yield
    finally:
        for key in descendants().keys() - before.keys():
            _HARNESS_OWNED[key] = what


def owned(what: str) -> list[Process]:
    """The processes `harness_owned(what)` saw start that are still the processes they were."""
    found = []
    for (pid, start), name in _HARNESS_OWNED.items():
        if name == what and (process := read(pid)) is not None and process.start == start:
            found.append(process)
    return found


def settled(found: Callable[[], dict[Key, "Process"]], seconds: float) -> dict[Key, "Process"]:
    """What `found()` still lists after up to `seconds` of letting processes end by themselves."""
    left, deadline = found(), time.monotonic() + seconds
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = found()
    return left


def ancestors(process: Process):
    """Its parent, its parent's parent, ... below init (64 at most)."""
    current = read(process.ppid) if process.ppid > 1 else None
    for _ in range(64):
        if current is None:
            return
        yield current
        current = read(current.ppid) if current.ppid > 1 else None


def descends_from(process: Process, pids: set[int]) -> bool:
    return process.pid in pids or any(a.pid in pids for a in ancestors(process))


def describe(process: Process) -> str:
    """Its pid, parent and command line: read while it runs (an ended process has none)."""
    return f"pid {process.pid} (parent {process.ppid}): {process.command()!r}"


def end_and_describe(left: Sequence[Process], note: Callable[[Process], str] = lambda p: "") -> list[str]:
    """End them; one line each: who it was, and how it ended."""
    names = {p.key: describe(p) + note(p) for p in left}
    how = end(left)
    for process in left:
        if process.ppid == os.getpid():
            _reap(process.pid)  # ended here: its exit status says nothing to anyone
    return [f"{names[p.key]}, {how[p.key]}" for p in left]


class ProcessWatch:
    """One session's view of the processes it started: leftovers after each test, helpers the
    runtime declares, and what is still running when the session ends."""

    def __init__(self, runtime=None):
        self.runtime = runtime  # its optional helper_processes() declares what it keeps
        self.subreaper = become_subreaper()
        self.at_start = set(descendants())  # what was running before this session: never ours to end
        self.declared: dict[Key, Process] = {}  # helpers the runtime declared
        self.seen_parent: dict[Key, int] = {}  # each descendant's parent when first seen: who was re-parented

    def snapshot(self) -> frozenset[Key]:
        return frozenset(self._scan())

    def _scan(self) -> dict[Key, Process]:
        found = descendants(zombies=True)
        me = os.getpid()
        for key, process in found.items():
            self.seen_parent.setdefault(key, process.ppid)
            if process.state == "Z" and process.ppid == me and self.seen_parent[key] != me:
                _reap(process.pid)  # an orphan re-parented here: nobody else will ever wait for it
        return {key: p for key, p in found.items() if p.state != "Z"}

    def check(self, before: frozenset[Key]) -> list[str]:
        """After a test: one line per problem (leftovers, each ended; a bad declaration); [] when none."""
        new = self._new(before)
        if not new:
            return []
        deadline = time.monotonic() + SETTLE_S
        while new and time.monotonic() < deadline:  # a pool the test was shutting down: let it go
            time.sleep(0.02)
            new = [p for p in new if alive(p)]
        if not new:
            return []
        problems = self._declare()
        new = [p for p in self._new(before) if not self._kept(p)]
        if new:
            shown = end_and_describe(new)[:SHOWN]
            more = f"\n    ... and {len(new) - SHOWN} more" if len(new) > SHOWN else ""
            problems.append(
                f"the test left {len(new)} process(es) running, which would outlive it and the run (docs/reliability.md; "
                "a runtime that keeps helper processes on purpose declares them with helper_processes()):\n    "
                + "\n    ".join(shown) + more)
        return problems

    def _new(self, before: frozenset[Key]) -> list[Process]:
        return [p for key, p in self._scan().items() if key not in before and key not in _HARNESS_OWNED]

    def _kept(self, process: Process) -> bool:
        """Declared by the runtime, or a descendant of a declared helper (its pool's own workers)."""
        return process.key in self.declared or any(a.key in self.declared for a in ancestors(process))

    def _declare(self) -> list[str]:
        """Ask the runtime which processes it keeps; [] or what was wrong with its answer."""
        declare: Callable | None = getattr(self.runtime, "helper_processes", None)
        if not callable(declare):
            return []
        try:
            answer = declare()
        except Exception as exc:  # noqa: BLE001 - the runtime's failure is the answer
            return [f"the runtime's helper_processes() raised {describe_exception(exc, 300)}"]
        problem = pids(answer)
        if problem:
            return [f"the runtime's helper_processes() {problem}"]
        ours = {p.pid: p for p in self._scan().values()}
        strangers = [pid for pid in answer if pid not in ours]
        for pid in answer:
            if pid in ours:
                self.declared[ours[pid].key] = ours[pid]
        if strangers:
            return [f"the runtime's helper_processes() named pid(s) {safe_repr(strangers, 200)}, which this run did "
                    "not start (not a live descendant of the test process): the harness ends only processes it "
                    "started, and a helper is one the runtime started"]
        return []

    def end_of_session(self, settle: float = 0.0, spare: set[int] = frozenset()) -> list[str]:
        """End every process this session started and nobody ended (the harness's own excepted, and
        `spare` and what descends from them), after up to `settle` seconds of letting them end by
        themselves: one line each, declared helpers marked so."""
        def found():
            return {key: p for key, p in self._scan().items() if key not in self.at_start
                    and key not in _HARNESS_OWNED and not descends_from(p, spare)}

        # Wait only on what nobody declared: a process on its way out (an xdist worker after its
        # controller ended) is not a leak; a declared helper is ended at once.
        settled(lambda: {key: p for key, p in found().items() if not self._kept(p)}, settle)
        left = list(found().values())
        if not left:
            return []
        kept = {p.key for p in left if self._kept(p)}
        return end_and_describe(left, lambda p: " (a helper the runtime declared)" if p.key in kept else "")


def pids(value) -> str | None:
    """What is wrong with helper_processes()'s answer (a list of process ids), or None; it never
    raises, whatever the runtime handed back (harness.runtime.validate's rule for every answer)."""
    try:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            return f"returned {safe_repr(value)}; expected a list of process ids (ints > 0)"
        return None
    except Exception as exc:  # noqa: BLE001 - the answer is what is broken
        return (f"returned {safe_repr(value)}, which the harness could not even inspect "
                f"({describe_exception(exc, 300)})")


def reap_ended() -> int:
    """Reap every child of this process that has ended (what a subreaper took in included): how many."""
    reaped = 0
    while True:
        try:
            if not os.waitpid(-1, os.WNOHANG)[0]:
                return reaped
        except ChildProcessError:  # no child at all
            return reaped
        reaped += 1


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
