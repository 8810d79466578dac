"""The pytest plugin (entry point `pytest11`): options, the runtime and graph backend chosen once
at configure time, capability skips at collection, fixtures, and the report header.

State lives in objects, never in module globals: `Conformance` (this run's choices, in the
config's stash) and the plugins registered with pytest's plugin manager,
`known_failures.KnownFailurePlugin`, `report.RunReport` and `robustness.Robustness`.
"""
from __future__ import annotations

import random
import shlex
from collections import Counter

import pytest

from harness import checks, hookspecs, supervisor
from harness.protocol import Capabilities, PolicyConfig
from harness.reliability import robustness
from harness.reports import render, report
from harness.reports.records import check_record
from harness.runtime import checkpoint as checkpoint_verdict
from harness.runtime import registry
from harness.runtime.boundary import RuntimeProxy
from harness.session import (anchor_helper, caches, device_share, header, known_failures, machine, options,
                             process_exit, scheduling)
from harness.session.hypothesis_profiles import default_profile, register_profiles
from harness.session.stash import CONFORMANCE, conformance_of
from harness.vocabulary import GRAPH_BACKENDS, PADDING_FILLS, VLLM_RELEASES, parse_rules

register_profiles()


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A plain run's tests run in a child that the pytest process watches, so a death is reported
    (harness.supervisor); None here means the session runs in this process."""
    options.validate(config)  # a usage error is the harness's, said before any process is forked
    return supervisor.supervise(config)


def pytest_addoption(parser):
    group = parser.getgroup("cudagraph-conformance")
    group.addoption("--runtime", default=registry.DEFAULT_RUNTIME,
                    help="runtime under test: a registered name, or package.module:factory (default: %(default)s)")
    group.addoption("--known-failures", action="append", default=[], metavar="PATH",
                    help="TOML file of known failures (strict xfail); the runtime's own file is read as well")
    group.addoption("--report-dir", default=None, metavar="DIR",
                    help="write the run's JSON report and Markdown summary into DIR")
    group.addoption("--no-plots", action="store_true",
                    help="with --report-dir: write the JSON report and the Markdown summary without their PNG plots "
                         "(matplotlib is not imported)")
    group.addoption("--baseline", action="append", default=[], metavar="PATH",
                    help="a run's JSON report to compare step latency and serving throughput against (may be repeated)")
    group.addoption("--regression-threshold", type=float, default=0.10, metavar="FRACTION",
                    help="worse than the baseline by more than this is a regression (default %(default)s)")
    group.addoption("--fail-on-regression", action="store_true",
                    help="exit 1 (tests failed) when there is a regression against the baseline")
    group.addoption("--graph-backend", default=None, choices=GRAPH_BACKENDS,
                    help="graph backend for the execution suites (default: cuda when a GPU is present and the "
                         "runtime offers it, else emulated)")
    group.addoption("--preset", default="tiny", metavar="NAME",
                    help="model preset of the execution suites (default %(default)s; harness/expectations/presets.py); an engine "
                         "that cannot run the tiny model's shapes runs the suites on 'small'")
    group.addoption("--bench-preset", default="small", metavar="NAME",
                    help="model preset for the benchmark lane (default %(default)s)")
    group.addoption("--only-declared", action="store_true",
                    help="deselect, not skip, the tests that do not apply to the runtime (a capability it does not "
                         "declare, a vLLM runner its release is not modelled for); the report counts them by reason")
    group.addoption("--anchor-process", default="auto", choices=("auto", "yes", "no"),
                    help="where the numerical anchor's transformers forward runs: in a helper process started as "
                         "soon as the tests are known, on the CPU, with the anchor's tests run last (yes), or in the "
                         "pytest process (no); auto: a helper where the tests run in one process on a machine with "
                         "more than two cores (never in an xdist worker; harness/session/anchor_helper.py)")
    group.addoption("--no-supervisor", action="store_true",
                    help="run the session in the pytest process itself, not in a child it forks and watches "
                         "(for a debugger that follows the first process); a process that dies then leaves no "
                         "report of which test it was running (docs/reliability.md)")
    group.addoption("--test-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="fail a test phase (setup, call, teardown) that runs longer than this; one blocked in native "
                         "code ends the process after a grace period, with its stacks and a report "
                         "(default %(default)s; 0 turns it off)")
    parser.addini("reproduce_command", default="pytest",
                  help="the command that failures' reproduction lines start with (the installed suites' ini "
                       "says cudagraph-conformance, which finds them from any directory)")


class Conformance:
    """What this run tests: the runtime, how it was named, its graph backend, the hypothesis seed."""

    def __init__(self, config, runtime, runtime_option: str):
        self.runtime = RuntimeProxy(runtime)
        self.runtime_option = runtime_option
        self.graph_backend, self.no_backend = choose_graph_backend(config.getoption("graph_backend"), runtime)
        self.hypothesis_profile = _load_hypothesis_profile(config)
        self.hypothesis_seed = config.getoption("hypothesis_seed", None)
        self.reproduce_command = config.getini("reproduce_command")
        self.anchor = None  # the anchor's helper process, where one was started (harness.session.anchor_helper)

    def reproduce(self, nodeid: str, hypothesis: bool = False) -> str:
        command = f"{self.reproduce_command} {shlex.quote(nodeid)} --runtime {shlex.quote(self.runtime_option)}"
        if self.graph_backend:  # chosen only for a runtime with execution
            command += f" --graph-backend {self.graph_backend}"
        if hypothesis and self.hypothesis_seed is not None:
            command += f" --hypothesis-seed {self.hypothesis_seed}"
        return command


def choose_graph_backend(asked: str | None, runtime) -> tuple[str | None, str | None]:
    """(backend, None) or (None, why the execution suites cannot run). Decided once per run."""
    if asked == "cuda" and not machine.cuda_available():
        raise pytest.UsageError(
            "--graph-backend cuda needs a CUDA device, and torch sees none on this machine. "
            "Leave --graph-backend out (the CPU graph emulator is chosen where there is no GPU) or pass "
            "--graph-backend emulated.")
    capabilities = runtime.capabilities
    if not capabilities.execution:
        return None, f"runtime {runtime.name!r} does not declare capability execution"
    offered = capabilities.graph_backends
    chosen = asked or ("cuda" if "cuda" in offered and machine.cuda_available() else "emulated")
    if chosen not in offered:
        return None, f"runtime {runtime.name!r} offers graph backends {offered}, not {chosen!r}"
    return chosen, None


@pytest.hookimpl(tryfirst=True)  # before hypothesis's own configure reads the seed
def pytest_configure(config):
    config.pluginmanager.register(process_exit, "cudagraph-conformance-process-exit")
    config.addinivalue_line("markers", "requires(*capabilities): skip unless the runtime declares them")
    header.keep_benchmarks_quiet(config)
    caches.place(config)  # nothing written into the directory run from (an engine's repository)
    config.addinivalue_line("markers", "vllm_runner(name): a vLLM case that holds an engine to that model runner")
    config.addinivalue_line("markers", "vllm_release(*versions): a vLLM case of an input only those releases have")
    option = config.getoption("runtime")
    try:
        runtime = registry.resolve(option, config.pluginmanager)
    except registry.RuntimeLoadError as exc:
        raise pytest.UsageError(str(exc)) from None
    if (problem := checkpoint_verdict.transformers_problem(runtime, config.getoption("preset"))) is not None:
        raise pytest.UsageError(problem)
    if config.getoption("hypothesis_seed", None) is None and not hasattr(config, "workerinput"):
        # A seed for every run, so every failure's reproduction command can name it; xdist
        # hands the controller's options, this one included, to its workers.
        config.option.hypothesis_seed = random.randrange(2**32)
    conformance = Conformance(config, runtime, option)
    config.stash[CONFORMANCE] = conformance
    config.pluginmanager.register(scheduling, "cudagraph-conformance-scheduling")
    config.pluginmanager.register(anchor_helper, "cudagraph-conformance-anchor-helper")
    config.addinivalue_line("markers", device_share.MARKER_HELP)
    share = device_share.for_worker(config, conformance.graph_backend)
    if share is not None:
        config.pluginmanager.register(share, "cudagraph-conformance-device-share")
    config.pluginmanager.register(robustness.Robustness(config, runtime), "cudagraph-conformance-robustness")
    try:
        known = known_failures.KnownFailurePlugin.from_config(config, runtime, conformance.graph_backend)
    except known_failures.KnownFailuresError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(known, "cudagraph-conformance-known-failures")
    if not hasattr(config, "workerinput"):  # the xdist controller or a plain run writes the report
        try:
            run_report = report.RunReport(config, conformance)
        except render.RunFileError as exc:
            raise pytest.UsageError(f"--baseline: {exc}") from None
        except report.ReportDirError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(run_report, report.PLUGIN_NAME)


def _load_hypothesis_profile(config) -> str:
    from hypothesis import settings

    chosen = config.getoption("hypothesis_profile", None)
    if chosen is None:
        chosen = default_profile()
        settings.load_profile(chosen)
    return chosen


def pytest_report_header(config):
    c = conformance_of(config)
    runtime = c.runtime
    return [
        f"runtime: {runtime.name} {runtime.version} ({type(runtime.wrapped).__module__})",
        f"capabilities: {runtime.capabilities.summary()}",
        *([f"runtime notes: {runtime.capabilities.notes}"] if runtime.capabilities.notes else []),
        f"graph backend: {c.graph_backend or c.no_backend}",
        f"device: {report.device_description(runtime)}",
        f"hypothesis: profile {c.hypothesis_profile}, seed {c.hypothesis_seed}",
        *header.skip_lines(config, runtime, c.graph_backend, c.no_backend),
    ]


# -- collection: the runtime in every id, tuple capabilities as parameters, skips -------------
def pytest_generate_tests(metafunc):
    c = conformance_of(metafunc.config)
    capabilities = c.runtime.capabilities
    if "runtime" in metafunc.fixturenames:  # a parameter, so its name shows in every test id
        metafunc.parametrize("runtime", [c.runtime], ids=[c.runtime.name], scope="session")
    if "padding_fill" in metafunc.fixturenames:
        metafunc.parametrize("padding_fill", [
            pytest.param(fill, marks=() if fill in capabilities.padding_fills else pytest.mark.skip(
                reason=f"runtime {c.runtime.name!r} cannot fill padded rows with {fill!r} (padding_fills)"))
            for fill in PADDING_FILLS])
    if "attention_backend" in metafunc.fixturenames:
        declared = list(capabilities.attention_backends)
        metafunc.parametrize("attention_backend", declared or [pytest.param(
            None, marks=pytest.mark.skip(reason=f"runtime {c.runtime.name!r} declares no attention_backends"))],
            ids=[name for name, _ in declared] or ["none"])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    c = conformance_of(config)
    only_declared = config.getoption("only_declared", False)
    kept, not_applicable = [], []
    for item in items:
        try:
            missing = missing_capabilities(item, c.runtime.capabilities)
        except pytest.UsageError as exc:
            if not hasattr(config, "workerinput"):
                raise
            # xdist turns a worker's usage error into an INTERNALERROR that drops the message:
            # there the test errors at setup with it instead.
            item.stash[_UNKNOWN] = str(exc)
            kept.append(item)
            continue
        reason = skip_reason(c.runtime.name, missing) if missing else vllm_rules_skip(item, c.runtime)
        if reason is not None and only_declared:
            not_applicable.append((item, reason))
            continue
        kept.append(item)
        # append=False: the first skip mark is the reason shown, and a missing capability says
        # more than a parameter's own skip (a padding fill it cannot make, say).
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason), append=False)
        elif c.no_backend and {"engines", "graph_backend"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.skip(reason=c.no_backend), append=False)
    if not_applicable:
        items[:] = kept
        config.hook.pytest_deselected(items=[item for item, _ in not_applicable])
    config.stash[report.NOT_APPLICABLE] = dict(Counter(reason for _, reason in not_applicable))
    if hasattr(config, "workerinput"):  # for the controller's report (RunReport.pytest_testnodedown)
        config.workeroutput[report.NOT_APPLICABLE_KEY] = config.stash[report.NOT_APPLICABLE]


_UNKNOWN = pytest.StashKey[str]()


def pytest_runtest_setup(item):
    message = item.stash.get(_UNKNOWN, None)
    if message is not None:
        pytest.fail(message, pytrace=False)


def skip_reason(name: str, missing: list[str]) -> str:
    absent = [m for m in missing if not m.startswith("not ")]
    present = [m[4:] for m in missing if m.startswith("not ")]
    parts = ([f"does not declare capability {', '.join(absent)}"] if absent else []) + \
            ([f"declares {', '.join(present)}"] if present else [])
    return f"runtime {name!r} " + " and ".join(parts)


def vllm_rules_skip(item, runtime) -> str | None:
    """Why a vLLM case does not apply to the runtime's declared rules: it holds an engine to a model
    runner (a PolicyConfig parameter's runner, or @pytest.mark.vllm_runner) the harness does not model
    for the runtime's rules (Capabilities.rules; harness.vocabulary.VLLM_RELEASES), or asks about
    an input other releases lack (@pytest.mark.vllm_release). None: it applies."""
    caps = runtime.capabilities
    if not caps.has("vllm_rules") or caps.vllm_release not in VLLM_RELEASES:
        return None
    for marker in item.iter_markers("vllm_release"):
        if caps.vllm_release not in marker.args:
            return (f"runtime {runtime.name!r} declares vLLM {caps.vllm_release}'s policy; this case asks about an "
                    f"input only vLLM {', '.join(marker.args)} has")
    params = getattr(getattr(item, "callspec", None), "params", {})
    # A config that names no runner is asked in one the runtime's rules follow (expected.vllm_rules).
    runners = {parse_rules(value.rules).runner for value in params.values() if isinstance(value, PolicyConfig)} - {None}
    runners |= {marker.args[0] for marker in item.iter_markers("vllm_runner")}
    modelled = caps.vllm_runners
    if runners <= set(modelled):
        return None
    return (f"runtime {runtime.name!r} declares vLLM {caps.vllm_release}'s policy, modelled here for runner(s) "
            f"{', '.join(modelled)}; this case holds an engine to runner {', '.join(sorted(runners - set(modelled)))}")


def missing_capabilities(item, capabilities: Capabilities) -> list[str]:
    missing = []
    for marker in item.iter_markers("requires"):
        for wanted in marker.args:
            negated = wanted.startswith("not ")
            name = wanted[4:].strip() if negated else wanted
            if name not in Capabilities.names():
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown capability {name!r} in @pytest.mark.requires; "
                    f"known: {', '.join(Capabilities.names())} (each may be prefixed with 'not ')")
            if capabilities.has(name) == negated:
                missing.append(wanted)
    return missing


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture
def check(request, runtime):
    """Assertions that name this suite's invariant, the runtime and the reproduction command."""
    c = conformance_of(request.config)
    invariant = getattr(request.module, "INVARIANT", request.module.__name__)
    uses_hypothesis = getattr(request.function, "is_hypothesis_test", False)
    bound = checks.Check(invariant, runtime, c.reproduce(request.node.nodeid, uses_hypothesis), request.node)
    runtime.bind(bound)
    yield bound
    runtime.bind(None)


@pytest.fixture
def record(request):
    """record(harness.reports.records.X(...)): a measurement, stored with this test in the JSON report."""
    def add(item) -> None:
        request.node.user_properties.append(("record", check_record(item)))

    return add


def _share_the_machine(config, graph_backend: str) -> None:
    """This process's share of the machine (machine.share): under xdist worker gwN takes GPU N mod
    count; on the CPU every session computes on one thread."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    machine.share(graph_backend, int(worker.lstrip("gw")) if worker else None)


@pytest.fixture(scope="session")
def graph_backend(pytestconfig):
    c = conformance_of(pytestconfig)
    if c.graph_backend is None:
        pytest.skip(c.no_backend)
    _share_the_machine(pytestconfig, c.graph_backend)
    return c.graph_backend


@pytest.fixture(scope="session")
def engine_factory(runtime, graph_backend, pytestconfig):
    from harness.runtime.factory import EngineFactory

    factory = EngineFactory(runtime, graph_backend, preset=pytestconfig.getoption("preset"),
                            anchor=conformance_of(pytestconfig).anchor)
    yield factory
    factory.close()


@pytest.fixture
def engines(engine_factory, check):
    """Engines built through the protocol and watched by the harness; what a test leaves running
    is released after it."""
    engine_factory.bind(check)
    yield engine_factory
    engine_factory.release_all()
    engine_factory.bind(None)


@pytest.fixture(scope="session")
def bench_engines(runtime, graph_backend, pytestconfig):
    """Engines for the benchmark lane: a real model in bf16 on CUDA graphs, vLLM's default grid."""
    off = header.benchmark_lane_off(pytestconfig, graph_backend)
    if off is not None:  # no GPU, or pytest-benchmark off (each test would run once, untimed, and find no timings)
        pytest.skip(off)
    from harness.runtime.factory import EngineFactory, benchmark_engine

    factory = EngineFactory(runtime, graph_backend, preset=pytestconfig.getoption("bench_preset"),
                            **benchmark_engine(runtime))
    yield factory
    factory.close()
