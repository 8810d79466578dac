"""What the first command (`python -m pytest suites/ --runtime reference -n 2`) costs before its
tests do any work, and the imports its tests add, in wall seconds and CPU seconds (user + sys of
the processes), each twice, with the yardstick loop (scripts/time_breakdown.py) before and after:

    python scripts/startup_floor.py > reports/cpu/DATE/floor.txt

On two cores, CPU seconds bound a run more than wall seconds do: what is here is paid whatever the
tests do.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from time_breakdown import children_cpu, loop_seconds

ROOT = Path(__file__).resolve().parent.parent
COSTS = (
    ("the suites command with no test selected: the xdist controller and two workers start and collect",
     ["-m", "pytest", "suites/", "--runtime", "reference", "-n", "2", "-q", "-k", "nothing_matches_this"]),
    ("what the data-parallel rank pool's fork server imports (harness.scenarios.ranks.PRELOAD)",
     ["-c", "import harness.scenarios.ranks as r, importlib; [importlib.import_module(m) for m in r.PRELOAD]"]),
    ("torch and transformers' Llama (what the anchor imports)", ["-c", "import torch; from transformers import LlamaForCausalLM"]),
    ("torch alone", ["-c", "import torch"]),
)


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# python scripts/startup_floor.py at {commit or 'unknown'}; CPU = user + sys of the command's processes")
    print(f"# the yardstick loop before: {loop_seconds():.2f} s")
    for what, args in COSTS:
        for _ in range(2):
            before, start = children_cpu(), time.perf_counter()
            subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True)
            wall, cpu = time.perf_counter() - start, children_cpu() - before
            print(f"{what}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(f"# the yardstick loop after: {loop_seconds():.2f} s")


if __name__ == "__main__":
    main()
