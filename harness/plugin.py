"""The pytest plugin (entry point `pytest11`): options, runtime selection, capability skips,
known failures, report header and the JSON report."""
from __future__ import annotations

import os

import pytest

from . import compare
from . import known_failures as kf
from . import registry, render, report, robustness
from .hypothesis_profiles import register_profiles
from .protocol import Capabilities

RUNTIME_KEY = pytest.StashKey()
KNOWN_KEY = pytest.StashKey()
REPORT_KEY = pytest.StashKey()
PROFILE_KEY = pytest.StashKey()
UNKNOWN_CAPABILITY_KEY = pytest.StashKey()

register_profiles()


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("cudagraph-conformance")
    group.addoption(
        "--runtime", default=registry.DEFAULT_RUNTIME,
        help="runtime under test: a registered name, or package.module:factory (default: %(default)s)",
    )
    group.addoption(
        "--known-failures", action="append", default=[], metavar="PATH",
        help="TOML file of known failures (strict xfail); the runtime's own file is read as well",
    )
    group.addoption(
        "--report-dir", default=None, metavar="DIR",
        help="write the run's JSON report and Markdown summary into DIR",
    )
    group.addoption(
        "--baseline", action="append", default=[], metavar="PATH",
        help="a run's JSON report to compare step latency and serving throughput against (may be repeated)",
    )
    group.addoption(
        "--regression-threshold", type=float, default=0.10, metavar="FRACTION",
        help="worse than the baseline by more than this is a regression (default %(default)s)",
    )
    group.addoption(
        "--fail-on-regression", action="store_true",
        help="exit 1 (tests failed) when there is a regression against the baseline",
    )
    group.addoption(
        "--graph-backend", default=None, choices=("emulated", "cuda"),
        help="graph backend for execution suites (default: cuda when a GPU is present, else emulated)",
    )
    group.addoption(
        "--bench-preset", default="small", metavar="NAME",
        help="model preset for the benchmark lane (default %(default)s; the suites use 'tiny')",
    )
    group.addoption(
        "--test-timeout", type=float, default=600.0, metavar="SECONDS",
        help="fail a test that runs longer than this (default %(default)s; 0 turns it off)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the runtime declares them")
    try:
        runtime = registry.resolve(config.getoption("runtime"), config.pluginmanager)
    except registry.RuntimeLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[RUNTIME_KEY] = runtime
    compare.RUNTIME_OPTION = config.getoption("runtime")
    config.pluginmanager.register(robustness.Robustness(config, runtime.name), "cudagraph-conformance-robustness")
    entries = []
    paths = list(config.getoption("known_failures"))
    own = getattr(runtime, "known_failures", None)
    if own and str(own) not in paths:
        paths.insert(0, str(own))
    try:
        for path in paths:
            entries.extend(kf.load(path))
    except kf.KnownFailuresError as exc:
        raise pytest.UsageError(str(exc)) from None
    if any(e.graph_backends for e in entries):  # device-specific entries: keep those for this run's backend
        backend = config.getoption("graph_backend") or ("cuda" if _cuda_available() else "emulated")
        entries = [e for e in entries if e.applies_to(backend)]
    config.stash[KNOWN_KEY] = (entries, set())
    _load_default_hypothesis_profile(config)
    if not hasattr(config, "workerinput"):  # the xdist controller or a plain run writes the report
        try:
            run_report = report.RunReport(config, runtime)
        except render.RunFileError as exc:
            raise pytest.UsageError(f"--baseline: {exc}") from None
        config.stash[REPORT_KEY] = run_report
        config.pluginmanager.register(run_report, "cudagraph-conformance-report")


def _load_default_hypothesis_profile(config):
    from hypothesis import settings

    chosen = config.getoption("hypothesis_profile", None)
    if chosen is None:
        chosen = "ci" if os.environ.get("CI") else "dev"
        settings.load_profile(chosen)
    config.stash[PROFILE_KEY] = chosen


def get_runtime(config):
    return config.stash[RUNTIME_KEY]


def pytest_report_header(config):
    runtime = get_runtime(config)
    seed = config.getoption("hypothesis_seed", None)
    return [
        f"runtime: {runtime.name} {runtime.version} ({type(runtime).__module__})",
        f"capabilities: {runtime.capabilities.summary()}",
        *([f"runtime notes: {runtime.capabilities.notes}"] if runtime.capabilities.notes else []),
        f"device: {report.device_description(runtime)}",
        f"hypothesis: profile {config.stash[PROFILE_KEY]}, seed {seed if seed is not None else 'random'}",
    ]


def pytest_generate_tests(metafunc):
    # The runtime is a parameter so its name shows in every test id (`test_x[reference]`).
    if "runtime" in metafunc.fixturenames:
        runtime = get_runtime(metafunc.config)
        metafunc.parametrize("runtime", [runtime], ids=[runtime.name], scope="session")


@pytest.fixture(scope="session")
def graph_backend(pytestconfig, runtime):
    """cuda when asked for or when a GPU is there and the runtime can use it; else the emulator."""
    chosen = pytestconfig.getoption("graph_backend")
    offered = runtime.capabilities.graph_backends
    robustness.pin_worker_to_a_gpu(pytestconfig)
    if chosen is None:
        chosen = "cuda" if "cuda" in offered and _cuda_available() else "emulated"
    if chosen not in offered:
        pytest.skip(f"runtime {runtime.name!r} offers graph backends {offered}, not {chosen!r}")
    return chosen


@pytest.fixture(scope="session")
def engine_factory(runtime, graph_backend):
    from .execution import EngineFactory

    return EngineFactory(runtime, graph_backend)


@pytest.fixture
def engines(engine_factory):
    """Captured engines for the execution suites; whatever a test leaves running is released."""
    yield engine_factory
    engine_factory.release_all()


@pytest.fixture(scope="session")
def bench_engines(runtime, graph_backend, pytestconfig):
    """Engines for the benchmark lane: a real model in bf16 on CUDA graphs, vLLM's default grid."""
    if graph_backend != "cuda":
        pytest.skip("benchmarks need CUDA graphs on a GPU; the emulator's timings mean nothing")
    from .execution import EngineFactory

    return EngineFactory(runtime, graph_backend, preset=pytestconfig.getoption("bench_preset"), dtype="bfloat16",
                         max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=512, kv_tokens=300_000)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    runtime = get_runtime(config)
    entries, _ = config.stash[KNOWN_KEY]
    for item in items:
        try:
            missing = _missing_capabilities(item, runtime.capabilities)
        except pytest.UsageError as exc:
            if not hasattr(config, "workerinput"):
                raise
            # xdist turns a worker's usage error into an INTERNALERROR that drops the message:
            # there the test errors at setup with it instead.
            item.stash[UNKNOWN_CAPABILITY_KEY] = str(exc)
            continue
        if missing:
            item.add_marker(pytest.mark.skip(
                reason=f"runtime {runtime.name!r} does not declare capability {', '.join(missing)}"
                if not any(m.startswith("not ") for m in missing) else
                f"runtime {runtime.name!r} declares {', '.join(m[4:] for m in missing if m.startswith('not '))}"
            ))
            continue
        entry = kf.first_match(entries, item.nodeid)
        if entry is not None:
            item.stash[KNOWN_KEY] = entry
            item.add_marker(pytest.mark.xfail(strict=True, reason=entry.describe()))
    _record_stale(config, [item.nodeid for item in items])


def _record_stale(config, nodeids):
    entries, _ = config.stash[KNOWN_KEY]
    # A run given single node ids (`file.py::test`) leaves the rest of the file out: it cannot
    # tell a stale entry from an unselected test, so it reports none.
    selects_nodes = any("::" in arg for arg in config.args)
    stale = set() if selects_nodes else {e.source for e in kf.stale(entries, nodeids)}
    config.stash[KNOWN_KEY] = (entries, stale)
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller prints the summary
        config.workeroutput["cudagraph_stale_known_failures"] = sorted(stale)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # The controller collects nothing; a worker saw the whole collection, before -k deselected.
    stale = getattr(node, "workeroutput", {}).get("cudagraph_stale_known_failures")
    if stale is not None:
        entries, _ = node.config.stash[KNOWN_KEY]
        node.config.stash[KNOWN_KEY] = (entries, set(stale))


def pytest_runtest_setup(item):
    message = item.stash.get(UNKNOWN_CAPABILITY_KEY, None)
    if message is not None:
        pytest.fail(message, pytrace=False)


def _missing_capabilities(item, capabilities: Capabilities) -> list[str]:
    missing = []
    for marker in item.iter_markers("requires"):
        for wanted in marker.args:
            negated = wanted.startswith("not ")
            name = wanted[4:].strip() if negated else wanted
            if name not in Capabilities.names():
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown capability {name!r} in @pytest.mark.requires; "
                    f"known: {', '.join(Capabilities.names())} (each may be prefixed with 'not ')"
                )
            if capabilities.has(name) == negated:
                missing.append(wanted)
    return missing


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    entry = item.stash.get(KNOWN_KEY, None)
    if entry is not None and rep.when == "call" and rep.failed and "XPASS(strict)" in str(rep.longrepr):
        rep.longrepr = (
            f"{rep.longrepr}\nThis test now passes: remove its entry {entry.test!r} from {entry.source}."
        )



def pytest_terminal_summary(terminalreporter, config):
    entries, stale_sources = config.stash.get(KNOWN_KEY, ([], set()))
    stale = [e for e in entries if e.source in stale_sources]
    if stale:
        terminalreporter.section("stale known failures")
        for entry in stale:
            terminalreporter.write_line(f"{entry.source}: {entry.test!r} matches no test; remove or fix it")
    run_report = config.stash.get(REPORT_KEY, None)
    if run_report is not None and run_report.written:
        terminalreporter.write_line(f"conformance report: {', '.join(str(p) for p in run_report.written)}")
    if run_report is not None and run_report.plots:
        terminalreporter.write_line(f"plots: {', '.join(str(p) for p in run_report.plots)}")
    if run_report is not None and run_report.baseline_runs:
        beyond = f"beyond {100 * run_report.threshold:.0f}%"
        if run_report.regressions:
            terminalreporter.section(f"regressions against baseline ({beyond})", red=True)
            for regression in run_report.regressions:
                terminalreporter.write_line(render.describe_regression(regression))
        else:
            terminalreporter.write_line(f"baseline comparison: no regression {beyond}")
