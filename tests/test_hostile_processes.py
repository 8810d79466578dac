"""Nothing a runtime starts outlives the run, a process that dies is reported, a hang is noticed once.

Real pytest sessions against the hostile runtimes of tests/hostile_runtimes.py (sections 6 to 9),
through `run` from tests/test_hostile_runtimes.py: leftover processes ended by pid, a death by a
signal or by os._exit reported with and without xdist, hangs skipped after two in a row, answers of
the wrong kind failed at the protocol boundary, and command-line tools quiet on a closed pipe.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from harness.reliability import pipes, processes
from tests import hostile_runtimes
from tests.test_hostile_runtimes import ROOT, hostile, importable_from_anywhere, linux_only, outcomes, run  # noqa: F401 (fixtures)

pytestmark = linux_only  # processes are read through /proc; the deaths are POSIX signals


def sleepers() -> list[str]:
    """`sleep 120` processes still running below this process (an inner run's leftovers come back here)."""
    return [p.command() for p in processes.descendants().values() if " ".join(p.argv()).endswith("sleep 120")]


# -- 6. processes left running -------------------------------------------------------------------
LEAVES = """
    from harness.protocol import PolicyConfig

    def test_starts_a_daemon(runtime):
        runtime.capture_sizes(PolicyConfig())
    def test_starts_a_child(engines):
        engines.get(mode="NONE", capture=False, fresh=True)
    def test_clean(runtime):
        pass
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1", "-k", "not child"]], ids=["in-process", "xdist"])
@hostile("LeavesProcessesRunning")
def test_processes_a_test_leaves_running_fail_it_and_are_ended(pytester, hostile, workers, record_property):
    """Under xdist, the policy-only tests: a worker that builds engines imports torch (seconds)."""
    result, tests, _ = run(pytester, hostile, LEAVES, *workers, subprocess=bool(workers))
    expected = {"test_starts_a_daemon": "error", "test_starts_a_child": "error", "test_clean": "passed"}
    assert outcomes(tests) == {name: outcome for name, outcome in expected.items() if name in tests}
    assert len(tests) == (2 if workers else 3)
    for name in {"test_starts_a_daemon", "test_starts_a_child"} & tests.keys():
        reason = tests[name]["reason"]
        assert "the test left 1 process(es) running, which would outlive it" in reason, reason
        assert "'sleep 120', ended by SIGTERM" in reason and "helper_processes()" in reason, reason
    assert sleepers() == []
    record_property("caught_by", ["processes: leftovers named, ended by pid (daemons too: a subreaper)"])


@hostile("KeepsAWorkerPool")
def test_a_declared_helper_lives_until_the_session_ends(pytester, hostile, record_property):
    result, tests, _ = run(pytester, hostile, """
        def test_starts_the_pool(engines):
            engines.get(mode="NONE", capture=False, fresh=True)
        def test_the_pool_is_still_there(engines):
            engines.get(mode="NONE", capture=False, fresh=True)
        def test_declares_a_process_it_did_not_start(runtime, engines):
            runtime.wrapped.pick, runtime.wrapped.pool = "lies", None
            engines.get(mode="NONE", capture=False, fresh=True)
    """)
    assert outcomes(tests) == {"test_starts_the_pool": "passed", "test_the_pool_is_still_there": "passed",
                               "test_declares_a_process_it_did_not_start": "error"}
    reason = tests["test_declares_a_process_it_did_not_start"]["reason"]
    assert "helper_processes() named pid(s) [1], which this run did not start" in reason
    assert "the test left 2 process(es) running" in reason  # the new pool it did not declare truly
    result.stdout.fnmatch_lines(["*ended 2 process(es) left running when the session ended*sh -c sleep 120 & wait' "
                                 "(a helper the runtime declared), ended by SIGTERM*"])
    assert sleepers() == []
    record_property("caught_by", ["processes: declared helpers kept, ended with the session; a false "
                                  "declaration fails"])


# -- 7. a process that dies ------------------------------------------------------------------------
DIES = """
    from harness.protocol import PolicyConfig

    def test_before(runtime):
        pass
    def test_dies(runtime):
        runtime.wrapped.pick = {pick!r}
        runtime.capture_sizes(PolicyConfig())
    def test_after_1(runtime):
        pass
    def test_after_2(runtime):
        pass
"""
ENDINGS = {"SIGSEGV": "was killed by SIGSEGV (signal 11)", "SIGABRT": "was killed by SIGABRT (signal 6)",
           "SIGKILL": "was killed by SIGKILL (signal 9)", "os._exit(0)": "exited with code 0"}


@pytest.mark.parametrize("hostile, pick", [("DiesBySignal", pick) for pick in hostile_runtimes.DEATHS],
                         ids=[f"DiesBySignal-{pick}" for pick in hostile_runtimes.DEATHS])
def test_a_process_that_dies_is_reported_and_fails_the_run(pytester, hostile, pick, record_property):
    """A plain run: the supervisor (the pytest process, whose child ran the session) reports it."""
    result, tests, data = run(pytester, hostile, DIES.format(pick=pick), supervised=True)
    assert result.ret == 1
    assert outcomes(tests) == {"test_before": "passed", "test_dies": "failed", "test_after_1": "not run",
                               "test_after_2": "not run"}
    assert data["complete"] is False and data["summary"] == {"passed": 1, "failed": 1, "not run": 2}
    reason = tests["test_dies"]["reason"]
    assert f"the process running the tests {ENDINGS[pick]}" in reason and "into call" in reason, reason
    assert f"last lines it wrote to stdout:\n    about to die by {pick}" in reason, reason
    assert "last lines it wrote to stderr:\n    the runtime's last words" in reason, reason
    assert "during test_inner.py::test_dies[dies-by-signal]" in tests["test_after_1"]["reason"]
    result.stdout.fnmatch_lines(["*cudagraph-conformance: the test process ended*",
                                 f"test_inner.py::test_dies[[]dies-by-signal[]] (call) was running when *{ENDINGS[pick]}*",
                                 "2 test(s) were not run*", "*conformance report: out/conformance-dies-by-signal.json*"])
    assert "the runtime's last words" not in result.stdout.str().split("the test process ended")[1].split(
        "last lines")[0]  # said once, in its place
    record_property("caught_by", ["supervisor: the test, the signal or exit code, the last lines; the rest not run"])


@hostile("DiesBySignal")
def test_a_worker_that_dies_is_reported_and_replaced(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, """
        import pytest
        from harness.protocol import PolicyConfig

        @pytest.mark.parametrize("pick", ["SIGSEGV", "os._exit(0)"])
        def test_dies(runtime, pick):
            runtime.wrapped.pick = pick
            runtime.capture_sizes(PolicyConfig())
        def test_after(runtime):
            pass
    """, "-n", "1", subprocess=True)
    assert result.ret == 1
    assert {entry["nodeid"].split("::")[1]: entry["outcome"] for entry in data["tests"]} == {
        "test_dies[dies-by-signal-SIGSEGV]": "failed", "test_dies[dies-by-signal-os._exit(0)]": "failed",
        "test_after[dies-by-signal]": "passed"}
    assert data["complete"] is True
    reasons = {entry["nodeid"]: entry["reason"] for entry in data["tests"] if entry["outcome"] == "failed"}
    segv, exit0 = (reasons[f"test_inner.py::test_dies[dies-by-signal-{pick}]"] for pick in ("SIGSEGV", "os._exit(0)"))
    assert "crashed while running" in segv and "the worker process was killed by SIGSEGV (signal 11) during call" in segv
    assert "the worker process exited with code 0 during call" in exit0 and "os._exit()" in exit0
    for pick, reason in (("SIGSEGV", segv), ("os._exit(0)", exit0)):
        assert f"last lines it wrote to stdout:\n    about to die by {pick}" in reason, reason
    record_property("caught_by", ["workers: the controller peeks at the exit status, reads the last lines"])


def test_tests_xdist_does_not_run_after_a_crash_are_reported_as_not_run(pytester):
    result, tests, data = run(pytester, "DiesBySignal", DIES.format(pick="SIGSEGV"), "-n", "1",
                              "--max-worker-restart", "0", subprocess=True)
    assert outcomes(tests) == {"test_before": "passed", "test_dies": "failed", "test_after_1": "not run",
                               "test_after_2": "not run"}
    assert "after 1 worker(s) crashed (the last while running test_inner.py::test_dies" in \
        tests["test_after_1"]["reason"]


# -- 8. hangs: noticed once -------------------------------------------------------------------------
HANGS = """
    import pytest
    from harness.protocol import PolicyConfig, Request

    @pytest.mark.parametrize("i", range(4))
    def test_step(engines, i):
        engines.get(mode="NONE", capture=False).step([Request(engines.new_id(), (5,), 0)])
    def test_policy(runtime):
        runtime.capture_sizes(PolicyConfig())
"""


@hostile("HangsInEveryStep")
def test_a_runtime_that_hangs_in_every_step_is_noticed_once(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, HANGS, "--test-timeout", "1")
    steps = {entry["nodeid"].split("[")[1]: entry for entry in data["tests"] if "::test_step[" in entry["nodeid"]}
    assert [steps[f"hangs-in-every-step-{i}]"]["outcome"] for i in range(4)] == ["failed", "failed", "skipped",
                                                                                  "skipped"]
    assert tests["test_policy"]["outcome"] == "passed"  # a policy answer does not step: it still runs
    skip = steps["hangs-in-every-step-3]"]["reason"]
    assert "hung in 2 tests that build engines in a row, each past --test-timeout=1 s" in skip
    assert "test_step[hangs-in-every-step-0] (call; SIGALRM failed it)" in skip
    assert data["seconds"] < 2 * 1 + 10  # two timeouts, not four
    record_property("caught_by", ["hangs: two in a row skip the rest of that kind"])


def test_a_runtime_that_hangs_once_recovers(pytester):
    _, _, data = run(pytester, "HangsOnce", HANGS, "--test-timeout", "1")
    assert [entry["outcome"] for entry in data["tests"]] == ["passed", "failed", "passed", "passed", "passed"]


NATIVE_HANGS = """
    import pytest
    from harness.protocol import PolicyConfig

    @pytest.mark.parametrize("i", range(3))
    def test_hangs(runtime, i):
        runtime.capture_sizes(PolicyConfig())
"""


@hostile("HangsInNativeCode")
def test_native_hangs_end_workers_and_two_in_a_row_skip_the_rest(pytester, hostile, record_property):
    """Each native hang ends its worker (the watchdog); the controller counts them and hands the
    count to the next worker, which skips the third instead of waiting out its timeout."""
    result, tests, data = run(pytester, hostile, NATIVE_HANGS, "--test-timeout", "0.5", "-n", "1", subprocess=True)
    hung = [entry for entry in data["tests"] if entry["outcome"] == "failed"]
    skipped = [entry for entry in data["tests"] if entry["outcome"] == "skipped"]
    assert len(hung) == 2 and len(skipped) == 1, data["tests"]  # in whichever order xdist handed them out
    assert all("the watchdog dumped every thread's stack" in entry["reason"] for entry in hung)
    assert "hung in 2 policy-only tests in a row" in skipped[0]["reason"]
    assert all(f"{entry['nodeid']} (call; the watchdog ended the process)" in skipped[0]["reason"] for entry in hung)
    record_property("caught_by", ["hangs: counted across xdist workers"])


# -- 9. answers of the wrong kind ------------------------------------------------------------------
@hostile("ReturnsWrongKinds")
def test_answers_of_the_wrong_kind_fail_first_at_the_boundary(pytester, hostile, record_property):
    result, tests, data = run(pytester, hostile, """
        import pytest
        from harness.protocol import Request
        from harness.runtime.factory import EngineFactory

        def requests(engines):
            return [Request(engines.new_id(), (5,), 0)]

        @pytest.mark.parametrize("pick", ["bfloat16-steps", "nan-logits"])
        def test_steps(runtime, engines, pick):
            runtime.wrapped.pick = pick
            engine = engines.get(mode="NONE", capture=False, fresh=True)
            engine.eager_step(requests(engines), 1)
            engine.step(requests(engines))

        def test_kv_snapshots(runtime, engines):
            runtime.wrapped.pick = "kv-changes-shape"
            engine = engines.get(mode="NONE", capture=False, fresh=True)
            engine.kv_snapshot(), engine.kv_snapshot()

        def test_step_inputs(runtime, engines):
            runtime.wrapped.pick = "float-step-inputs"
            engine = engines.get(mode="NONE", capture=False, fresh=True)
            engine.step(requests(engines))
            engine.last_step_inputs()

        def test_one_engine_answers_in_one_kind(runtime, check):
            runtime.wrapped.pick = "bfloat16-steps"
            factory = EngineFactory(runtime, "emulated", dtype="bfloat16")  # float32 eager steps: an upcast
            factory.bind(check)
            engine = factory.get(mode="NONE", capture=False)
            engine.eager_step(requests(factory), 1)
            engine.step(requests(factory))
    """)
    assert data["summary"] == {"failed": 5}
    first = {entry["nodeid"].split("::")[1]: entry["reason"].splitlines()[0] for entry in data["tests"]}
    assert first["test_steps[returns-wrong-kinds-bfloat16-steps]"].startswith(
        "[test_inner] runtime 'returns-wrong-kinds': the engine's step() returned logits of dtype torch.bfloat16; "
        "expected torch.float32 (the engine was built with EngineConfig.dtype='float32')")
    assert "the engine's step() returned NaN in the logits of 1 of 1 real rows (first: row 0)" in \
        first["test_steps[returns-wrong-kinds-nan-logits]"]
    assert "the engine's kv_snapshot() returned shape (8, 4), torch.float32 on cpu; its previous snapshot was " \
           "(16, 4)" in first["test_kv_snapshots[returns-wrong-kinds]"]
    assert "the engine's last_step_inputs() returned token_ids of dtype torch.float32; expected an integer" in \
        first["test_step_inputs[returns-wrong-kinds]"]
    assert "the engine's step() returned logits of dtype torch.bfloat16 on cpu, and its eager_step() returned " \
           "torch.float32 on cpu" in first["test_one_engine_answers_in_one_kind[returns-wrong-kinds]"]
    # A report written by a real run, rendered with its reader gone: quiet, as a Unix tool
    assert closed_pipe([sys.executable, "-m", "harness.reports.render", "out/conformance-returns-wrong-kinds.json",
                        "--out", "rendered"], cwd=pytester.path) in (0, pipes.EXIT_STATUS)
    record_property("caught_by", ["validate: kinds at the protocol boundary (dtype, device, NaN, one kind an engine)"])


# -- command-line tools and a closed pipe ----------------------------------------------------------
def closed_pipe(command: list[str], cwd=ROOT) -> int:
    """Run `command` with its stdout's reader gone before it writes: its exit status; no traceback."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    errors = process.stderr.read().decode()
    status = process.wait(timeout=120)
    assert errors == "", errors
    return status


def test_the_calculator_ends_quietly_when_its_reader_goes_away():
    assert closed_pipe([sys.executable, "-m", "reference_runtime", "pad", "--batch", "1-500", "--json"]) == 141
    lines = subprocess.run(f"{shlex.quote(sys.executable)} -m reference_runtime pad --batch 1-500 | head -2",
                           shell=True, capture_output=True, text=True, cwd=ROOT)
    assert lines.stdout.splitlines() == ["cap 512, 51 sizes", "batch 1 -> 1, waste 0 tokens (0.00%)"]
    assert lines.stderr == ""


def test_a_tool_that_meets_a_closed_pipe_exits_141_without_a_traceback():
    program = "from harness.reliability import pipes; raise SystemExit(pipes.run(lambda: print('x' * 100000)))"
    assert closed_pipe([sys.executable, "-c", program]) == pipes.EXIT_STATUS
    assert json.loads(subprocess.run([sys.executable, "-c", program.replace("'x' * 100000", "'[1]'")], cwd=ROOT,
                                     capture_output=True, text=True).stdout) == [1]


# -- ending processes by pid, safely ---------------------------------------------------------------
def test_a_process_that_ignores_sigterm_is_killed():
    child = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 120 & wait"])
    try:
        deadline = time.monotonic() + 5
        while not sleepers() and time.monotonic() < deadline:  # its trap is set once its sleep has started
            time.sleep(0.02)
        mine = [p for p in processes.descendants().values() if p.pid == child.pid]
        assert processes.end(mine, grace=0.2) == {mine[0].key: "ended by SIGKILL (it outlived SIGTERM)"}
    finally:
        child.kill()
        child.wait()
        processes.end(list(processes.descendants().values()), grace=0.1)


def test_a_long_command_line_is_matched_whole_and_shown_by_its_two_ends():
    """What names a program can sit past the middle of a long command line (an interpreter deep in a
    virtual environment, then its -c program): argv() has every word to match on; command(), for
    messages, keeps the two ends and says how much it cut."""
    padding = "x" * 200
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", padding, "in-the-middle", padding])
    try:
        (found,) = [p for p in processes.descendants().values() if p.pid == child.pid]
        deadline = time.monotonic() + 5
        while found.argv()[-1:] != [padding] and time.monotonic() < deadline:  # between fork and exec
            time.sleep(0.02)
        assert found.argv()[-3:] == [padding, "in-the-middle", padding]
        assert "in-the-middle" not in found.command() and "characters cut" in found.command()
    finally:
        child.kill()
        child.wait()


def test_the_walk_down_the_childrens_files_finds_what_the_scan_of_every_process_finds(monkeypatch):
    """descendants() reads the threads' children files where the kernel has them, else every process's
    stat: both find the same tree, a grandchild and a zombie (zombies=True) included."""
    child = subprocess.Popen(["sh", "-c", "sleep 120 & sleep 120 & wait"])
    exited = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while len(sleepers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        while processes.read(exited.pid).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        found = {}
        for children_files in (True, False):  # the tree under the child, and this process's zombie
            monkeypatch.setattr(processes, "CHILDREN_FILES", children_files)
            live = processes.descendants().values()  # other tests' processes may come and go around these
            found[children_files] = ({p.pid for p in live if child.pid in (p.pid, p.ppid)},
                                     exited.pid in {p.pid for p in live},
                                     exited.pid in {p.pid for p in processes.descendants(zombies=True).values()})
        assert found[True] == found[False]
        tree, zombie_live, zombie_kept = found[True]
        assert len(tree) == 3 and len(sleepers()) == 2  # the child's shell and its two sleeps, grandchildren here
        assert not zombie_live and zombie_kept
    finally:
        child.kill()
        child.wait()
        exited.wait()
        processes.end(list(processes.descendants().values()), grace=0.1)


def test_a_record_whose_pid_names_another_process_now_is_never_signalled():
    """A pid reused by another process (here: this one, with another start time) is left alone."""
    me = processes.read(os.getpid())
    stale = processes.Process(me.pid, me.ppid, me.start + 1, "S")
    assert processes.end([stale]) == {stale.key: "had already exited"}
    assert processes.alive(me)


def test_a_process_on_its_way_out_at_the_session_end_is_not_a_leak(pytester):
    """An orphan that ends by itself within a moment (an xdist worker whose controller ended, as a
    nested session leaves one) is let end: a run that leaks nothing says nothing about leaks."""
    pytester.makepyfile("""
        import subprocess
        def test_leaves_an_orphan_that_ends_itself():
            subprocess.run(["sh", "-c", "sleep 1 &"], check=True)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "left running" not in result.stdout.str(), result.stdout.str()
