"""The data-parallel execution suite catches every broken data-parallel runtime
(tests/broken_dp_runtimes.py), names the step and every rank's batch, and bounds a hang.

Each mutant runs the scripted sequence in an in-process pytest session of its own (the rank
processes of harness.runtime.ranks are shared across sessions, so only its engines are built).
The reference passing the suite is checked by the run of `suites/` itself.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.reliability import processes
from harness.runtime import ranks as distributed
from harness.runtime.factory import EngineFactory
from harness.protocol import Request
from tests import broken_dp_runtimes, catching

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "suites" / "test_data_parallel_execution.py"
HANG_TIMEOUT_S = 1.5  # the step timeout in these runs (a step takes milliseconds): what a hang costs

# mutant -> (the scripted step it first fails at, words its failure message must hold)
MUST_CATCH = {
    "PadsToLocalSize": (0, "pads to the largest size"),
    "StaleTablesOnRankOne": (0, "rank 1's step vs its own eager step"),
    "KeepsOwnMode": (2, "every rank must run PIECEWISE"),
    # Under V2's rule a mixed rank makes every rank non-uniform, so the highest mode cannot be
    # replayed at step 2; it shows when a rank is above the largest size and all must run eager.
    "MaxModeConsensus": (4, "agreed on eager"),
    "PadsUnderEager": (4, "no padding across ranks under NONE"),
    "IdleSkipsTheForward": (3, "must launch 1 graph"),
    "DummyWritesKV": (3, "an idle rank's dummy batch must write none"),
    "KeepsOwnModeNoPolicy": (2, "every rank must run the same mode as rank 0"),
    "PadsToLocalSizeNoPolicy": (0, "every rank pads to the same size as rank 0"),
}
HANGS = "IdleSkipsTheStep"  # the busy ranks wait for ever: its own test below


def run_suite(pytester, monkeypatch, mutant: str, select: str) -> dict:
    monkeypatch.setattr(distributed, "STEP_TIMEOUT_S", HANG_TIMEOUT_S)
    return catching.run_suites(pytester, f"tests.broken_dp_runtimes:{mutant}", [SUITE.name], "-k", select)


def test_every_mutant_has_an_expectation():
    assert {m.__name__ for m in broken_dp_runtimes.MUTANTS} == set(MUST_CATCH) | {HANGS}


@pytest.mark.parametrize("mutant", sorted(MUST_CATCH))
def test_the_suite_catches_the_mutant(pytester, monkeypatch, record_property, mutant):
    report = run_suite(pytester, monkeypatch, mutant, "scripted and FULL_AND_PIECEWISE")
    failed = [t for t in report["tests"] if t["outcome"] == "failed"]
    record_property("caught_by", ["test_data_parallel_execution.py"] if failed else [])
    doc = getattr(broken_dp_runtimes, mutant).__doc__.strip()
    assert failed, f"{mutant} ({doc}) escaped the data-parallel execution suite"
    step, words = MUST_CATCH[mutant]
    reason = failed[0]["reason"]
    assert f"step {step} of" in reason and words in reason, reason
    assert "rank 0:" in reason and "rank 1:" in reason, f"the failure does not name every rank's batch:\n{reason}"


@pytest.mark.parametrize("mutant", [HANGS])
def test_a_hang_costs_a_bounded_time_and_the_run_goes_on(pytester, monkeypatch, record_property, mutant):
    """Both scripted sequences hang at step 3 (an idle rank skips the all-reduce): the first kills
    its ranks, the second gets a fresh pool, runs steps 0-2 and hangs in turn. Each costs the step
    timeout (plus a pool start and an engine build for the second), and the JSON report is whole."""
    start = time.monotonic()
    report = run_suite(pytester, monkeypatch, mutant, "scripted")
    record_property("hang_run_seconds", round(time.monotonic() - start, 1))
    failed = [t for t in report["tests"] if t["outcome"] == "failed"]
    record_property("caught_by", ["test_data_parallel_execution.py"] if failed else [])
    assert report["complete"]
    assert len(failed) == 2, [(t["nodeid"], t["outcome"]) for t in report["tests"]]
    for test in failed:
        reason = test["reason"]
        assert f"did not finish within {HANG_TIMEOUT_S:g} s" in reason and "step 3 of" in reason, reason
        assert "rank 0: idle (no requests) -> answered" in reason and "rank 1: 3 requests" in reason, reason
        assert test["duration"] < HANG_TIMEOUT_S + 60, f"{test['nodeid']} took {test['duration']:.1f} s"


def test_ranks_that_raise_or_die_fail_the_step_and_the_next_call_starts_afresh(monkeypatch):
    monkeypatch.setattr(distributed, "STEP_TIMEOUT_S", HANG_TIMEOUT_S)
    runtime = broken_dp_runtimes.FailingRanks()
    config = EngineFactory(runtime, "emulated", max_num_seqs=4, max_num_batched_tokens=32).config(mode="PIECEWISE")
    outcomes = {}
    for length in (2, 3):  # every rank raises; then rank 1's process exits
        pool = distributed.pool(2, "emulated")
        built = pool.build(runtime, config)
        with pytest.raises(distributed.RankFailure) as failure:
            pool.step(built, 5, [[Request(1, tuple(range(1, length + 1)), 0)], [Request(2, (7,) * length, 0)]], False)
        assert not pool.alive and "step 5:" in failure.value.what
        outcomes[length] = failure.value.ranks
    assert all("raised: " in text and "ValueError: this engine cannot run two-token prompts" in text
               for text in outcomes[2].values())
    assert "the process died (exit code 7)" in outcomes[3]["rank 1"]
    assert all(text.startswith("1 requests (0 continuing), 3 tokens") for text in outcomes[3].values())


# A process that starts a rank pool and exits; it prints its fork server's pid.
STARTS_A_POOL = '''
import os
import sys

from harness.reliability import processes
from harness.runtime import ranks

if __name__ == "__main__":
    if sys.argv[1] == "slips":  # an exit built to slip past the check: the fork server left to end by itself
        processes.terminate = lambda started: None
    ranks.pool(2, "emulated")
    servers = [p for p in processes.descendants().values()  # the ranks are its children, with its command line
               if p.ppid == os.getpid() and "multiprocessing.forkserver" in " ".join(p.argv())]
    print(" ".join(str(p.pid) for p in servers))
'''


def fork_server_ending(tmp_path, variant: str) -> int:
    """How the fork server of a process that used a rank pool ended: its wait status, read here
    (a subreaper, which the orphaned fork server comes back to once that process has exited)."""
    assert processes.become_subreaper()
    script = tmp_path / "starts_a_pool.py"
    script.write_text(STARTS_A_POOL)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), variant], capture_output=True, text=True, timeout=120,
                          env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    (server,) = map(int, done.stdout.split())
    _, status = os.waitpid(server, 0)
    return status


def test_a_process_that_used_a_rank_pool_ends_its_fork_server_as_it_exits(tmp_path):
    """The fork server imported torch: left to end by itself, its interpreter's teardown would outlast
    its parent, and the session's end waits for what its processes leave. Ended by SIGTERM at exit
    (harness.runtime.ranks.close_all); an exit that leaves it running shows as a normal exit."""
    ended = fork_server_ending(tmp_path, "ends")
    assert os.WIFSIGNALED(ended) and os.WTERMSIG(ended) == signal.SIGTERM, f"wait status {ended}"
    slipped = fork_server_ending(tmp_path, "slips")
    assert os.WIFEXITED(slipped), f"the variant that leaves the fork server running: wait status {slipped}"
