"""What a capture on the CPU graph emulator costs against the same step run eagerly, on this machine.

    python reports/cpu/2026-12-03-speed-5/emulator_overhead.py [--rounds 10]

Builds and captures the reference engine (FULL_AND_PIECEWISE, the suites' default engine) `rounds`
times three ways and prints the median of each and its ratio to the eager one:

- the emulator as the suites use it (harness.graphs.emulated): every aten op recorded, its
  allocations placed in the graph's memory pool, the host-read guard on;
- the same dispatch modes with a recorder that records nothing (what entering a Python dispatch
  mode for every op costs by itself);
- no modes at all: the capture's code run eagerly.

The first minus the second is the recorder's own bookkeeping, the part a faster emulator would cut.
A diagnostic: the second and third swap the emulator's internals for the length of the run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch  # noqa: E402

from harness.graphs import emulated  # noqa: E402
from harness.runtime.observe import EngineFactory  # noqa: E402
from reference_runtime.adapter import ReferenceRuntime  # noqa: E402


class _NoMode:
    steps, new_bytes = [], 0

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def undo(self):
        pass


def _passthrough(self, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))


def median_ms(factory: EngineFactory, rounds: int) -> float:
    factory.get(fresh=True, mode="FULL_AND_PIECEWISE")  # the first build also imports and warms up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        factory.get(fresh=True, mode="FULL_AND_PIECEWISE")
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)
    factory = EngineFactory(ReferenceRuntime(), "emulated")
    recorded = median_ms(factory, rounds)
    with mock.patch.object(emulated._RecordingMode, "__torch_dispatch__", _passthrough):
        passthrough = median_ms(factory, rounds)
    with mock.patch.object(emulated.modes, "make", lambda cls, *a, **k: _NoMode()), \
            mock.patch.object(emulated, "_HostReadGuard", _NoMode):
        eager = median_ms(factory, rounds)
    print(f"build and capture of the reference engine (FULL_AND_PIECEWISE), median of {rounds}, torch {torch.__version__}")
    for name, ms in (("recorded (the emulator)", recorded), ("modes that record nothing", passthrough),
                     ("eager (no modes)", eager)):
        print(f"  {name:28s} {ms:7.1f} ms  {ms / eager:5.2f}x eager")
    print(f"the recorder's bookkeeping: {recorded - passthrough:.1f} ms, {100 * (recorded - passthrough) / recorded:.0f}% "
          f"of a capture")
    return 0


if __name__ == "__main__":
    sys.exit(main())
