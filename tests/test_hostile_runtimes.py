"""Nothing a runtime does takes the harness down or taints the tests after it.

Each test runs a real pytest session against a hostile runtime (tests/hostile_runtimes.py) and
checks that the run ended by itself, failed what the runtime did with a reason, showed no
INTERNALERROR, and that the JSON report lists every test that ran with its outcome and reason.
In-process where nothing needs a fresh process; in a subprocess where the process must end
(the watchdog), where xdist must replace a worker, or where a memory limit must not reach this one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from importlib import metadata
from contextlib import contextmanager
import signal
import sys
import textwrap

import pytest
import torch  # imported here also so that in-process runs share it rather than import it again

from harness.reliability import robustness
from tests import hostile_runtimes

# A checkout that is not installed (a GPU machine run with PYTHONPATH) has no entry point for the
# plugin: a subprocess in pytester's folder must be told to load it.
PLUGIN = () if any(ep.value == "harness.plugin" for ep in metadata.entry_points(group="pytest11")) else (
    "-p", "harness.plugin")
ROOT = Path(__file__).resolve().parent.parent


# What a stand-in CUDA allocator (STAND_IN_ALLOCATOR here, RUNTIMES in test_engine_memory.py)
# replaces, process-wide: a session run in this process with one puts these back after it.
STAND_IN_REPLACES = [*((torch.cuda, name) for name in ("is_initialized", "is_available", "device_count",
                                                        "memory_allocated", "get_rng_state_all", "empty_cache")),
                     (robustness, "cuda_probe")]


@contextmanager
def putting_back(replaced):
    """Run the block, then give each (owner, name) in `replaced` the value it had before; fail, naming
    it, where the block replaced anything else its owners had (the list is out of date, and the
    replacement would outlive the test). Names the block added (modules imported lazily) are left."""
    owners = list({id(owner): owner for owner, _ in replaced}.values())
    before = [(owner, dict(vars(owner))) for owner in owners]
    originals = [(owner, name, getattr(owner, name)) for owner, name in replaced]
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        changed = [(owner, name, value) for owner, snapshot in before
                   for name, value in snapshot.items() if vars(owner).get(name, value) is not value]
        for owner, name, value in changed:  # put those back too, so a stale list fails one test only
            setattr(owner, name, value)
        names = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in changed]
        assert not changed, f"replaced and not in the list given to putting_back: {names}"


@pytest.fixture(autouse=True)
def importable_from_anywhere(monkeypatch):
    """Subprocess sessions start in pytester's folder: they find tests.hostile_runtimes from the root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the native hangs lock a pthread mutex through libc")


def run(pytester, runtime: str, tests: str, *args: str, subprocess: bool = False, conftest: str = "",
        supervised: bool = False, fails: bool = True):
    """Run `tests` against `runtime` (a class in tests/hostile_runtimes.py, or the name of one a
    conftest registers); return (result, {test name: its JSON entry}, the JSON report).
    `supervised`: in a subprocess that is a run of its own, as a user's is (pytest run from a test
    leaves crashes to the test's own session, PYTEST_CURRENT_TEST says so)."""
    pytester.makepyfile(test_inner=textwrap.dedent(tests))
    if conftest:
        pytester.makeconftest(textwrap.dedent(conftest))
    spec = f"tests.hostile_runtimes:{runtime}" if hasattr(hostile_runtimes, runtime) else runtime
    argv = [*PLUGIN, "--runtime", spec, "--report-dir", "out", "-p", "no:cacheprovider", *args]
    current = os.environ.pop("PYTEST_CURRENT_TEST") if supervised else None
    try:
        result = (pytester.runpytest_subprocess(*argv) if subprocess or supervised
                  else pytester.runpytest("-p", "no:xdist", *argv, no_reraise_ctrlc=True))
    finally:
        if current is not None:
            os.environ["PYTEST_CURRENT_TEST"] = current
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert (result.ret != 0) == fails, output[-3000:]  # a run with something to fail fails
    data = json.loads((pytester.path / "out" / f"conformance-{_name(runtime)}.json").read_text())
    assert all(entry.get("reason") for entry in data["tests"] if entry["outcome"] != "passed"), data["tests"]
    tests = {entry["nodeid"].split("::")[1].split("[")[0]: entry for entry in data["tests"]}
    return result, tests, data


def _name(runtime: str) -> str:
    cls = getattr(hostile_runtimes, runtime, None)
    return cls.name if cls else runtime


def outcomes(tests: dict) -> dict[str, str]:
    return {name: entry["outcome"] for name, entry in tests.items()}


def hostile(name: str):
    """The hostile runtime a self-test runs, in its id, for the catch table (tests/conftest.py)."""
    return pytest.mark.parametrize("hostile", [name])


# -- 1. any exception is a failure with a reason -------------------------------------------------
@hostile("RaisesTheUnprintable")
def test_unprintable_and_world_ending_exceptions_fail_only_their_test(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, """
        from hypothesis import given, strategies as st
        from harness.protocol import PolicyConfig, RankBatch, ResolveRequest

        def test_unprintable(runtime):
            runtime.capture_sizes(PolicyConfig())
        def test_enormous(runtime):
            runtime.padded_size(PolicyConfig(), 5)
        def test_system_exit(runtime):
            runtime.dispatch(PolicyConfig(), 5)
        def test_keyboard_interrupt(runtime):
            runtime.resolve_mode(ResolveRequest("FULL", "ALWAYS"))
        def test_breaks_tracebacks(runtime):
            runtime.dp_dispatch(PolicyConfig(), [RankBatch(1)])
        @given(st.integers().filter(lambda x: False))
        def test_health_check(runtime, x):
            pass
        def test_after(runtime):
            pass
    """)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes(tests) == {**{name: "failed" for name in tests}, "test_after": "passed"}
    assert len(tests) == 7 and data["complete"]
    reasons = {name: entry.get("reason", "") for name, entry in tests.items()}
    assert "UnprintableError" in reasons["test_unprintable"]
    assert "characters cut" in reasons["test_enormous"] and len(reasons["test_enormous"]) < 5000
    assert "SystemExit: 3" in reasons["test_system_exit"]
    assert "raised by the code under test, not by Ctrl-C" in reasons["test_keyboard_interrupt"]
    assert "BreaksTracebacks: ranks disagree" in reasons["test_breaks_tracebacks"]
    # pytest 9.0 cannot format a traceback whose __notes__ raise (the harness says so); 9.1 leaves them out itself.
    assert any(words in reasons["test_breaks_tracebacks"]
               for words in ("pytest could not format it", "Ignored error getting __notes__"))
    assert "FailedHealthCheck" in reasons["test_health_check"]
    output = result.stdout.str()
    assert len(output) < 200_000  # ten megabytes of message, bounded
    result.stdout.fnmatch_lines([
        "device: unknown: the runtime's device_description() raised UnprintableError*",
        "*runtime 'raises-the-unprintable' raised UnprintableError* during call of *test_unprintable*"
        "tests/hostile_runtimes.py:*",
        "*hypothesis raised FailedHealthCheck* during call of *test_health_check*; the test or its strategy*",
    ])
    # The __del__ that raised on the first test's garbage is reported with that test.
    result.stdout.fnmatch_lines(["*warnings summary*", "test_inner.py::test_unprintable*",
                                 "*PytestUnraisableExceptionWarning*RaisesFromDel.__del__*"])
    assert data["device"].startswith("unknown: the runtime's device_description() raised UnprintableError")
    record_property("caught_by", ["robustness: a failure with its reason", "safe: bounded text"])


def test_a_real_ctrl_c_still_stops_the_run(pytester):
    # The default handler underneath the inner session's, rather than this session's.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, tests, data = run(pytester, "Runtime", """
            import os, signal, time

            def test_before(runtime):
                pass
            def test_presses_ctrl_c(runtime):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            def test_never_runs(runtime):
                pass
        """)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert outcomes(tests) == {"test_before": "passed", "test_presses_ctrl_c": "interrupted"}
    assert data["complete"] is False


# -- 2. wrong answers are failures that say what was wrong ---------------------------------------
@hostile("GivesWrongAnswers")
def test_wrong_answers_fail_with_what_was_wrong(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, """
        import pytest
        from harness.protocol import PolicyConfig, RankBatch, Request, ResolveRequest
        from tests.hostile_runtimes import WRONG_CAPTURE, WRONG_ENGINE, WRONG_POLICY, WRONG_STEPS

        CALLS = {
            "capture_sizes": lambda r: r.capture_sizes(PolicyConfig()),
            "padded_size": lambda r: r.padded_size(PolicyConfig(), 5),
            "dispatch": lambda r: r.dispatch(PolicyConfig(), 5),
            "resolve_mode": lambda r: r.resolve_mode(ResolveRequest("FULL", "ALWAYS")),
            "dp_dispatch": lambda r: r.dp_dispatch(PolicyConfig(), [RankBatch(1), RankBatch(2)]),
        }

        @pytest.mark.parametrize("operation, pick", [(o, p) for o in WRONG_POLICY for p in WRONG_POLICY[o]])
        def test_policy(runtime, check, operation, pick):
            runtime.wrapped.pick = pick
            CALLS[operation](runtime)

        @pytest.mark.parametrize("pick", WRONG_STEPS)
        def test_step(runtime, engines, pick):
            runtime.wrapped.pick = pick
            engines.get(mode="NONE", capture=False, fresh=True).step([Request(engines.new_id(), (5,), 0)])

        @pytest.mark.parametrize("pick", WRONG_CAPTURE)
        def test_capture(runtime, engines, pick):
            runtime.wrapped.pick = pick
            engines.get(mode="NONE", fresh=True)

        @pytest.mark.parametrize("pick", WRONG_ENGINE)
        def test_engine(runtime, engines, pick):
            runtime.wrapped.pick = pick
            engines.get(mode="NONE", capture=False, fresh=True).static_buffer_addresses()
    """)
    expected = (sum(map(len, hostile_runtimes.WRONG_POLICY.values())) + len(hostile_runtimes.WRONG_STEPS)
                + len(hostile_runtimes.WRONG_CAPTURE) + len(hostile_runtimes.WRONG_ENGINE))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert data["summary"] == {"failed": expected}
    for entry in data["tests"]:
        reason = entry["reason"]
        assert "AttributeError" not in reason and "TypeError" not in reason, reason
        assert "the runtime's " in reason or "the engine's " in reason, reason
        assert "expected by: the protocol (harness/protocol.py)" in reason, reason
    reasons = {entry["nodeid"].split("[")[1].rstrip("]"): entry["reason"] for entry in data["tests"]}
    assert "returned None; expected a StepResult" in reasons["gives-wrong-answers-None"]
    assert "reported runtime_mode 'TURBO'" in reasons["gives-wrong-answers-mode-not-in-vocabulary"]
    assert "returned 2 for 5 tokens" in reasons["gives-wrong-answers-padded_size-below-the-batch"]
    assert "could not even inspect (ZeroDivisionError" in reasons["gives-wrong-answers-attributes-raise"]
    result.stdout.no_fnmatch_line("*what raised*")
    record_property("caught_by", ["validate: the protocol boundary"])


# -- 3. hangs in native code are bounded -------------------------------------------------------
MEMORY_LIMIT = """
    import resource

    from tests.hostile_runtimes import ExhaustsMemory, HangsInNativeCode

    def pytest_configure(config):
        # What this process holds now, and 512 MiB more: the runtime's allocations hit the limit.
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))

    class ExhaustsThenHangs(ExhaustsMemory):
        name = "exhausts-then-hangs"

        def padded_size(self, config, num_real_tokens):
            HangsInNativeCode.capture_sizes(self, config)

    def pytest_cudagraph_runtimes():
        return {"exhausts-then-hangs": ExhaustsThenHangs}
"""


@linux_only
@hostile("ExhaustsMemory+HangsInNativeCode")
def test_a_hang_in_native_code_ends_the_process_with_a_report(pytester, hostile, record_property):
    """Also memory exhaustion, capped by RLIMIT_AS in the subprocess: a failure, and the run goes on."""
    result, tests, data = run(pytester, "exhausts-then-hangs", """
        from harness.protocol import PolicyConfig

        def test_exhausts_memory(runtime):
            runtime.capture_sizes(PolicyConfig())
        def test_then_runs(runtime):
            bytearray(160 << 20)  # only if what the runtime held was freed with its failure
        def test_then_blocks_in_c(runtime):
            runtime.padded_size(PolicyConfig(), 5)
        def test_never_reached(runtime):
            pass
    """, "--test-timeout", "2", "-p", "no:xdist", supervised=True, conftest=MEMORY_LIMIT)
    assert result.ret == 1  # 2 s: at 1 s test_then_runs (160 MiB written) failed once in a full CI run
    assert outcomes(tests) == {"test_exhausts_memory": "failed", "test_then_runs": "passed",
                               "test_then_blocks_in_c": "failed", "test_never_reached": "not run"}, \
        tests["test_then_runs"].get("reason")  # on a loaded machine it once failed at 2 s too: say why
    assert "MemoryError" in tests["test_exhausts_memory"]["reason"]
    assert "timed out: call still running" in tests["test_then_blocks_in_c"]["reason"]
    assert "native code" in tests["test_then_blocks_in_c"]["reason"]
    assert "during test_inner.py::test_then_blocks_in_c" in tests["test_never_reached"]["reason"]
    assert data["complete"] is False
    result.stderr.fnmatch_lines(["*cudagraph-conformance watchdog*", "*test_then_blocks_in_c*blocked in native code*",
                                 "*in _deadlock*", "Ending the process (exit code 1)*"])
    result.stdout.fnmatch_lines(["*test_then_blocks_in_c* (call) was running when timed out*"])
    record_property("caught_by", ["robustness: frames freed on MemoryError", "watchdog: report flushed, process ended"])


@linux_only
@hostile("HangsInNativeCode")
def test_xdist_replaces_a_worker_that_hangs_holding_the_gil(pytester, hostile, record_property):
    """No Python thread runs while the GIL is held: faulthandler's C thread ends the worker, and the
    controller reports the test as failed and runs the rest on a new worker."""
    result, tests, data = run(pytester, hostile, """
        from harness.protocol import PolicyConfig

        def test_holds_the_gil_for_ever(runtime):
            runtime.padded_size(PolicyConfig(), 5)
        def test_after_1(runtime):
            pass
        def test_after_2(runtime):
            pass
    """, "--test-timeout", "0.5", "-n", "1", subprocess=True)
    assert result.ret == 1
    assert outcomes(tests) == {"test_holds_the_gil_for_ever": "failed", "test_after_1": "passed",
                               "test_after_2": "passed"}
    reason = tests["test_holds_the_gil_for_ever"]["reason"]
    assert "crashed while running" in reason and "blocked in native code past --test-timeout" in reason
    assert data["complete"] is True
    record_property("caught_by", ["watchdog: faulthandler ends the worker", "xdist: a new worker runs the rest"])


# -- 4. a poisoned CUDA context is decided by evidence -------------------------------------------
CUDA_TESTS = """
    from harness.protocol import Request

    def test_raises_cuda_words(engines):
        engines.get(mode="NONE", capture=False).step([Request(engines.new_id(), (5,), 0)])
    def test_later_gpu_test(engines):
        engines.get(mode="NONE", capture=False)
    def test_policy_only(runtime):
        pass
"""


def test_words_in_a_message_poison_nothing_without_a_cuda_context(pytester):
    result, tests, _ = run(pytester, "MentionsCudaErrors", CUDA_TESTS, "-rs")
    assert outcomes(tests) == {"test_raises_cuda_words": "failed", "test_later_gpu_test": "passed",
                               "test_policy_only": "passed"}
    result.stdout.no_fnmatch_line("*poisoned*")


@hostile("MentionsCudaErrors")
def test_a_failing_probe_after_the_error_skips_later_gpu_tests(pytester, hostile, record_property):
    # A stand-in for the probe: a context on this CPU-only machine that breaks once CUDA words were raised.
    result, tests, _ = run(pytester, hostile, CUDA_TESTS, conftest="""
        def pytest_configure(config):
            robustness = config.pluginmanager.get_plugin("cudagraph-conformance-robustness")
            robustness.probe = lambda: "torch.cuda.synchronize() raised (stand-in) CUDA error: an illegal memory access"
    """)
    assert outcomes(tests) == {"test_raises_cuda_words": "failed", "test_later_gpu_test": "skipped",
                               "test_policy_only": "passed"}
    poisoning = tests["test_raises_cuda_words"]["reason"]
    assert "the CUDA context is broken after this test (it raised RuntimeError: CUDA error" in poisoning
    skip = tests["test_later_gpu_test"]["reason"]
    assert "poisoned by test_inner.py::test_raises_cuda_words[mentions-cuda-errors]" in skip
    assert "then torch.cuda.synchronize() raised (stand-in)" in skip
    record_property("caught_by", ["robustness: the CUDA probe, not the words"])


# -- 5. no taint between tests ------------------------------------------------------------------
@hostile("LeavesStateBehind")
def test_state_a_test_leaves_changed_fails_it_and_is_put_back(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, """
        import gc, os
        import pytest
        import torch
        from hypothesis import given, strategies as st
        from harness.protocol import PolicyConfig
        from tests.hostile_runtimes import TAINTS

        CWD, ENVIRON = os.getcwd(), dict(os.environ)

        @pytest.mark.parametrize("pick", TAINTS)
        def test_taints(runtime, pick):
            runtime.wrapped.pick = pick
            runtime.capture_sizes(PolicyConfig())

        def test_the_next_test_sees_a_clean_process():
            assert torch.get_default_dtype() == torch.float32 and str(torch.get_default_device()) == "cpu"
            assert torch.is_grad_enabled() and not torch.are_deterministic_algorithms_enabled()
            assert not torch.backends.cuda.matmul.allow_tf32 and gc.isenabled()
            assert os.getcwd() == CWD and "HOSTILE_RUNTIME_WAS_HERE" not in os.environ
            from torch.overrides import _get_current_function_mode_stack
            assert not _get_current_function_mode_stack()

        @given(st.integers())
        def test_hypothesis_reseeding_is_not_taint(runtime, x):
            pass

        def test_what_fixtures_undo_is_not_taint(runtime, monkeypatch, tmp_path):
            monkeypatch.setenv("SET_BY_MONKEYPATCH", "1")
            monkeypatch.chdir(tmp_path)

        def test_an_engine_cached_for_later_tests_is_not_taint(engines):
            engines.get(mode="NONE", capture=False)

        def test_own_generator_is_not_taint(runtime):
            torch.randn(3, generator=torch.Generator().manual_seed(0))
    """)
    assert outcomes(tests) == {"test_taints": "error", "test_the_next_test_sees_a_clean_process": "passed",
                               "test_hypothesis_reseeding_is_not_taint": "passed",
                               "test_what_fixtures_undo_is_not_taint": "passed",
                               "test_an_engine_cached_for_later_tests_is_not_taint": "passed",
                               "test_own_generator_is_not_taint": "passed"}
    taints = [entry for entry in data["tests"] if "::test_taints[" in entry["nodeid"]]
    assert len(taints) == len(hostile_runtimes.TAINTS)
    for entry in taints:
        assert entry["outcome"] == "error", entry
        assert "would taint the tests after it" in entry["reason"], entry
        assert "(put back for the tests after it)" in entry["reason"], entry
    reasons = "\n".join(entry["reason"] for entry in taints)
    for what in ("torch default dtype: torch.float32 -> torch.float64", "torch default device: 'cpu' -> 'meta'",
                 "torch grad mode", "torch deterministic algorithms", "torch.backends.cuda.matmul.allow_tf32",
                 "torch global CPU RNG", "torch function modes: [] -> [TorchFunctionMode]", "working directory",
                 "os.environ: added HOSTILE_RUNTIME_WAS_HERE='1'", "garbage collector enabled: True -> False"):
        assert what in reasons, what
    record_property("caught_by", ["isolation: taint reported and put back"])


def test_a_leak_is_seen_though_the_harness_frees_cached_engines_in_the_same_teardown(pytester):
    """The H200 bug: the last test's teardown finalises the engine factory, and the cached engine's
    memory, freed there, hid a leak of the same size. Here with a stand-in CUDA allocator (a weak
    set of CPU tensors) so that it runs without a GPU; in this process, which gets back what the
    session's conftest replaced."""
    with putting_back([*STAND_IN_REPLACES, (hostile_runtimes, "_taints"), (hostile_runtimes.Engine, "__init__")]):
        result, tests, data = run(pytester, "LeavesStateBehind", LEAKS_LAST, conftest=STAND_IN_ALLOCATOR)
    assert outcomes(tests) == {"test_an_engine_cached_for_later_tests_is_not_taint": "passed",
                               "test_leaks_last": "error"}
    assert "CUDA memory allocated: 64.0 MiB more than before the test" in tests["test_leaks_last"]["reason"]


LEAKS_LAST = """
        import pytest
        from harness.protocol import PolicyConfig

        def test_an_engine_cached_for_later_tests_is_not_taint(engines):
            engines.get(mode="NONE", capture=False)

        def test_leaks_last(runtime):
            runtime.wrapped.pick = "cuda-memory"
            runtime.capture_sizes(PolicyConfig())
"""
STAND_IN_ALLOCATOR = """
        import weakref
        import torch
        import harness.reliability.robustness
        import tests.hostile_runtimes as hostile

        live = weakref.WeakSet()  # the stand-in allocator: what is allocated is what is alive
        torch.cuda.is_initialized = lambda: True
        torch.cuda.is_available = lambda: False  # no device behind it, on a GPU machine too (the report header asks)
        torch.cuda.device_count = lambda: 1
        torch.cuda.memory_allocated = lambda device=None: sum(t.numel() for t in live)
        torch.cuda.get_rng_state_all = lambda: []
        torch.cuda.empty_cache = lambda: None
        harness.reliability.robustness.cuda_probe = lambda: None

        def allocate(keep=None):
            tensor = torch.empty(64 << 20, dtype=torch.uint8)
            live.add(tensor)
            return tensor

        leaked = []
        taints = hostile._taints
        hostile._taints = lambda: {**taints(), "cuda-memory": lambda: leaked.append(allocate())}
        build = hostile.Engine.__init__

        def engine_with_kv_cache(self, runtime, config):
            build(self, runtime, config)
            self.kv_cache, self.me = allocate(), self  # a reference cycle: only the garbage collector frees it
        hostile.Engine.__init__ = engine_with_kv_cache
"""


# -- floods -------------------------------------------------------------------------------------
@hostile("FloodsOutput")
def test_a_flood_of_output_is_bounded(pytester, hostile, record_property):
    result, tests, _ = run(pytester, hostile, """
        from harness.protocol import PolicyConfig

        def test_floods_and_fails(runtime):
            runtime.capture_sizes(PolicyConfig())
        def test_floods_and_passes(runtime):
            runtime.padded_size(PolicyConfig(), 1)
    """)
    assert outcomes(tests) == {"test_floods_and_fails": "failed", "test_floods_and_passes": "passed"}
    assert len(result.stdout.str()) < 200_000  # the ten megabytes printed, cut to their ends
    result.stdout.fnmatch_lines(["*Captured stdout call*", "flood flood*characters cut*"])
    record_property("caught_by", ["robustness: bounded report sections"])


# -- on a GPU (the lead runs these on an H200; each inner run is a subprocess: a sticky error ends a
# process's CUDA context, and the watchdog ends the process) ------------------------------------
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda_only
def test_an_illegal_memory_access_poisons_later_gpu_tests_by_evidence(pytester):
    tests_source = CUDA_TESTS.replace("test_raises_cuda_words", "test_illegal")
    result, tests, _ = run(pytester, "BreaksTheCudaContext", tests_source, "-p", "no:xdist", subprocess=True)
    assert outcomes(tests) == {"test_illegal": "failed", "test_later_gpu_test": "skipped", "test_policy_only": "passed"}
    assert "illegal memory access" in tests["test_illegal"]["reason"]
    assert "the CUDA context is broken after this test" in tests["test_illegal"]["reason"]
    skip = tests["test_later_gpu_test"]["reason"]
    assert "poisoned by test_inner.py::test_illegal" in skip and "a one-element kernel" in skip


@cuda_only
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_hang_in_cuda_synchronize_is_ended_by_the_watchdog(pytester, workers):
    result, tests, data = run(pytester, "HangsInCudaSynchronize", """
        from harness.protocol import Request

        def test_spins(engines):
            engines.get(mode="NONE", capture=False).step([Request(engines.new_id(), (5,), 0)])
        def test_policy_only(runtime):
            pass
    """, "--test-timeout", "5", *(workers or ["-p", "no:xdist"]), subprocess=True, supervised=not workers)
    assert result.ret == 1
    assert tests["test_spins"]["outcome"] == "failed"
    reason = tests["test_spins"]["reason"]
    assert "timed out: call still running" in reason and ("crashed while running" in reason) is bool(workers)
    assert data["complete"] is bool(workers)  # under xdist the controller finishes the run
    # A plain run's supervisor lists the test the ended process never ran; a new xdist worker runs it.
    assert tests["test_policy_only"]["outcome"] == ("passed" if workers else "not run")


@cuda_only
def test_cuda_state_a_test_leaves_changed_fails_it(pytester):
    result, tests, data = run(pytester, "LeavesStateBehind", """
        import pytest
        from harness.protocol import PolicyConfig
        from tests.hostile_runtimes import CUDA_TAINTS

        @pytest.mark.parametrize("pick", CUDA_TAINTS)
        def test_taints(runtime, pick):
            runtime.wrapped.pick = pick
            runtime.capture_sizes(PolicyConfig())

        def test_an_engine_cached_for_later_tests_is_not_taint(engines):
            engines.get(mode="NONE", capture=False)
    """, "-p", "no:xdist", subprocess=True, conftest="""
        import torch

        def pytest_configure(config):
            torch.cuda.init()  # the state before the first test includes CUDA's
    """)
    picked = {entry["nodeid"]: entry for entry in data["tests"] if "::test_taints[" in entry["nodeid"]}
    assert all(entry["outcome"] in ("failed", "error") for entry in picked.values()), {
        nodeid: entry["outcome"] for nodeid, entry in picked.items()}
    reasons = "\n".join(entry.get("reason", "") for entry in picked.values())
    assert "torch CUDA RNG" in reasons and "MiB more than before the test" in reasons
    assert tests["test_an_engine_cached_for_later_tests_is_not_taint"]["outcome"] == "passed"


def test_the_engine_factory_closes_in_a_broken_cuda_context(monkeypatch):
    """Found on the H200: after an illegal memory access, the factory's teardown (empty_cache) raised
    again and turned a later policy-only test into an error. The test that broke the context says so;
    closing frees what it can and raises nothing."""
    import torch

    from harness.runtime.factory import EngineFactory
    from reference_runtime.adapter import ReferenceRuntime

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", broken)
    factory = EngineFactory(ReferenceRuntime(), "emulated")
    factory.get(mode="NONE", capture=False)
    factory.close()
    assert not factory._engines
