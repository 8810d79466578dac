"""Keeping a run alive, and its report true, whatever the runtime under test does.

- Time: every test phase (setup, call, teardown) that runs past `--test-timeout` fails with a
  TimeoutError (SIGALRM); one blocked where SIGALRM cannot reach (native code) is ended by the
  watchdog (harness.reliability.watchdog), which records it in the report first.
- Exceptions: anything raised is a failure with a reason, never an internal error. A raised
  KeyboardInterrupt ends only its test (a real Ctrl-C, seen by this module's SIGINT handler,
  still ends the run); an exception pytest cannot format still gives a report; reports and
  captured output are bounded; a "what raised" section names the runtime, the harness, the
  test or a library (hypothesis, torch) by where the exception came from.
- CUDA: a context counts as poisoned only on evidence: a tiny kernel and a synchronize fail
  after a test. Later GPU tests are then skipped, naming the test and the probe's result.
- Taint: process-wide state a test changed is put back and fails that test (harness.reliability.isolation),
  and processes it left running are ended and fail it (harness.reliability.processes).
- Hangs: after two in a row, the runtime's remaining tests of that kind are skipped (harness.reliability.hangs).
- Death: a witness outside the process reports the test that was running when it died
  (harness.reliability.witness, supervisor, workers).
Whatever happens, the report plugin still writes what ran.
"""
from __future__ import annotations

import builtins
import gc
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.reliability import isolation, workers
from harness.reliability.hangs import ENGINE_FIXTURES, KIND_ATTRIBUTE, REPORT_PLUGIN, Hang, HangRecord, kind_of
from harness.reliability.processes import AFTER_EXIT_S, ProcessWatch
from harness.reliability.safe import bounded, describe_exception, safe_str
from harness.reliability.watchdog import Watchdog
from harness.reliability.witness import CLIENT, role

REPORT_LIMIT = 20_000  # characters of a failure's text or a captured-output section
RUNTIME_FIXTURES = {"runtime", "engines", "engine_factory", "bench_engines"}  # tests that run runtime code
GPU_FIXTURES = ENGINE_FIXTURES  # tests that need a working CUDA context
BEFORE = pytest.StashKey[dict]()  # process state before the test (harness.reliability.isolation)
PROCESSES = pytest.StashKey[frozenset]()  # the processes running before the test (harness.reliability.processes)
HUNG = pytest.StashKey[bool]()  # a phase ran past --test-timeout
CALLED = pytest.StashKey[bool]()  # the test's call phase ran
HELD = pytest.StashKey[int]()  # engines the factories held when setup ended
FIRST_ERROR = pytest.StashKey[str]()  # what the test raised first
FAILED = pytest.StashKey[bool]()
_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+


FORCED_AFTER_PRESSES = 3  # the third Ctrl-C stops even the report's writing

class RaisedInterrupt(Exception):
    """A KeyboardInterrupt that no Ctrl-C caused: raised by the code under test, it ends its test only."""


def cuda_probe() -> str | None:
    """What failed when a one-element kernel and a synchronize ran; None where they worked or where
    no CUDA context exists to judge (torch not imported, or CUDA never initialised)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        value = (torch.ones(1, device="cuda") + 1).item()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the failure is the answer
        return f"a one-element kernel and torch.cuda.synchronize() raised {describe_exception(exc, 300)}"
    return None if value == 2 else f"a one-element kernel computed {value}, not 2"


class Robustness:
    def __init__(self, config, runtime):
        self.config = config
        self.timeout = float(config.getoption("test_timeout") or 0)
        self.grace = min(self.timeout, 30.0)  # SIGALRM's chance before the watchdog acts, then faulthandler's
        self.runtime_name = runtime.name
        self.runtime_packages = _packages_of(type(runtime))
        self.probe = cuda_probe  # replaceable: the self-tests stand in a broken context on the CPU
        self.poisoned: tuple[str, str, str] | None = None  # (test, what it raised, what the probe saw)
        self.ctrl_c = False  # a real SIGINT arrived (a person pressed Ctrl-C)
        self.ctrl_presses = 0
        self.watchdog: Watchdog | None = None
        self.expired = False  # SIGALRM fired during the current phase
        self._saved_handlers: dict = {}
        self._stderr_fd: int | None = None
        self.tests_run_here = role(config) != "controller"
        self.processes = ProcessWatch(runtime) if self.tests_run_here else None
        self.hangs = HangRecord(getattr(config, "workerinput", {}).get(workers.HANGS_KEY, ()))
        self.left_at_the_end: list[str] = []  # processes the session left running, ended as it ended
        workers.attach(config, runtime.name)

    # -- session ----------------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        if _main_thread():
            self._saved_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
        if self.timeout:
            self._stderr_fd = os.dup(2)  # the terminal: capture is suspended between tests
            exit_by_faulthandler = not float(self.config.getini("faulthandler_timeout") or 0)
            self.watchdog = Watchdog(self._stderr_fd, self._expired, faulthandler_too=exit_by_faulthandler)

    def pytest_unconfigure(self, config):
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._stderr_fd is not None:
            os.close(self._stderr_fd)
        for signum, handler in self._saved_handlers.items():
            if signum == signal.SIGINT and self.ctrl_c:
                continue  # a stopped run exits next: a second Ctrl-C must not cut its cleanup short
            signal.signal(signum, handler)

    def _on_sigint(self, signum, frame):
        self.ctrl_presses += 1
        if self.ctrl_c and self.ctrl_presses < FORCED_AFTER_PRESSES:
            # Already stopping: a second Ctrl-C must not cut the report and the workers' ending short.
            os.write(2, b"\ncudagraph-conformance: stopping; the report and the workers are being closed "
                        b"(Ctrl-C once more to force)\n")
            return
        self.ctrl_c = True
        previous = self._saved_handlers.get(signal.SIGINT)
        if previous is signal.SIG_IGN:
            return
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    def _expired(self, nodeid: str, when: str, seconds: float, kind: str | None = None) -> None:
        """The watchdog's last act before it ends the process: the test goes into the report, and to
        the witness (the supervisor or the xdist controller), as a hang."""
        reason = (f"timed out: {when} still running {seconds:g} s after it started (--test-timeout={self.timeout:g} s "
                  f"and its grace), blocked where SIGALRM cannot reach (native code); the watchdog dumped every "
                  f"thread's stack to stderr and ended the process (runtime {self.runtime_name!r})")
        run_report = self.config.pluginmanager.get_plugin(REPORT_PLUGIN)
        if run_report is not None:  # absent on xdist workers: the controller reports the crash
            run_report.record_crash(nodeid, when, reason)
        client = self.config.pluginmanager.get_plugin(CLIENT)
        if client is not None:
            hang = Hang(nodeid, when, self.timeout, kind, "the watchdog ended the process") if kind else None
            client.note(nodeid, when, reason, hang=asdict(hang) if hang else None)

    # -- every phase: bounded in time, a raised KeyboardInterrupt ends only the test ----------
    @contextmanager
    def _phase(self, item, when: str):
        self.expired = False
        previous = self._arm(item.nodeid, when, kind_of(item))
        try:
            yield
        except KeyboardInterrupt as exc:
            if self.ctrl_c:
                raise
            raise RaisedInterrupt(f"{describe_exception(exc)} was raised by the code under test, not by Ctrl-C: "
                                  "it ends this test only").with_traceback(exc.__traceback__) from None
        except MemoryError as exc:
            # The frames hold whatever filled memory; free it so the report can be written.
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            self._disarm(previous)
            if self.expired and kind_of(item) is not None:  # SIGALRM fired in this phase: a hang
                self.hangs.hung(Hang(item.nodeid, when, self.timeout, kind_of(item)))
                item.stash[HUNG] = True

    def _arm(self, nodeid: str, when: str, kind: str | None):
        if not self.timeout:
            return None
        previous = None
        if _main_thread() and hasattr(signal, "SIGALRM"):
            def expire(signum, frame):
                self.expired = True
                raise TimeoutError(f"test ran past --test-timeout={self.timeout:g} s in {when} "
                                   f"(runtime {self.runtime_name!r})")

            handler = signal.signal(signal.SIGALRM, expire)
            outer, _ = signal.setitimer(signal.ITIMER_REAL, self.timeout)
            previous = (handler, outer, time.monotonic())
        if self.watchdog is not None:
            self.watchdog.arm(nodeid, when, self.timeout + self.grace, self.timeout + 2 * self.grace, kind)
        return previous

    def _disarm(self, previous) -> None:
        if not self.timeout:
            return
        if self.watchdog is not None:
            self.watchdog.disarm()
        if previous is not None:
            handler, outer, started = previous
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, handler)
            if outer:  # a session around this one (pytester) had an alarm running: give it back what is left
                signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        if RUNTIME_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.stash[BEFORE] = isolation.snapshot()
            if self.processes is not None:
                item.stash[PROCESSES] = self.processes.snapshot()
        with self._phase(item, "setup"):
            self._skip_if_poisoned(item)
            reason = self.hangs.skip_reason(kind_of(item), self.runtime_name)
            if reason:
                pytest.skip(reason)
            result = yield
        item.stash[HELD] = _engines_cached(item)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        item.stash[CALLED] = True
        with self._phase(item, "call"):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        with self._phase(item, "teardown"):
            if BEFORE in item.stash:
                # The test's young garbage, now: a __del__ that raises there is reported with this test
                # (pytest collects unraisable exceptions at the end of the phase), not with a later one.
                gc.collect(1)
            try:
                return (yield)
            finally:
                self._after(item)
                if item.stash.get(CALLED, False) and not item.stash.get(HUNG, False):
                    self.hangs.ended(kind_of(item))

    # -- after a test: taint, processes and the CUDA context ------------------------------------
    def _after(self, item) -> None:
        before = item.stash.get(BEFORE, None)
        # State outside CUDA first: a mode or default device left behind must not fool the probe.
        changes = isolation.undo(before, keep=lambda name: name not in isolation.CUDA_STATE) if before else []
        broken = None
        if self.poisoned is None and GPU_FIXTURES & set(getattr(item, "fixturenames", ())):
            broken = self.probe()
            if broken is not None:
                self.poisoned = (item.nodeid, item.stash.get(FIRST_ERROR, "nothing"), broken)
        if before and broken is None and self.poisoned is None:  # a broken context's state says nothing
            # Memory a failed test's traceback holds, or a newly cached engine holds, is not a leak.
            memory_counts = not item.stash.get(FAILED, False) and _engines_cached(item) <= item.stash.get(HELD, 0)
            changes += isolation.undo(before, keep=lambda name: name in isolation.CUDA_STATE
                                      and (memory_counts or name != isolation.MEMORY))
        problems = self.processes.check(item.stash[PROCESSES]) if PROCESSES in item.stash else []
        if broken is not None:
            problems.append(f"the CUDA context is broken after this test (it raised {self.poisoned[1]}): {broken}; "
                            "later GPU tests in this process are skipped")
        if changes:
            problems.append("the test left process-wide state changed, which would taint the tests after it "
                            "(docs/reliability.md):\n  " + "\n  ".join(changes))
        if problems:
            pytest.fail(f"runtime {self.runtime_name!r}: " + "\n".join(problems), pytrace=False)

    # -- the session's end: nothing it started outlives it ----------------------------------------
    @pytest.hookimpl(trylast=True)  # after the session's fixtures were torn down
    def pytest_sessionfinish(self, session):
        if self.processes is None:
            return
        self.left_at_the_end = self.processes.end_of_session(AFTER_EXIT_S)
        if hasattr(self.config, "workeroutput"):  # the controller says it
            self.config.workeroutput[workers.ENDED_KEY] = self.left_at_the_end

    def pytest_terminal_summary(self, terminalreporter):
        if self.left_at_the_end:
            terminalreporter.write_line(
                f"cudagraph-conformance: ended {len(self.left_at_the_end)} process(es) left running when the session "
                f"ended: {'; '.join(self.left_at_the_end)}", yellow=True)

    def _skip_if_poisoned(self, item) -> None:
        if self.poisoned and GPU_FIXTURES & set(getattr(item, "fixturenames", ())):
            nodeid, raised, probe = self.poisoned
            pytest.skip(f"the CUDA context was poisoned by {nodeid} (it raised {raised}; then {probe}): "
                        "GPU tests after it cannot run in this process")

    # -- reports: always made, bounded, and naming what raised --------------------------------
    @pytest.hookimpl(wrapper=True, trylast=True)  # innermost: sees pytest's report before other plugins do
    def pytest_runtest_makereport(self, item, call):
        try:
            report = yield
        except BaseException as exc:  # noqa: BLE001 - pytest could not format what the test raised
            if isinstance(exc, KeyboardInterrupt) and self.ctrl_c:
                raise
            report = self._plain_report(item, call, exc)
        _bound(report)
        if report.failed:
            item.stash[FAILED] = True
        if call.when == "call" and not item.stash.get(HUNG, False) and kind_of(item):
            setattr(report, KIND_ATTRIBUTE, kind_of(item))  # under xdist, the controller counts hangs in a row
        error = call.excinfo.value if call.excinfo else None
        if error is not None and report.failed and not isinstance(error, (AssertionError, pytest.fail.Exception)):
            item.stash.setdefault(FIRST_ERROR, describe_exception(error, 300))
            try:
                origin = self.what_raised(item, error, call.when)
            except Exception as exc:  # noqa: BLE001 - an exception hostile enough to break even this
                origin = (f"{describe_exception(error, 300)}; where it came from cannot be told "
                          f"({describe_exception(exc)})")
            report.sections.append(("what raised", origin))
        return report

    def _plain_report(self, item, call, failure: BaseException):
        raised = describe_exception(call.excinfo.value) if call.excinfo else "nothing"
        text = (f"{call.when} raised {raised}; pytest could not format it ({describe_exception(failure)}), "
                "so this is all the harness can say")
        return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, call.when,
                                 duration=call.duration, start=call.start, stop=call.stop,
                                 user_properties=item.user_properties)

    def what_raised(self, item, error: BaseException, when: str) -> str:
        """Who raised: the runtime wherever one of its frames is on the traceback (of the error, or of
        one it wraps: hypothesis reports a flaky runtime's errors in a group), else the owner of the
        innermost frame (the harness, hypothesis, pytest, the test, a library)."""
        text = f"{describe_exception(error, 500)} during {when} of {item.nodeid}"
        for inner in _wrapped(error):
            frames = _frames(inner)
            ours = [f for f in frames if _top(f[0]) in self.runtime_packages]
            if ours:
                inside = "" if frames[-1] is ours[-1] else f" (inside {_owner(frames[-1][0], item)})"
                through = "" if inner is error else f"{describe_exception(inner, 300)}, reported as "
                return f"runtime {self.runtime_name!r} raised {through}{text}, at {self._where(ours[-1])}{inside}"
        frames = _frames(error)
        if not frames:
            return f"raised {text}"
        owner = _owner(frames[-1][0], item)
        blame = "the test or its strategy and settings, not the runtime" if owner == "hypothesis" else "not the runtime"
        return f"{owner} raised {text}, at {self._where(frames[-1])}; {blame}"

    def _where(self, frame) -> str:
        path = Path(frame[1])
        try:
            path = path.relative_to(self.config.rootpath)
        except ValueError:
            pass
        return f"{path}:{frame[2]}"


def _bound(report) -> None:
    if report.longrepr is not None and not isinstance(report.longrepr, tuple):  # a tuple is a skip's location
        text = safe_str(report.longrepr, REPORT_LIMIT + 1)
        if len(text) > REPORT_LIMIT:
            report.longrepr = bounded(text, REPORT_LIMIT)
    report.sections = [(title, bounded(content if isinstance(content, str) else safe_str(content), REPORT_LIMIT))
                       for title, content in report.sections]


def _frames(error: BaseException) -> list[tuple[str, str, int]]:
    """(module, file, line) of each frame the exception passed through, outermost first."""
    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_globals.get("__name__") or "?", tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _wrapped(error: BaseException, depth: int = 0):
    """The error, then the errors it carries (an exception group's members, its cause), a few levels deep."""
    yield error
    if depth < 3:
        members = tuple(error.exceptions) if isinstance(error, _GROUP) else ()
        for inner in (*members, error.__cause__):
            if isinstance(inner, BaseException):
                yield from _wrapped(inner, depth + 1)


def _top(module: str) -> str:
    return module.partition(".")[0]


def _owner(module: str, item) -> str:
    top = _top(module)
    if top == "harness":
        return "the harness"
    if top in ("_pytest", "pytest", "pluggy"):
        return "pytest"
    if module == getattr(getattr(item, "module", None), "__name__", None):
        return "the test"
    return top


def _packages_of(cls) -> frozenset[str]:
    """The top-level packages the runtime's classes come from: frames there are the runtime's."""
    return frozenset(_top(c.__module__) for c in cls.__mro__ if c.__module__ not in ("builtins", "typing")) \
        - {"harness", "_pytest", "pytest"}


def _engines_cached(item) -> int:
    funcargs = getattr(item, "funcargs", None) or {}
    return sum(getattr(funcargs.get(name), "engines_cached", 0) for name in ("engine_factory", "bench_engines"))


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
