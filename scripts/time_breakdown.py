"""Where the time of a test run goes, the same way every time, in seconds and in loop-times.

    python scripts/time_breakdown.py                           # the README's test command (-n 2)
    python scripts/time_breakdown.py suites/ --runtime reference -n 2
    python scripts/time_breakdown.py --profile suites/         # one serial run under cProfile
    python scripts/time_breakdown.py --profile suites/test_step_latency.py suites/test_serving.py \
        --graph-backend cuda --benchmark-only                   # the benchmark lane, on a GPU
    python scripts/time_breakdown.py --targets [--runs 3] [--out reports/cpu/DATE]

A loop-time is how long this machine takes for a plain Python loop of 20 million additions
(`s = 0; for i in range(20_000_000): s += i`), timed just before and just after the run: a figure
in loop-times travels between machines, and between quiet and busy phases of a shared one, where
seconds do not. Every figure is printed in both.

Without --profile: the run's wall time, the summed time of its tests (with N workers the wall
time is about that over N, plus start-up and collection), the run split at its first test's start
and its last test's end (scripts/lib/session_phases.py), the time per file and the slowest tests,
from pytest's --durations. Then the CPU time of every process of the run (the workers, each
test's subprocesses, and the orphans: processes whose parent ended first, which this script
adopts as Linux's child subreaper and reaps), the least wall time it allows on this machine's
cores, and where it went: in the tests (each test's own process, and the processes it waited
for), per file and by test, and outside them (start-up, collection, the end, and processes a test
started that ended after it, as a rank pool's do at exit). On a machine whose cores are all busy
the CPU time is what a run costs; a test's wall time also holds what it waited for.

With --profile the run is serial and ~1.5x slower: seconds spent in each named cost below. The
costs nest (captures are part of engine builds, and both happen inside the in-process sessions of
the self-tests), so they do not add up; subprocesses are timed as a whole. Pass CI=true in the
environment to time CI's hypothesis profile (100 examples instead of 30).

--targets runs the README's two commands (every test under CI's profile, and the suites against
the reference runtime) --runs times each, and says whether each run met its target in loop-times
(TARGETS), with the CPU the run used and the least wall time that allows on the machine's cores.
With --out DIR it writes there what the README's figures are rendered from (scripts/figures.py):
each command's last log, the log of any run that failed (NAME-runN-failed.txt, not a .log: the
figures read only the last runs), the line of every run (targets.txt) and the machine (host.txt).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)")
OUTCOME = re.compile(r"\d+ (passed|failed|errors?|skipped)\b.* in \d")
LOOP_ADDITIONS = 20_000_000
ORPHAN_WAIT_S = 30.0  # how long a run's orphans get to end once it is over (nothing a run starts should outlive it)

# The README's two commands (log name, what it is, pytest arguments, environment, the most loop-times it may take).
TARGETS = (
    ("all-tests", "every test, CI's profile (`CI=true python -m pytest -n 2`)", ["-n", "2"], {"CI": "true"}, 27.0),
    ("first-command", "the suites against the reference runtime (`python -m pytest suites/ --runtime reference -n 2`)",
     ["suites/", "--runtime", "reference", "-n", "2"], {}, 4.5),
)

# name -> (file suffix, function name): the entry point whose cumulative time is that cost
COSTS = {
    "imports": ("<frozen importlib._bootstrap>", "_find_and_load"),
    "collection (includes the imports of test modules)": ("_pytest/main.py", "perform_collect"),
    "engines from the factory (builds, with their captures)": ("harness/runtime/factory.py", "_get"),
    "graph captures, wherever they happen (GraphBackend.capture)": ("harness/graphs/base.py", "capture"),
    "graph replays": ("harness/graphs/base.py", "replay"),
    "hypothesis examples": ("hypothesis/core.py", "execute_once"),
    "in-process pytest sessions (pytester)": ("_pytest/pytester.py", "inline_run"),
    "subprocess pytest sessions (pytester)": ("_pytest/pytester.py", "runpytest_subprocess"),
    "other subprocesses (subprocess.run)": ("subprocess.py", "run"),
    "data-parallel rank pools (waiting on ranks)": ("harness/runtime/ranks.py", "_gather"),
    "report writing": ("harness/reports/report.py", "write"),
    # The benchmark lane's own (GPU): its profiles, and one-time work of a machine's first run. On the H200
    # cProfile counted no call of the two profiles (reports/h200/probes/lane_split.py times them instead).
    "CUDA profiles (launch counts)": ("harness/graphs/counting.py", "_count_cuda"),
    "CUDA profiles (kernel floors)": ("harness/graphs/counting.py", "kernel_times_us"),
    "host reference loops (harness.reports.timing)": ("harness/reports/timing.py", "host_reference_ms"),
    "preset checkpoints (written once a machine)": ("harness/expectations/presets.py", "checkpoint"),
    "matplotlib's font cache (built once a machine)": ("matplotlib/font_manager.py", "_load_fontmanager"),
    "garbage collection": ("~", "<built-in method gc.collect>"),
}




def loop_seconds(additions: int = LOOP_ADDITIONS) -> float:
    """Seconds this machine takes for the yardstick loop, now: a loop of fewer additions is timed
    and scaled to 20 million (noisier; for a quick look). Written as at a prompt or under `python -c`:
    its names are globals, which a loop inside a function (local names) runs about twice as fast as."""
    loop = compile(f"s = 0\nfor i in range({additions}):\n    s += i\n", "<the yardstick loop>", "exec")
    start = time.perf_counter()
    exec(loop, {})
    return (time.perf_counter() - start) * LOOP_ADDITIONS / additions


class Yardstick:
    """The loop timed before and after a run; figures divided by their mean are in loop-times."""

    additions = LOOP_ADDITIONS  # --loop-additions

    def __init__(self):
        self.before = loop_seconds(self.additions)
        self.after: float | None = None

    def close(self) -> None:
        self.after = loop_seconds(self.additions)

    @property
    def seconds(self) -> float:
        return (self.before + (self.after or self.before)) / 2

    def times(self, seconds: float) -> float:
        return seconds / self.seconds

    def both(self, seconds: float) -> str:
        return f"{seconds:.1f} s ({self.times(seconds):.1f} loop-times)"

    def describe(self) -> str:
        scaled = "" if self.additions == LOOP_ADDITIONS else f" (scaled from {self.additions:,})"
        return (f"the loop of {LOOP_ADDITIONS:,} additions{scaled} took {self.before:.2f} s before the run and "
                f"{self.after:.2f} s after it: a loop-time is {self.seconds:.2f} s here")


def outcome(stdout: str) -> str:
    """pytest's last line: what passed, failed and skipped, and in how long."""
    return next((line.strip("= ") for line in reversed(stdout.splitlines()) if OUTCOME.search(line)), "(no summary line)")


class Orphans(NamedTuple):
    """The run's processes that outlived the process that started them, adopted by this one."""

    ended: int  # reaped here once the run was over
    cpu: float  # their user and system seconds (and those of what they reaped)
    running: list[int]  # still running ORPHAN_WAIT_S after the run: not counted


class Run(NamedTuple):
    result: subprocess.CompletedProcess
    wall: float  # seconds
    yardstick: Yardstick  # timed just before and just after
    started: float  # time.time()
    cpu: float  # user and system seconds of every process of the run that ended: waited for, or adopted orphans
    orphans: Orphans | None  # None: this system cannot adopt them, and their CPU is not counted


def children_cpu() -> float:
    """User and system seconds of this process's children that ended and were reaped, so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reap_orphans(timeout: float) -> tuple[int, list[int]]:
    """Give the run's orphans, adopted by this process, up to `timeout` to end, and reap them: (how
    many were reaped, the pids of those still running)."""
    from harness.reliability import processes  # importable once main() has put the checkout on the path

    running = processes.settled(processes.descendants, timeout)
    return processes.reap_ended(), sorted(process.pid for process in running.values())


def timed_run(command: list[str], env: dict | None = None) -> Run:
    from harness.reliability.processes import become_subreaper

    yardstick = Yardstick()
    # Orphans of the run (a process whose parent ended first, as a rank pool's fork server once its
    # xdist worker is gone) come to this process instead of to init: reaped here, their CPU counts.
    adopting = become_subreaper()
    started, start, cpu = time.time(), time.monotonic(), children_cpu()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall, before_reaping = time.monotonic() - start, children_cpu()
    orphans = None
    if adopting:
        ended, running = reap_orphans(ORPHAN_WAIT_S)
        orphans = Orphans(ended, children_cpu() - before_reaping, running)
    cpu = children_cpu() - cpu
    yardstick.close()
    return Run(result, wall, yardstick, started, cpu, orphans)


def machine_cores() -> int:
    from harness.session.machine import cores  # importable once main() has put the checkout on the path

    return cores()


class CpuUse(NamedTuple):
    nodeid: str
    own: float  # CPU seconds of the test's process, from its start to its end
    waited: float  # those of the processes it waited for meanwhile


def read_events(path: Path) -> tuple[dict[str, list[float]], list[CpuUse]]:
    """What scripts/lib/session_phases.py wrote: when each phase came (EVENT PID TIME), and each
    test's CPU time (test-cpu PID OWN WAITED NODEID)."""
    events, cpu = defaultdict(list), []
    for line in path.read_text().splitlines() if path.exists() else ():
        if line.startswith("test-cpu "):
            _, _, own, waited, nodeid = line.split(" ", 4)
            cpu.append(CpuUse(nodeid, float(own), float(waited)))
        else:
            event, _, stamp = line.split()
            events[event].append(float(stamp))
    return events, cpu


def phases(events: dict[str, list[float]], start: float, end: float, yardstick: Yardstick) -> str:
    """The run split at its first test's start and its last test's end, over all its processes."""
    if not events["test-start"]:
        return "phases: no test started"
    first, last = min(events["test-start"]), max(events["test-end"], default=end)
    configured = min(events["configured"], default=start) - start
    collected = max(events["collected"], default=first) - start
    return (f"before the first test {yardstick.both(first - start)} (pytest configured at {configured:.1f} s, "
            f"the last process collected at {collected:.1f} s); from the first test's start to the last's end "
            f"{yardstick.both(last - first)}; after the last test {yardstick.both(end - last)}")


def durations(args: list[str]) -> None:
    command = [sys.executable, "-m", "pytest", *args, "-q", "-rfE", "-p", "no:cacheprovider", "--durations=0",
               "--durations-min=0"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "phases"
        env = {"SESSION_PHASES_FILE": str(path),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts" / "lib"), os.environ.get("PYTHONPATH")]))}
        # The plugin is this script's, not part of the command it prints and times.
        run = timed_run([*command, "-p", "session_phases"], env)
        events, cpu = read_events(path)
    result, wall, yardstick = run.result, run.wall, run.yardstick
    split = phases(events, run.started, run.started + wall, yardstick)
    per_file, tests = defaultdict(float), defaultdict(float)
    for line in result.stdout.splitlines():
        if match := DURATION.match(line):
            seconds, nodeid = float(match[1]), match[3]
            per_file[nodeid.split("::")[0]] += seconds
            tests[nodeid] += seconds
    print(f"$ {' '.join(command[2:])}\n{outcome(result.stdout)}")
    if not tests:
        print(result.stdout[-3000:] + result.stderr[-3000:])
        sys.exit(f"no test durations in the output (pytest exit {result.returncode})")
    total = sum(tests.values())
    print(f"wall {yardstick.both(wall)}; summed test time {yardstick.both(total)} "
          f"(setup + call + teardown of {len(tests)} tests)\n{split}\n{yardstick.describe()}\n")
    for line in result.stdout.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"  {line}")
    print("per file:")
    for name, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:20]:
        print(f"  {seconds:7.1f} s {yardstick.times(seconds):6.2f} lt {100 * seconds / total:5.1f}%  {name}")
    print("\nslowest tests:")
    for nodeid, seconds in sorted(tests.items(), key=lambda item: -item[1])[:20]:
        print(f"  {seconds:7.1f} s {yardstick.times(seconds):6.2f} lt  {nodeid}")
    print(cpu_breakdown(run, cpu))
    sys.exit(result.returncode)


def counted(orphans: Orphans | None) -> str:
    """Which of the run's processes its CPU time counts."""
    if orphans is None:
        return "those waited for; this system cannot adopt the run's orphans, whose CPU is left out"
    text = f"every one that ended, {orphans.ended} orphans adopted here among them ({orphans.cpu:.1f} s)"
    if orphans.running:
        text += (f"; {len(orphans.running)} still running {ORPHAN_WAIT_S:g} s after the run, left out "
                 f"(pids {' '.join(map(str, orphans.running))})")
    return text


def cpu_breakdown(run: Run, tests: list[CpuUse]) -> str:
    """Where the run's CPU time went: its processes' total, the least wall time it allows on this
    machine's cores, the tests' share (their own processes, and those they waited for) per file and
    by test, and the rest (start-up, collection, the end, the xdist controller, and processes a test
    started that ended after it: a data-parallel rank pool's fork server and ranks, at the process's exit)."""
    cores, total, yardstick = machine_cores(), run.cpu, run.yardstick
    own, waited = sum(t.own for t in tests), sum(t.waited for t in tests)
    lines = [f"\nCPU {yardstick.both(total)} in the run's processes ({counted(run.orphans)}); on {cores} cores its "
             f"wall time can be no less than {yardstick.both(total / cores)}",
             f"in the tests {yardstick.both(own + waited)} ({own:.1f} s in their own processes, {waited:.1f} s in "
             f"processes they waited for); outside them {yardstick.both(total - own - waited)} (start-up, "
             f"collection, the end, and processes a test started that ended after it)"]
    per_file = defaultdict(lambda: [0.0, 0.0])
    for t in tests:
        split = per_file[t.nodeid.split("::")[0]]
        split[0], split[1] = split[0] + t.own, split[1] + t.waited

    def row(name: str, own: float, waited: float) -> str:
        return (f"  {own + waited:7.1f} s {yardstick.times(own + waited):6.2f} lt  "
                f"({own:.1f} s own, {waited:.1f} s waited for)  {name}")

    lines.append("\nCPU per file:")
    lines += [row(name, *split) for name, split in sorted(per_file.items(), key=lambda item: -sum(item[1]))[:20]]
    lines.append("\nmost CPU, by test:")
    lines += [row(t.nodeid, t.own, t.waited) for t in sorted(tests, key=lambda t: -(t.own + t.waited))[:20]]
    return "\n".join(lines)


def profile(args: list[str]) -> None:
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.prof"
        # --no-supervisor: the session runs in this process, not in a child the profiler never sees.
        command = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "pytest", *args, "-q", "-p", "no:xdist",
                   "-p", "no:cacheprovider", "--no-supervisor"]
        result, wall, yardstick, *_ = timed_run(command)
        if not out.exists():
            print(result.stdout[-3000:] + result.stderr[-3000:])
            sys.exit(f"the profiled run left no profile (pytest exit {result.returncode})")
        stats = pstats.Stats(str(out)).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    print(f"$ pytest {' '.join(args)} (serial, under cProfile)\n{outcome(result.stdout)}\n"
          f"wall {yardstick.both(wall)}\n{yardstick.describe()}\n")
    for name, (suffix, wanted) in COSTS.items():
        seconds, calls = 0.0, 0
        for (filename, _, function), (_, primitive, _, cumulative, _) in stats.items():
            if filename.endswith(suffix) and function == wanted:
                seconds, calls = seconds + cumulative, calls + primitive
        print(f"  {seconds:7.1f} s {yardstick.times(seconds):6.2f} lt {100 * seconds / wall:5.1f}%  {name} ({calls} calls)")
    sys.exit(result.returncode)


def machine() -> str:
    import torch

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "unknown"
    return (f"{os.cpu_count()} CPU cores ({processor()}), load average {load} before the runs; "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def processor() -> str:
    """The CPU's model as Linux names it: hosts of one machine kind differ, and the loop's speed with them."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return platform.processor() or "unknown processor"
    fields: dict[str, str] = {}
    for line in info.read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return (f"{fields.get('model name', 'unknown')}, family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}, {fields.get('cpu MHz', '?')} MHz")


def run_line(run: int, name: str, summary: str, wall: float, cpu: float, cores: int, yardstick: Yardstick,
             target: float, verdict: str) -> str:
    """One run of one command in targets.txt (scripts/figures.py reads it back: TARGET_RUN), with the
    CPU it used and the least wall time that allows on the machine's cores (cpu_breakdown)."""
    return (f"run {run} {name}: {summary}; {wall:.1f} s wall, {cpu:.1f} s CPU (on {cores} cores at least "
            f"{yardstick.times(cpu / cores):.1f} loop-times), the loop {yardstick.before:.2f} s before and "
            f"{yardstick.after:.2f} s after: {yardstick.times(wall):.1f} loop-times (target {target:g}): {verdict}")


def targets(runs: int, out: Path | None) -> None:
    """The README's two commands, `runs` times each, against their targets in loop-times."""
    host, lines, met = machine(), [], defaultdict(int)
    print(host)
    logs, failed = {}, {}
    for run in range(1, runs + 1):
        for name, title, args, env, target in TARGETS:
            command = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"]
            result, wall, yardstick, _, cpu, orphans = timed_run(command, env)
            loop_times = yardstick.times(wall)
            ok = result.returncode == 0 and loop_times <= target
            met[name] += ok
            verdict = "met" if ok else "NOT MET" if result.returncode == 0 else f"pytest exit {result.returncode}"
            line = run_line(run, name, outcome(result.stdout), wall, cpu, machine_cores(), yardstick, target, verdict)
            if orphans is None or orphans.running:
                line += f"\n  its CPU counts {counted(orphans)}"
            print(line, flush=True)
            lines.append(line)
            logs[name] = result.stdout + result.stderr
            if result.returncode != 0:  # kept whichever run it was: the last run's log may not show it
                failed[f"{name}-run{run}-failed"] = logs[name]
    summary = [f"{name}, {title}: target met in {met[name]} of {runs} runs" for name, title, *_ in TARGETS]
    print("\n".join(summary))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in logs.items():
            (out / f"{name}.log").write_text(text)  # the last run's: scripts/figures.py reads its summary line
        for name, text in failed.items():
            (out / f"{name}.txt").write_text(text)
        (out / "targets.txt").write_text("\n".join([host, *lines, *summary]) + "\n")
        (out / "host.txt").write_text(host + "\n")
        print(f"logs in {out} (then: python scripts/figures.py)")
    sys.exit(0 if all(met[name] == runs for name, *_ in TARGETS) else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true", help="one serial run under cProfile, costs by name")
    parser.add_argument("--targets", action="store_true", help="the README's two commands against their targets")
    parser.add_argument("--runs", type=int, default=1, help="with --targets: how many times to run each (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="with --targets: write the logs and table into OUT")
    parser.add_argument("--loop-additions", type=int, default=LOOP_ADDITIONS,
                        help="time a shorter yardstick loop, scaled to 20 million additions (noisier)")
    known, pytest_args = parser.parse_known_args()
    if known.loop_additions < 1:
        parser.error("--loop-additions must be 1 or more")
    Yardstick.additions = known.loop_additions
    if known.targets:
        if pytest_args or known.profile:
            parser.error("--targets runs the README's own commands: give no pytest arguments and no --profile")
        if known.runs < 1:
            parser.error("--runs must be 1 or more")
        targets(known.runs, known.out)
    if known.out is not None or known.runs != 1:
        parser.error("--runs and --out go with --targets")
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
