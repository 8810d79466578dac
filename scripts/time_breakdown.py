"""Where the time of a test run goes, the same way every time.

    python scripts/time_breakdown.py                           # the README's test command (-n 2)
    python scripts/time_breakdown.py suites/ --runtime reference -n 2
    python scripts/time_breakdown.py --profile suites/         # one serial run under cProfile
    python scripts/time_breakdown.py --profile suites/test_step_latency.py suites/test_serving.py \
        --graph-backend cuda --benchmark-only                   # the benchmark lane, on a GPU

Without --profile: the run's wall time, the summed time of its tests (with N workers the wall
time is about that over N, plus start-up and collection), the time per file and the slowest tests,
from pytest's --durations. With --profile the run is serial and ~1.5x slower: seconds spent in each
named cost below. The costs nest (captures are part of engine builds, and both happen inside the
in-process sessions of the self-tests), so they do not add up; subprocesses are timed as a whole.
Pass CI=true in the environment to time CI's hypothesis profile (100 examples instead of 30).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)")
OUTCOME = re.compile(r"\d+ (passed|failed|errors?|skipped)\b.* in \d")

# name -> (file suffix, function name): the entry point whose cumulative time is that cost
COSTS = {
    "imports": ("<frozen importlib._bootstrap>", "_find_and_load"),
    "collection (includes the imports of test modules)": ("_pytest/main.py", "perform_collect"),
    "engines from the factory (builds, with their captures)": ("harness/runtime/observe.py", "_get"),
    "graph captures, wherever they happen (GraphBackend.capture)": ("harness/graphs/base.py", "capture"),
    "graph replays": ("harness/graphs/base.py", "replay"),
    "hypothesis examples": ("hypothesis/core.py", "execute_once"),
    "in-process pytest sessions (pytester)": ("_pytest/pytester.py", "inline_run"),
    "subprocess pytest sessions (pytester)": ("_pytest/pytester.py", "runpytest_subprocess"),
    "other subprocesses (subprocess.run)": ("subprocess.py", "run"),
    "data-parallel rank pools (waiting on ranks)": ("harness/scenarios/ranks.py", "_gather"),
    "report writing": ("harness/reports/report.py", "write"),
    # The benchmark lane's own (GPU): its profiles, and one-time work of a machine's first run.
    "CUDA profiles (launch counts)": ("harness/graphs/counting.py", "_count_cuda"),
    "CUDA profiles (kernel floors)": ("harness/graphs/counting.py", "kernel_times_us"),
    "host reference loops (harness.reports.timing)": ("harness/reports/timing.py", "host_reference_ms"),
    "preset checkpoints (written once a machine)": ("harness/expectations/presets.py", "checkpoint"),
    "matplotlib's font cache (built once a machine)": ("matplotlib/font_manager.py", "_load_fontmanager"),
    "garbage collection": ("~", "<built-in method gc.collect>"),
}


def outcome(stdout: str) -> str:
    """pytest's last line: what passed, failed and skipped, and in how long."""
    return next((line.strip("= ") for line in reversed(stdout.splitlines()) if OUTCOME.search(line)), "(no summary line)")


def durations(args: list[str]) -> None:
    command = [sys.executable, "-m", "pytest", *args, "-q", "-rfE", "-p", "no:cacheprovider", "--durations=0",
               "--durations-min=0"]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    per_file, tests = defaultdict(float), defaultdict(float)
    for line in result.stdout.splitlines():
        if match := DURATION.match(line):
            seconds, nodeid = float(match[1]), match[3]
            per_file[nodeid.split("::")[0]] += seconds
            tests[nodeid] += seconds
    print(f"$ {' '.join(command[2:])}\n{outcome(result.stdout)}")
    for line in result.stdout.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"  {line}")
    if not tests:
        print(result.stdout[-3000:] + result.stderr[-3000:])
        sys.exit(f"no test durations in the output (pytest exit {result.returncode})")
    total = sum(tests.values())
    print(f"wall {wall:.1f} s; summed test time {total:.1f} s (setup + call + teardown of {len(tests)} tests)\n")
    print("per file:")
    for name, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:15]:
        print(f"  {seconds:7.1f} s {100 * seconds / total:5.1f}%  {name}")
    print("\nslowest tests:")
    for nodeid, seconds in sorted(tests.items(), key=lambda item: -item[1])[:15]:
        print(f"  {seconds:7.1f} s  {nodeid}")
    sys.exit(result.returncode)


def profile(args: list[str]) -> None:
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.prof"
        command = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "pytest", *args, "-q", "-p", "no:xdist",
                   "-p", "no:cacheprovider"]
        start = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        if not out.exists():
            print(result.stdout[-3000:] + result.stderr[-3000:])
            sys.exit(f"the profiled run left no profile (pytest exit {result.returncode})")
        stats = pstats.Stats(str(out)).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    print(f"$ pytest {' '.join(args)} (serial, under cProfile)\n{outcome(result.stdout)}\nwall {wall:.1f} s\n")
    for name, (suffix, wanted) in COSTS.items():
        seconds, calls = 0.0, 0
        for (filename, _, function), (_, primitive, _, cumulative, _) in stats.items():
            if filename.endswith(suffix) and function == wanted:
                seconds, calls = seconds + cumulative, calls + primitive
        print(f"  {seconds:7.1f} s {100 * seconds / wall:5.1f}%  {name} ({calls} calls)")
    sys.exit(result.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true", help="one serial run under cProfile, costs by name")
    known, pytest_args = parser.parse_known_args()
    if known.profile:
        if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in pytest_args):
            parser.error("--profile runs serially, in one process: leave out -n")
        profile(pytest_args)
    else:
        durations(pytest_args or ["-n", "2"])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from harness.reliability import pipes

    sys.exit(pipes.run(main))  # quiet when the reader closes the pipe
