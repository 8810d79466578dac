"""Whether this machine has a CUDA device, answered without importing torch where it can be.

Importing torch costs seconds; a session that only asks policy questions, on a machine with no
NVIDIA driver at all, should not pay it to learn that there is no GPU.
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from importlib import metadata

DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")  # the driver's nodes (dxg: WSL)


def cuda_available() -> bool:
    if "torch" not in sys.modules and sys.platform == "linux" and not any(map(os.path.exists, DEVICE_FILES)):
        return False  # no driver, so no device, whatever torch would say
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def torch_version() -> tuple[str | None, str | None]:
    """(release, build) of the installed torch: ("2.13.0", "cpu"), ("2.13.0", "cu128"), ("2.4.0", None).

    One source, whatever the run imported: torch's own `torch/version.py`, read as text (importing
    torch costs seconds on a policy-only run). Its wheel's metadata is no substitute: PyPI's CUDA
    wheels say "2.13.0" there and "2.13.0+cu128" in `torch.__version__`, so a report would change
    with whether the run happened to import torch. The release is what a version range compares;
    the build, PEP 440's local part, says which wheel (CPU, CUDA 12.8, ROCm) it was."""
    full = None
    spec = importlib.util.find_spec("torch") if "torch" not in sys.modules else None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = open(os.path.join(folder, "version.py")).read()
        except OSError:
            continue
        found = re.search(r"""^__version__\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", text, re.MULTILINE)
        full = found.group(1) if found else None
        break
    if full is None and "torch" in sys.modules:
        full = str(sys.modules["torch"].__version__)
    if full is None:
        try:
            full = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return None, None
    release, _, build = full.partition("+")
    return release, build or None


def share(graph_backend: str, index: int | None) -> None:
    """This process's part of a machine it shares with others (xdist workers, data-parallel ranks).
    On CUDA the graph log counts graphs from now on, and where there are several GPUs process
    `index` (where given) uses GPU `index` mod the count (with one, no device is set, so CUDA starts
    no earlier than the first engine). On the CPU a process computes on one thread, with an index
    or without: N processes then do not oversubscribe N cores, and one process does not keep a
    thread on every core spinning for the emulator's small matrices, which gain no speed from
    them (reports/cpu/2026-12-03-speed-7/experiments.txt)."""
    import torch

    if graph_backend == "cuda":
        from harness.graphs.log import watch_cuda_graphs

        watch_cuda_graphs()
        if index is not None and torch.cuda.device_count() > 1:
            torch.cuda.set_device(worker_device(index))
    else:
        torch.set_num_threads(1)


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_device(index: int) -> int:
    """The GPU process `index` of a shared machine uses: `index` mod the number of GPUs."""
    import torch

    return index % max(1, torch.cuda.device_count())


def free_port() -> int:
    """A free local TCP port, for a process group's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
