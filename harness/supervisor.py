"""A plain run's supervisor: pytest forks before the session starts, the child runs the session and
the parent waits for it, as the child's witness (harness.reliability.witness).

When the child ends without finishing its session (a signal, `os._exit`, the watchdog ending a
hang), the parent says which test was running, in which phase, how the process ended and the last
lines the test wrote, on the terminal and in the report (`--report-dir`): that test fails, the
tests that never ran are listed as "not run" with the reason, `complete` is false, and the exit
status is 1 (tests failed). It also ends whatever the child left running. When the child finished
its session, the parent exits with the child's status and says nothing.

Supervised: pytest started from the command line (`pytest`, `python -m pytest`). Not supervised:
xdist runs (the controller is the workers' witness); `pytest.main()` called by a program (the
child would return into the program too); a run measured by coverage.py (each process writes its
data as it exits, and the parent's would replace the child's); a session inside another session's
test (pytester, or pytest run from a test: PYTEST_CURRENT_TEST is set); runs that run no test
(--collect-only, --help, ...); platforms without fork or file-descriptor passing; and
`--no-supervisor` (a debugger that should follow the pytest process itself).
The parent ignores Ctrl-C (the terminal sends it to the child too) and passes SIGTERM, SIGHUP and
SIGQUIT on to the child.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.reliability import processes
from harness.reliability.safe import describe_exception
from harness.reliability.witness import CLIENT, Client, Ending, Witnessed, role
from harness.reports import render

PASSED_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SHOWN = 10  # tests not run, named on the terminal


def wanted(config) -> bool:
    option = config.option
    quiet_runs = ("help", "version", "collectonly", "showfixtures", "show_fixtures_per_test", "markers")
    return (hasattr(os, "fork") and hasattr(socket, "send_fds") and role(config) == "plain"
            and not config.getoption("no_supervisor", False) and "PYTEST_CURRENT_TEST" not in os.environ
            and not any(getattr(option, name, False) for name in quiet_runs)
            and _from_the_command_line() and not _measured_by_coverage())


def _from_the_command_line() -> bool:
    """`pytest` or `python -m pytest`, not a program that calls pytest.main() and goes on after it."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return script.name in ("pytest", "py.test") or (script.name == "__main__.py" and script.parent.name == "pytest")


def _measured_by_coverage() -> bool:
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    return callable(current) and current() is not None


# Whether a pytest session already began in this process: a session started inside it (pytester's
# in-process runs) is never supervised, even after an earlier inner session took the outer test's
# PYTEST_CURRENT_TEST away with its own. A fork inherits it; a subprocess starts afresh.
_a_session_began = False


def supervise(config) -> int | None:
    """From pytest_cmdline_main: None in the child, which runs the session (and where nothing is
    supervised); in the parent, once the child ended, the run's exit status."""
    global _a_session_began
    nested, _a_session_began = _a_session_began, True
    if nested or not wanted(config):
        return None
    ours, theirs = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        config.pluginmanager.register(Client(theirs, config, everything=True), CLIENT)
        return None
    theirs.close()
    return Supervisor(config, pid, ours).wait()


class Supervisor:
    def __init__(self, config, pid: int, sock: socket.socket):
        self.config, self.pid, self.sock = config, pid, sock
        self.seen = Witnessed()
        self.stopped_by: int | None = None  # a signal passed on to the child
        processes.become_subreaper()  # what the child leaves behind comes back here, to be ended

    def wait(self) -> int:
        previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
        for signum in PASSED_ON:
            previous[signum] = signal.signal(signum, self._pass_on)
        try:
            status = self._watch()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.conclude(Ending.from_wait_status(status))

    def _pass_on(self, signum, frame) -> None:
        self.stopped_by = signum
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def _watch(self) -> int:
        """Read the child's messages until it has ended; its wait status."""
        try:
            child = os.pidfd_open(self.pid)  # readable once the child has ended
        except (AttributeError, OSError):
            child = None
        reading = True  # until the child's end of the socket closes (a grandchild may hold it open longer)
        while True:
            waiting_on = ([self.sock] if reading else []) + ([child] if child is not None else [])
            ready = select.select(waiting_on, [], [], None if child is not None else 0.1)[0]
            if self.sock in ready:
                reading = self.seen.receive(self.sock) is not None
            if child is None or child in ready:
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
        self.seen.drain(self.sock)  # what it wrote just before it ended
        if child is not None:
            os.close(child)
        self.sock.close()
        return status

    # -- after the child ended -----------------------------------------------------------------
    def conclude(self, ending: Ending) -> int:
        left = self._end_leftovers()
        if self.seen.finished is not None:
            self.seen.close()
            if ending.signum is not None or ending.code != self.seen.finished:
                self._say(f"every test was reported, then the process running them {ending.describe()} while "
                          f"Python shut down (the session's own status was {self.seen.finished})", left)
            elif left:
                self._say("the session ended normally", left)
            return ending.shell_status
        if ending.code == pytest.ExitCode.USAGE_ERROR and self.seen.header is None and not left:
            self.seen.close()  # a usage error before the session began: the child said what was wrong
            return ending.shell_status
        report = self._crash_report(ending)
        self.seen.forget_output()
        self.seen.close()
        self._say(report["message"], left, report["summary"])
        return ending.shell_status if self.stopped_by is not None else 1

    def _crash_report(self, ending: Ending) -> dict:
        seen, timeout = self.seen, float(self.config.getoption("test_timeout", 0) or 0)
        elapsed = time.time() - seen.started if seen.started is not None else None
        stopped = self.stopped_by is not None
        if seen.crash is not None:  # the harness's own word: the watchdog ended a hang
            nodeid, phase, why = seen.crash["nodeid"], seen.crash["when"], seen.crash["reason"]
        else:
            nodeid, phase = seen.running, seen.phase
            why = (f"the process running the tests {ending.describe()}"
                   + (f" {elapsed:.1f} s into {phase or 'the test'}" if nodeid and elapsed is not None else "")
                   + (f" (stopped from outside: the supervisor passed on {signal.Signals(self.stopped_by).name})"
                      if stopped else f": {ending.cause(elapsed, timeout)}"))
        lines = seen.last_lines()
        reason = why + (f"\n{lines}" if lines else "")
        tests = dict(seen.entries)
        if nodeid:
            tests[nodeid] = {"nodeid": nodeid, "outcome": "interrupted" if stopped else "failed",
                             "duration": round(elapsed or 0.0, 6), "reason": reason}
        not_run = [n for n in seen.collected if n not in tests]
        after = (f"the run was stopped ({ending.describe()})" if stopped else
                 f"the process running the tests {ending.describe()} during {nodeid or 'the session'}")
        for n in not_run:
            tests[n] = {"nodeid": n, "outcome": "not run", "duration": 0.0,
                        "reason": f"not run: {after}; under pytest-xdist (-n 1) a new worker runs the rest"}
        summary = Counter(t["outcome"] for t in tests.values())
        message = (f"{nodeid} ({phase or 'between phases'}) was running when {why}" if nodeid else
                   f"no test was running when {why}") + (f"\n{lines}" if lines else "")
        if not_run:
            shown = ", ".join(not_run[:SHOWN]) + (f", and {len(not_run) - SHOWN} more" if len(not_run) > SHOWN else "")
            message += (f"\n{len(not_run)} test(s) were not run, the process that would have run them having "
                        f"ended: {shown}. Under pytest-xdist (-n 1) a new worker runs the rest.")
        written = self._write_report(tests, summary)
        if written:
            message += f"\nconformance report: {written} (complete: false)"
        return {"message": message, "summary": summary}

    def _write_report(self, tests: dict, summary: Counter) -> str | None:
        header, directory = self.seen.header, self.config.getoption("report_dir", None)
        if header is None or directory is None:
            return None
        data = {**header, "seconds": round(time.time() - header.get("started", time.time()), 3), "complete": False,
                "summary": dict(summary), "tests": [tests[n] for n in sorted(tests)]}
        stem = Path(directory) / f"conformance-{header['runtime']}"
        try:
            stem.parent.mkdir(parents=True, exist_ok=True)
            stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        except OSError as exc:
            return f"could not be written ({describe_exception(exc)})"
        try:
            markdown = render.render_markdown(data)
        except Exception as exc:  # noqa: BLE001 - the JSON holds every result
            markdown = f"# Conformance report: {header['runtime']}\n\nnot rendered: {describe_exception(exc)}\n"
        stem.with_suffix(".md").write_text(markdown)
        return f"{stem.with_suffix('.json')}, {stem.with_suffix('.md')}"

    def _end_leftovers(self) -> list[str]:
        """What outlived the child (its descendants come back here): given a moment, then ended."""
        left = processes.settled(processes.descendants, processes.AFTER_EXIT_S)
        lines = processes.end_and_describe(list(left.values()))
        processes.reap_ended()  # everything that ended here is reaped here: nobody else waits for it
        return lines

    def _say(self, message: str, left: list[str], summary: Counter | None = None) -> None:
        text = f"\n{' cudagraph-conformance: the test process ended ':=^100}\n{message}\n"
        if left:
            text += f"it left {len(left)} process(es) running, ended now:\n    " + "\n    ".join(left) + "\n"
        if summary:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(summary.items()))
            text += f"{' ' + counts + ' ':=^100}\n"
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError:  # the reader of our output went away (`pytest ... | head`); the report has it all
            pass
