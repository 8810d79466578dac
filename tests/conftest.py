"""Collects the catch table (mutant -> suites that caught it) and prints it after the run; gives
each xdist worker one CPU thread; hands out the longest self-tests first."""
import functools
import platform
import re

import pytest

CATCH_TABLE = {}

# Each in-process pytest session of the self-tests (pytester) starts pytest-benchmark, which runs
# `file` for the interpreter's architecture and git (and hg) for the project's name: four
# subprocesses a session, a hundred sessions a run. The answers do not change within a process.
platform.architecture = functools.lru_cache(maxsize=None)(platform.architecture)
try:
    from pytest_benchmark import utils as _benchmark_utils

    _benchmark_utils.get_project_name = functools.lru_cache(maxsize=None)(_benchmark_utils.get_project_name)
except ImportError:
    pass


def pytest_configure(config):
    if config.getoption("numprocesses", default=None) and not hasattr(config, "workerinput"):
        return  # the xdist controller runs no test: it needs none of the imports below (~5 s)
    # Imported once, before any in-process pytest session (pytester): pytester restores sys.modules
    # after each run, so what a run imports first is imported again by the next (slow), and some of
    # it does not survive a second import in one process (numpy under matplotlib, transformers' lazy
    # modules). The suites' sessions import these; the report names the device and draws plots.
    import torch
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    try:  # what hypothesis's pytest plugin imports, with libcst, to report each failing example
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:
        pass

    import harness.expectations.anchor  # noqa: F401
    import harness.reports.plots  # noqa: F401
    import reference_runtime.adapter  # noqa: F401
    import reference_runtime.engine.runner  # noqa: F401

    # The self-tests compute in this process outside any session too; the suites' graph_backend
    # fixture gives a process one thread only in a session that asks for it. One thread here as
    # well, as machine.share gives every session on the CPU: the models are tiny.
    torch.set_num_threads(1)


@pytest.fixture
def bucket_engine_in_the_checkout(pytester, tmp_path_factory) -> dict:
    """Every suite against the bucket engine from this checkout (tests.catching.checkout_run): run once
    a test run, for the engine's own test and the packaging test's comparison with the wheel."""
    from tests import catching

    return catching.once_per_run(tmp_path_factory, "bucket-engine-checkout",
                                 lambda folder: catching.checkout_run(pytester, folder / "report"))


# The longest self-tests, in the order xdist hands them out: first. Its scheduler gives each worker
# the next test as it frees up, in collection order, so a long test collected late would run alone at
# the end. The bucket engine's checkout session leads, and the packaging test, which compares the
# wheel's run with it, follows: it builds and runs the wheel while another worker runs that session.
FIRST = (
    "tests/test_broken_example_engines.py::test_the_bucket_engine_passes_every_suite",
    "tests/test_packaging.py::test_the_installed_suites_run_from_any_directory_as_in_a_checkout",
    "tests/test_independent_engines.py::",
    "tests/test_broken_example_engines.py::test_a_grid_with_neighbouring_sizes_at_the_top",
    "tests/test_packaging.py::test_an_engine_repository_runs_its_own_runtime",
    "tests/test_example_runtime.py::test_minimal_runtime_passes_what_it_declares",
    "tests/test_hostile_processes.py::test_native_hangs_end_workers",
    "tests/test_hostile_runtimes.py::test_a_hang_in_native_code_ends_the_process",
    "plugins/transformers-graph/tests/test_transformers_cpu_behaviour.py::",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", ()):
        if key == "caught_by" and report.when == "call":
            mutant = re.search(r"\[(.*)\]$", report.nodeid).group(1)
            CATCH_TABLE[mutant] = value


def pytest_terminal_summary(terminalreporter):
    if not CATCH_TABLE:
        return
    terminalreporter.section("catch table: broken runtime -> suites that caught it")
    width = max(len(name) for name in CATCH_TABLE)
    for mutant in sorted(CATCH_TABLE):
        caught = ", ".join(CATCH_TABLE[mutant]) or "NOT CAUGHT"
        terminalreporter.write_line(f"{mutant:<{width}}  {caught}")
