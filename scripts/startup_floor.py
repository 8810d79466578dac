"""What the first command (`python -m pytest suites/ --runtime reference -n 2`) costs before its
tests do any work, and the imports its tests add, in wall seconds and CPU seconds (user + sys of
the processes), each twice, with the yardstick loop (scripts/time_breakdown.py) before and after:

    python scripts/startup_floor.py > reports/cpu/DATE/floor.txt

On two cores, CPU seconds bound a run more than wall seconds do: what is here is paid whatever the
tests do. The last line sets that floor against the CPU the command's target allows on this
machine's cores, and says what is left for the tests' own work.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from time_breakdown import TARGETS, Yardstick, children_cpu, machine_cores, processor

ROOT = Path(__file__).resolve().parent.parent
START_UP, FORK_SERVER, WITH_LLAMA, TORCH = "start-up", "fork server", "with llama", "torch"
COSTS = (
    (START_UP, "the suites command with no test selected: the xdist controller and two workers start and collect",
     ["-m", "pytest", "suites/", "--runtime", "reference", "-n", "2", "-q", "-k", "nothing_matches_this"]),
    (FORK_SERVER, "what the data-parallel rank pool's fork server imports (harness.runtime.ranks.PRELOAD)",
     ["-c", "import harness.runtime.ranks as r, importlib; [importlib.import_module(m) for m in r.PRELOAD]"]),
    (WITH_LLAMA, "torch and transformers' Llama (what the anchor imports)",
     ["-c", "import torch; from transformers import LlamaForCausalLM"]),
    (TORCH, "torch alone", ["-c", "import torch"]),
)


def floor_line(least: dict[str, float], yardstick: Yardstick, cores: int, target: float) -> str:
    """The first command's floor (its start-up, the fork server, what transformers adds to torch in
    the worker that runs the anchor), each the least of its readings, against the target's CPU."""
    parts = {START_UP: least[START_UP], FORK_SERVER: least[FORK_SERVER],
             "transformers over torch": least[WITH_LLAMA] - least[TORCH]}
    paid = sum(parts.values())
    allowed = target * cores  # in loop-times of CPU
    shown = " + ".join(f"{name} {yardstick.times(cpu):.1f}" for name, cpu in parts.items())
    return (f"floor: {shown} = {yardstick.times(paid):.1f} loop-times of CPU before the tests work; the target's "
            f"{target:g} loop-times on {cores} cores allow {allowed:.1f}, leaving "
            f"{allowed - yardstick.times(paid):.1f} loop-times of CPU ({allowed * yardstick.seconds - paid:.1f} s) "
            f"for the tests' own work (a loop-time is {yardstick.seconds:.2f} s here)")


def main() -> None:
    sys.path.insert(0, str(ROOT))  # machine_cores() reads harness.session.machine from this checkout
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# python scripts/startup_floor.py at {commit or 'unknown'}; CPU = user + sys of the command's processes")
    cores = machine_cores()
    print(f"# {cores} cores ({processor()})")
    yardstick = Yardstick()
    print(f"# the yardstick loop before: {yardstick.before:.2f} s")
    least: dict[str, float] = {}
    for key, what, args in COSTS:
        for _ in range(2):
            before, start = children_cpu(), time.perf_counter()
            subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True)
            wall, cpu = time.perf_counter() - start, children_cpu() - before
            least[key] = min(cpu, least.get(key, cpu))
            print(f"{what}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    yardstick.close()
    print(f"# the yardstick loop after: {yardstick.after:.2f} s")
    (target,) = [target for name, *_, target in TARGETS if name == "first-command"]
    print(floor_line(least, yardstick, cores, target))


if __name__ == "__main__":
    main()
