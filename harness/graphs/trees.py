"""What torch.compile's CUDA graph trees did during a call, seen from their own tree manager.

`torch.compile(mode="reduce-overhead")` runs each compiled function through a tree manager that,
per exact input shape, first warms the function up (eager kernels, no graph), then records it
(captures a graph and launches it once) and from then on replays it. A runtime that steps
through such a function reports the mode its step took from this, not from having asked for
graphs:

    with trees.observed() as paths:
        logits = compiled(ids, positions)
    mode = trees.runtime_mode(paths)

The manager's three entry points are wrapped once (CUDAGraphTreeManager.run_eager,
record_function, execute_node); where this torch has none of them, `observed()` yields None and
the runtime must say it cannot tell.
"""
from __future__ import annotations

from contextlib import contextmanager

PATHS = {"run_eager": "warmup", "record_function": "recording", "execute_node": "replay"}
_taken: list[str] = []  # every path any manager took, in order, since the wrappers went in
_installed: bool | None = None


def _install() -> bool:
    global _installed
    if _installed is None:
        try:
            from torch._inductor.cudagraph_trees import CUDAGraphTreeManager
        except ImportError:
            _installed = False
            return False
        if not all(hasattr(CUDAGraphTreeManager, name) for name in PATHS):
            _installed = False
            return False
        for name, path in PATHS.items():
            original = getattr(CUDAGraphTreeManager, name)

            def wrapper(self, *args, _original=original, _path=path, **kwargs):
                _taken.append(_path)
                return _original(self, *args, **kwargs)
            setattr(CUDAGraphTreeManager, name, wrapper)
        _installed = True
    return _installed


@contextmanager
def observed():
    """The paths the graph trees took inside the block ("warmup", "recording", "replay"), filled
    in when it ends; None where this torch's graph trees cannot be observed."""
    if not _install():
        yield None
        return
    start, paths = len(_taken), []
    try:
        yield paths
    finally:
        paths.extend(_taken[start:])
        del _taken[start:]


def runtime_mode(paths: list[str] | None) -> str | None:
    """The runtime mode of a call that took `paths`: FULL for one graph launched (a recording
    launches the graph it captured once), PIECEWISE for several (graph breaks between them), NONE
    for none (a warm-up, or no graph trees at all), None where nothing could be observed."""
    if paths is None:
        return None
    launches = sum(path != "warmup" for path in paths)
    if "warmup" in paths and launches:
        return "PIECEWISE"  # some partitions eager, some graphs
    return {0: "NONE", 1: "FULL"}.get(launches, "PIECEWISE")


def compile_pair(fn):
    """`fn` compiled twice by Inductor with static shapes: through CUDA graph trees (what
    mode="reduce-overhead" turns on) and without graphs, the eager reference of a runtime that
    steps through graph trees. Both choose their kernels by the same rule, so the two agree bit for
    bit: by default Inductor times a reduction's candidate launch configurations on the device, once
    per compilation, and two compilations can pick differently and round differently; its
    deterministic mode, where this torch has it, picks without timing."""
    import torch
    import torch._inductor.config

    rule = {"deterministic": True} if hasattr(torch._inductor.config, "deterministic") else {}
    with_graphs = torch.compile(fn, dynamic=False, options={**rule, "triton.cudagraphs": True})
    without = torch.compile(fn, dynamic=False, options={**rule, "triton.cudagraphs": False})
    return with_graphs, without
