"""Where the host's time goes in one step (issue 56): a few calls of a step under cProfile, the top
functions by own and by cumulative time, per step, and whether the profile covers the step's host
time measured without it.

The benchmark lane (suites/test_step_latency.py) profiles an engine's own step call after its timed
rounds, so its latency figures are those of unprofiled steps; scripts/engines_report.py names a
cause from the rows. Only the calling thread is profiled: an engine that does a step's host work in
another thread shows the wait for it (a lock's `acquire`), and `gap` says when the profile saw too
little or too much of the step to stand for it.
"""
from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

from harness.reports.records import HostProfile

STEPS = 5  # a handful: the rows' figures are per step, and a slow engine's profile stays within seconds
TOP = 15
# The profile's own time per step against the same call unprofiled: below the floor the host's time
# is in no row (cProfile times no call made from C that it was not told of: the graph emulator's
# replayed torch ops lose most of theirs); above the ceiling the profiler's per-call cost swamped
# the step, and its milliseconds are no longer the step's.
COVERS = (0.5, 4.0)
_SITE_DIRS = ("site-packages", "dist-packages")


def where(filename: str) -> str:
    """A profiled function's file as an engine's code is cited: relative to site-packages, or to the
    longest sys.path entry it lies under (the checkout, a plugin's folder, the standard library);
    built-ins keep the profiler's name for them."""
    if not filename or filename.startswith("<") or filename == "~":
        return filename or "?"
    path = os.path.abspath(filename)
    for site in _SITE_DIRS:
        marker = f"{os.sep}{site}{os.sep}"
        if marker in path:
            return path.rsplit(marker, 1)[1]
    roots = sorted({os.path.abspath(p or os.curdir) for p in sys.path}, key=len, reverse=True)
    for root in roots:
        if path.startswith(root.rstrip(os.sep) + os.sep):
            return path[len(root.rstrip(os.sep)) + 1:]
    return os.path.basename(path)


def _rows(stats: dict, steps: int, key: int, top: int) -> list[dict]:
    ranked = sorted(stats.items(), key=lambda item: item[1][key], reverse=True)[:top]
    return [{"function": func, "where": where(file), "line": line, "own_ms": round(tt * 1e3 / steps, 4),
             "cum_ms": round(ct * 1e3 / steps, 4), "calls": round(nc / steps, 2)}
            for (file, line, func), (_cc, nc, tt, ct, _callers) in ranked]


def profile_host(step, *, mode: str, batch: int, steps: int = STEPS, wait=None, top: int = TOP,
                 host_step_ms: float | None = None) -> HostProfile:
    """`steps` calls of step() under cProfile, each followed by wait() outside the profile (a
    device sync: the host's part of a step is until its call returns). The profiler's own enable
    and disable are left out of the rows."""
    profiler = cProfile.Profile()
    wall = 0.0
    try:
        for _ in range(steps):
            start = time.perf_counter()
            profiler.enable()
            try:
                step()
            finally:
                profiler.disable()
            wall += time.perf_counter() - start
            if wait is not None:
                wait()
    except ValueError as error:  # another profiler holds the interpreter's hook (a debugger, coverage's)
        if "profil" not in str(error).lower():
            raise
        return HostProfile(mode=mode, batch=batch, steps=0, own_ms=0.0, profiled_ms=0.0, by_own=[],
                           by_cumulative=[], host_step_ms=host_step_ms,
                           unavailable={"by_own": f"cProfile could not start: {error}"})
    stats = {k: v for k, v in pstats.Stats(profiler).stats.items() if "_lsprof.Profiler" not in k[2]}
    return HostProfile(mode=mode, batch=batch, steps=steps,
                       own_ms=sum(v[2] for v in stats.values()) * 1e3 / steps, profiled_ms=wall * 1e3 / steps,
                       by_own=_rows(stats, steps, 2, top), by_cumulative=_rows(stats, steps, 3, top),
                       host_step_ms=host_step_ms)


def gap(profile: dict | HostProfile, covers: tuple[float, float] = COVERS) -> str | None:
    """Why the profile does not stand for the step's host time, or None where it does: its own time
    per step against the same call's host time unprofiled."""
    data = profile.as_dict() if isinstance(profile, HostProfile) else profile
    if data.get("unavailable") and not data.get("by_own"):
        return next(iter(data["unavailable"].values()))
    host, own = data.get("host_step_ms"), data["own_ms"]
    if not host:
        return None
    low, high = covers
    if own < low * host:
        return (f"the profile saw {own:.3f} ms of host time per step, under {low:g}x the {host:.3f} ms the step "
                "call took unprofiled: the rest is in no function of the profile (calls cProfile does not time)")
    if own > high * host:
        return (f"the profile saw {own:.3f} ms per step, over {high:g}x the {host:.3f} ms the step call took "
                "unprofiled: the profiler's own cost swamped the step")
    return None
