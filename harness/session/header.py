"""What a run will skip and why, one line each, for the report header (and what it cannot check);
and pytest-benchmark kept quiet where it cannot time (under xdist), as it would turn itself off
anyway.

Known before collection from the run's choices alone: the capabilities the runtime does not
declare (each test that needs one is skipped, naming it), the benchmark lane where it cannot run,
the execution suites without a graph backend. A test that skips for a reason of its own (an
attention backend that admits no FULL graph) says so in the summary, not here.
"""
from __future__ import annotations

import os

from harness import moved
from harness.protocol import Capabilities
from harness.vocabulary import PADDING_FILLS

BENCHMARK_SUITES = "test_step_latency.py, test_serving.py"
# Declarations whose absence skips nothing: a test asks for them to be absent ("not ...") or reads them.
ONLY_WHEN_DECLARED = ("outputs_alias_graph_buffers", "lazy_capture")


def xdist_active(config) -> bool:
    """pytest-benchmark's own test, so that it never gets to warn: a session under xdist, or any
    session inside an xdist worker's process (the self-tests' in-process sessions)."""
    return config.getoption("dist", "no") != "no" or bool(os.environ.get("PYTEST_XDIST_WORKER"))


def keep_benchmarks_quiet(config) -> None:
    """Under xdist pytest-benchmark turns itself off with a raw warning in every process; turning it
    off first (its own --benchmark-disable: each benchmarked function runs once, untimed) says
    the same once, in the header."""
    options = config.option
    if not hasattr(options, "benchmark_disable") or not xdist_active(config):
        return
    if not (options.benchmark_skip or options.benchmark_only or options.benchmark_disable):
        options.benchmark_disable = True
        options.cudagraph_benchmarks_off_under_xdist = True


def skip_lines(config, runtime, graph_backend: str | None, no_backend: str | None) -> list[str]:
    capabilities: Capabilities = runtime.capabilities
    name = runtime.name
    lines = []
    undeclared = [c for c in Capabilities.names() if c not in ONLY_WHEN_DECLARED and not capabilities.has(c)]
    if undeclared:
        how = "deselected (--only-declared)" if getattr(config.option, "only_declared", False) else "skipped"
        lines.append(f"{how}: tests that need {', '.join(undeclared)} (runtime {name!r} does not declare them)")
    if capabilities.outputs_alias_graph_buffers:
        lines.append(f"skipped: the check that held outputs survive the next step (runtime {name!r} declares "
                     "outputs_alias_graph_buffers)")
    if capabilities.declares("random_padding_ids"):
        lines.append(f"checked differently: padded rows' token ids are held to change from step to step, not to stay "
                     f"the same (runtime {name!r} declares random_padding_ids)")
    if capabilities.lazy_capture:
        lines.append(f"checked differently: graphs recorded while serving are held to one per batch shape, not to none "
                     f"(runtime {name!r} declares lazy_capture)")
    if capabilities.execution and capabilities.padding_fills:
        missing = [fill for fill in PADDING_FILLS if fill not in capabilities.padding_fills]
        if missing:
            lines.append(f"skipped: padding fills {', '.join(missing)} (runtime {name!r} cannot make them)")
    if capabilities.execution and capabilities.padding_fills and not capabilities.input_inspection:
        lines.append(f"not checked: that a padding fill reached the padded rows (runtime {name!r} does not declare "
                     "input_inspection, so only real rows are compared with and without the fill)")
    if no_backend:
        lines.append(f"skipped: the execution suites ({no_backend})")
    elif (why := benchmark_lane_off(config, graph_backend)) is not None:
        lines.append(f"skipped: the benchmark lane ({BENCHMARK_SUITES}): {why}")
    return lines + moved.header_lines()


def benchmark_lane_off(config, graph_backend: str | None) -> str | None:
    """Why the benchmark lane cannot run in this session, or None: the header's line, and the
    skip of every test of the lane (plugin.bench_engines). pytest-benchmark turned off (under
    xdist, or --benchmark-disable) runs each benchmarked function once and keeps no timings."""
    option = config.option
    if graph_backend != "cuda":  # the emulator's timings mean nothing
        return f"benchmarks need CUDA graphs on a GPU, and this run's graph backend is {graph_backend}"
    if getattr(option, "cudagraph_benchmarks_off_under_xdist", False):
        return "pytest-benchmark cannot time tests under xdist (-n); run it with -p no:xdist"
    if getattr(option, "benchmark_skip", False):
        return "--benchmark-skip"
    if getattr(option, "benchmark_disable", False):
        return "--benchmark-disable: pytest-benchmark times nothing"
    return None
