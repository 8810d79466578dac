"""Keeping a run alive when the runtime under test misbehaves.

- A test that runs past `--test-timeout` seconds fails with a TimeoutError (SIGALRM, where the
  platform has it) instead of hanging the run.
- A runtime exception fails its test with a section naming the runtime.
- A sticky CUDA error (an illegal address, a device-side assert) poisons the context for the
  rest of the process: later tests that build engines are skipped with the poisoning test's id.
Whatever happens, the report plugin still writes what ran.
"""
from __future__ import annotations

import re
import signal

import pytest

STICKY_CUDA_ERROR = re.compile(
    r"illegal memory access|illegal instruction|device-side assert|unspecified launch failure|"
    r"misaligned address|CUDA error: (an )?illegal|cudaErrorIllegalAddress|CUBLAS_STATUS_EXECUTION_FAILED",
    re.IGNORECASE,
)


class Robustness:
    def __init__(self, config, runtime_name: str):
        self.timeout = config.getoption("test_timeout")
        self.runtime_name = runtime_name
        self.poisoned: tuple[str, str] | None = None  # (test id, error) that broke the CUDA context

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if self.poisoned and {"engines", "bench_engines"} & set(getattr(item, "fixturenames", ())):
            nodeid, error = self.poisoned
            pytest.skip(f"the CUDA context was poisoned by {nodeid} ({error}); GPU tests after it cannot run")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        armed = self.timeout and hasattr(signal, "SIGALRM")
        if armed:
            def expire(signum, frame):
                raise TimeoutError(f"test ran past --test-timeout={self.timeout:g} s (runtime {self.runtime_name!r})")

            previous = signal.signal(signal.SIGALRM, expire)
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            yield
        finally:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.excinfo is None or not report.failed:
            return
        error = call.excinfo.value
        if isinstance(error, (AssertionError, pytest.fail.Exception)):
            return
        text = f"{type(error).__name__}: {error}"
        report.sections.append(("runtime error", f"runtime {self.runtime_name!r} raised {text.splitlines()[0]} "
                                                 f"during {call.when} of {item.nodeid}"))
        if STICKY_CUDA_ERROR.search(text) and self.poisoned is None:
            self.poisoned = (item.nodeid, text.splitlines()[0][:200])


def share_the_machine(config, graph_backend: str) -> None:
    """Under xdist, worker gwN uses GPU N mod count, so workers do not share one device; on the
    CPU each worker computes on one thread, so N workers do not oversubscribe N cores. The CUDA
    graph log starts counting as soon as CUDA graphs are the backend."""
    import torch

    worker = getattr(config, "workerinput", {}).get("workerid")
    if graph_backend == "cuda":
        from .graphs.log import watch_cuda_graphs

        watch_cuda_graphs()
        if worker and torch.cuda.device_count() > 1:
            torch.cuda.set_device(int(worker.lstrip("gw")) % torch.cuda.device_count())
    elif worker:
        torch.set_num_threads(1)
