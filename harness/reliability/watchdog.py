"""The last line against a test that never returns: a thread, and faulthandler's C thread behind
it, that end the process where SIGALRM could not stop the test.

SIGALRM only interrupts Python bytecode in the main thread. A step blocked in native code (a
mutex, a busy C loop, a CUDA synchronize) never sees it. Two deadlines stand behind it:

1. `Watchdog` (a Python thread; it runs whenever the blocked code released the GIL, as blocking
   C calls and CUDA synchronisation do): writes a banner and every thread's stack to the
   terminal, lets the harness record the test as timed out and flush its report, then ends the
   process with `os._exit(1)`.
2. `faulthandler.dump_traceback_later(exit=True)` (a C thread that needs no GIL): for code that
   holds the GIL for ever. It dumps the stacks and exits; the report keeps what its last
   periodic flush wrote, and under xdist the controller reports the test as crashed.

Under xdist the worker's exit is seen by the controller, which reports the test as failed,
starts a new worker and runs the rest.
"""
from __future__ import annotations

import faulthandler
import os
import threading
import time
from typing import Callable, Optional

EXIT_CODE = 1  # pytest's "tests failed"


class Watchdog:
    """One deadline at a time: `arm()` before a test phase, `disarm()` after it."""

    def __init__(self, stderr_fd: int, on_expire: Callable[[str, str, float, Optional[str]], None],
                 faulthandler_too: bool = True):
        self.fd = stderr_fd  # a duplicate of the terminal's stderr, taken before capture hides it
        self.on_expire = on_expire  # (nodeid, phase, seconds, kind): record and flush the report; must not block long
        self.faulthandler_too = faulthandler_too  # False where pytest's own faulthandler_timeout owns it
        self._lock = threading.Condition()
        self._armed: tuple[float, str, str, float, str | None] | None = None  # (deadline, nodeid, phase, seconds, kind)
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="cudagraph-conformance-watchdog", daemon=True)
        self._thread.start()

    def arm(self, nodeid: str, phase: str, seconds: float, last_resort: float, kind: str | None = None) -> None:
        with self._lock:
            self._armed = (time.monotonic() + seconds, nodeid, phase, seconds, kind)
            self._lock.notify()
        if self.faulthandler_too:
            faulthandler.dump_traceback_later(last_resort, exit=True, file=self.fd)

    def disarm(self) -> None:
        if self.faulthandler_too:
            faulthandler.cancel_dump_traceback_later()
        with self._lock:
            self._armed = None
            self._lock.notify()

    def stop(self) -> None:
        self.disarm()
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._stopped:
                    return
                if self._armed is None:
                    self._lock.wait()
                    continue
                left = self._armed[0] - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                _, nodeid, phase, seconds, kind = self._armed
                break
        self._expire(nodeid, phase, seconds, kind)

    def _expire(self, nodeid: str, phase: str, seconds: float, kind: str | None) -> None:
        self._write(f"\n{'=' * 30} cudagraph-conformance watchdog {'=' * 30}\n"
                    f"{nodeid} ({phase}) is still running {seconds:g} s after it started, and SIGALRM did not "
                    "stop it: it is blocked in native code. Stacks of every thread:\n")
        faulthandler.dump_traceback(file=self.fd, all_threads=True)
        try:
            self.on_expire(nodeid, phase, seconds, kind)
        except BaseException as exc:  # noqa: BLE001 - the process ends next whatever happened
            self._write(f"(the report could not be flushed: {type(exc).__name__})\n")
        self._write(f"Ending the process (exit code {EXIT_CODE}): the test cannot be stopped any other way.\n")
        os._exit(EXIT_CODE)

    def _write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode("utf-8", "replace"))
        except OSError:
            pass
