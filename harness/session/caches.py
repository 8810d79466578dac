"""Where a run keeps its caches: never in the directory it runs from, which is usually an engine's
repository. pytest-benchmark's storage (`.benchmarks/`), hypothesis's directory (`.hypothesis/`:
its example database and constants) and, for `cudagraph-conformance`, pytest's cache all go to a
user cache, one folder per directory run from (so `--lf` and hypothesis's saved failing examples
stay per project):

    $CUDAGRAPH_CONFORMANCE_CACHE, else $XDG_CACHE_HOME/cudagraph-conformance,
    else ~/.cache/cudagraph-conformance; where none can be created, the temporary directory.

A place the user named wins: `--benchmark-storage`, HYPOTHESIS_STORAGE_DIRECTORY, `-o cache_dir=`.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

# pytest-benchmark's default, relative to the directory run from.
BENCHMARK_STORAGE_DEFAULT = "file://./.benchmarks"


def user_cache() -> Path:
    named = os.environ.get("CUDAGRAPH_CONFORMANCE_CACHE")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cudagraph-conformance"


def project_cache(cwd: Path | None = None) -> Path:
    """This directory's folder in the user cache: its name and a digest of its full path."""
    cwd = Path(cwd or Path.cwd()).resolve()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", cwd.name).strip("-") or "root"
    folder = f"{name}-{hashlib.sha256(str(cwd).encode()).hexdigest()[:12]}"
    for root in (user_cache(), Path(tempfile.gettempdir()) / f"cudagraph-conformance-{os.getuid()}"):
        try:
            (root / folder).mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        return root / folder
    return Path(tempfile.mkdtemp(prefix="cudagraph-conformance-"))


def place(config) -> Path:
    """Point pytest-benchmark's storage and hypothesis's directory at this project's cache, unless
    the user named them. Called in pytest_configure, before pytest-benchmark's (trylast) makes its
    storage and before any test touches hypothesis's."""
    cache = project_cache(config.invocation_params.dir)
    if config.getoption("benchmark_storage", None) == BENCHMARK_STORAGE_DEFAULT:
        config.option.benchmark_storage = f"file://{cache / 'benchmarks'}"
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(cache / "hypothesis")
    return cache
