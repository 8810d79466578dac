"""What an engine changes for the whole process during a call, put back. The harness fails a test
that leaves process-wide state changed (docs/reliability.md), since it would taint the tests after
it; a runtime, not its engine, owns that promise. Engines set environment variables (caches,
library paths) and draw from torch's global CPU and CUDA generators."""
from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager


def apply_environment(environment: dict[str, str]) -> None:
    """Defaults for variables an engine reads at import (a variable already set wins); Inductor's
    compile threads told directly where its config module read the variable already."""
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None and "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        inductor.compile_threads = int(os.environ["TORCHINDUCTOR_COMPILE_THREADS"])


@contextmanager
def environment_restored():
    """os.environ as it was before the call: variables added are removed, changed ones put back."""
    environment = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(environment):
            del os.environ[name]
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


@contextmanager
def random_forked():
    """The engine draws from torch's global generators (CPU and every CUDA device) inside; the
    caller's streams are as they were after."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield


class EngineRandom:
    """An engine's own CPU and CUDA generator states, seeded once and kept between calls, so that its
    draws go on as one stream and the caller's generators are untouched (`device` None: the CPU
    generator only)."""

    def __init__(self, seed: int, device: int | None):
        import torch

        self.device = device
        self.cpu = torch.Generator().manual_seed(seed).get_state()
        self.cuda = None if device is None else torch.Generator(device=f"cuda:{device}").manual_seed(seed).get_state()

    def swap_in(self):
        import torch

        caller = (torch.get_rng_state(), None if self.device is None else torch.cuda.get_rng_state(self.device))
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        return caller

    def swap_out(self, caller) -> None:
        import torch

        self.cpu = torch.get_rng_state()
        torch.set_rng_state(caller[0])
        if self.device is not None:
            self.cuda = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(caller[1], self.device)


@contextmanager
def own_random(rng: EngineRandom):
    """The engine's own random streams in, the caller's back after."""
    caller = rng.swap_in()
    try:
        yield
    finally:
        rng.swap_out(caller)


@contextmanager
def process_state_restored(rng: EngineRandom | None = None):
    """What an engine changes for the process during a call, put back: the environment, and torch's
    generators (the engine drawing from its own streams `rng` where given, else from forked ones)."""
    with environment_restored(), (random_forked() if rng is None else own_random(rng)):
        yield


def cached_memory_returned() -> None:
    """Garbage collected, then the CUDA allocator's cached blocks handed back to the device: the
    harness measures an engine's memory as free device memory (around capture(), after close())."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def shared_stream(streams: dict, device: int):
    """The one CUDA stream of `streams` (a dict the caller keeps for the process) for `device`. cuBLAS
    keeps a workspace for every stream a matmul ran on for the life of the process: engines that make
    a stream each would grow the process by a workspace an engine; engines that run one at a time share one."""
    import torch

    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "apply_environment", "environment_restored", "random_forked", "EngineRandom", "own_random",
    "process_state_restored", "shared_stream", "cached_memory_returned",
]
