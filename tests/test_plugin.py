"""Self-tests of the pytest plugin: each test writes a tiny project into pytester's temp dir
and runs a real pytest session on it.

In-process runs (`runpytest`) are used where nothing depends on a fresh interpreter, for
speed (xdist runs too: the workers are fresh processes anyway); subprocess runs
(`runpytest_subprocess`) where something does: hypothesis's global settings, a hang cut by the
timeout, imports that must not leak into this process.
"""
from __future__ import annotations

import json
import textwrap

import pytest
import torch
from hypothesis import settings

USAGE_ERROR = pytest.ExitCode.USAGE_ERROR


def runtime_source(name: str = "myname", capabilities: str = "capture_sizes=True", body: str = "") -> str:
    """A module defining a minimal third-party runtime `Runtime` and its `factory`."""
    return textwrap.dedent(
        """\
        from pathlib import Path

        from harness.protocol import Capabilities


        class Runtime:
            name, version = {name!r}, "1.2"
            capabilities = Capabilities({capabilities})
        {body}

        def factory():
            return Runtime()
        """
    ).format(name=name, capabilities=capabilities, body=textwrap.indent(textwrap.dedent(body), "    "))


def use_hook_runtime(pytester, name: str = "myname", **kwargs) -> None:
    """Register a runtime through a conftest.py implementing `pytest_cudagraph_runtimes`."""
    pytester.makeconftest(
        runtime_source(name, **kwargs)
        + f"\n\ndef pytest_cudagraph_runtimes():\n    return {{{name!r}: factory}}\n"
    )


def install_entry_points(pytester, monkeypatch, **entry_points: str) -> None:
    """Make the temp dir look like an installed distribution offering `entry_points`."""
    dist = pytester.mkdir("thirdparty_runtimes-0.1.dist-info")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-runtimes\nVersion: 0.1\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (dist / "entry_points.txt").write_text("[cudagraph_conformance.runtimes]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(pytester.path))  # importlib.metadata reads sys.path afresh on every call


def write_known_failures(pytester, *entries: dict, filename: str = "known_failures.toml"):
    # json.dumps of a str or bool is valid TOML too.
    text = "".join(
        "[[failure]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items())
        for entry in entries
    )
    path = pytester.path / filename
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def keep_hypothesis_profile():
    """In-process runs load a hypothesis profile into the global settings; put the outer one back."""
    current = getattr(settings, "get_current_profile_name", None)  # absent from older hypothesis
    name = current() if current else None
    yield
    if name is not None:
        settings.load_profile(name)


# -- runtime selection ------------------------------------------------------------------------


def test_unknown_runtime_is_a_usage_error_listing_available(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--runtime", "nosuch")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*unknown runtime 'nosuch'. Available runtimes:",
        "*reference*entry point reference_runtime.adapter:ReferenceRuntime*",
        "or --runtime package.module:factory",
    ])


def test_hook_runtime_is_selected_by_name_and_shown(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile("def test_x(runtime):\n    assert runtime.name == 'myname'\n")
    result = pytester.runpytest("--runtime", "myname", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "runtime: myname 1.2 (conftest)",
        "capabilities: capture_sizes",
        "*test_x[[]myname[]] PASSED*",
    ])


def test_entry_point_runtime_is_listed_and_selectable(pytester, monkeypatch):
    pytester.makepyfile(thirdparty_rt=runtime_source("thirdparty"))
    install_entry_points(pytester, monkeypatch, thirdparty="thirdparty_rt:factory")
    pytester.makepyfile("def test_x(runtime):\n    assert runtime.name == 'thirdparty'\n")

    listed = pytester.runpytest("--runtime", "nosuch")
    assert listed.ret == USAGE_ERROR
    listed.stderr.fnmatch_lines(["*thirdparty*entry point thirdparty_rt:factory*"])

    selected = pytester.runpytest("--runtime", "thirdparty", "-v")
    assert selected.ret == 0
    selected.stdout.fnmatch_lines(["runtime: thirdparty 1.2 (thirdparty_rt)", "*test_x[[]thirdparty[]] PASSED*"])


def test_entry_point_runtime_that_fails_to_import_is_reported(pytester, monkeypatch):
    pytester.makepyfile(broken_rt="raise ImportError('libengine.so: cannot open shared object file')")
    install_entry_points(pytester, monkeypatch, broken="broken_rt:factory")
    pytester.makepyfile("def test_x(): pass")

    listed = pytester.runpytest("--runtime", "nosuch")
    assert listed.ret == USAGE_ERROR
    listed.stderr.fnmatch_lines(["*broken*failed to import: ImportError: libengine.so*", "*reference*"])

    selected = pytester.runpytest("--runtime", "broken")
    assert selected.ret == USAGE_ERROR
    selected.stderr.fnmatch_lines(["*runtime 'broken' (entry point broken_rt:factory) failed to import: ImportError: libengine.so*"])


def test_module_colon_factory_runtime(pytester):
    pytester.makepyfile(my_rt=runtime_source("fromspec"))
    pytester.syspathinsert()
    pytester.makepyfile("def test_x(runtime):\n    assert runtime.name == 'fromspec'\n")
    result = pytester.runpytest("--runtime", "my_rt:factory", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["runtime: fromspec 1.2 (my_rt)", "*test_x[[]fromspec[]] PASSED*"])


@pytest.mark.parametrize("raised,shown,traceback", [
    ("RuntimeUnavailable('needs a GPU; run it on one')", "cannot start here: needs a GPU; run it on one", False),
    ("ModuleNotFoundError(\"No module named 'someengine'\")", "cannot start here: No module named 'someengine'", False),
    ("KeyError('a bug')", "failed to start: KeyError", True),
], ids=["refusal", "missing-package", "bug"])
def test_a_factory_that_refuses_says_why_and_a_bug_shows_its_traceback(pytester, raised, shown, traceback):
    pytester.syspathinsert()
    pytester.makepyfile(refusing=f"from harness.protocol import RuntimeUnavailable\n\n\ndef factory():\n    raise {raised}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--runtime", "refusing:factory", "-p", "no:xdist")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{shown}*"])
    assert ("Traceback" in result.stderr.str()) == traceback


def test_a_usage_error_under_the_supervisor_is_reported_once_as_such(pytester, monkeypatch):
    """A supervised run (a subprocess of its own, as from the command line) whose configuration
    fails: the child's message and pytest's usage-error status, not a report of a process that died."""
    pytester.makepyfile("def test_x(): pass")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # a run of its own, not one inside this test
    result = pytester.runpytest_subprocess("--runtime", "nosuch.module:factory", "-p", "no:xdist")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines(["*--runtime nosuch.module:factory*failed to import*"])
    assert "the test process ended" not in result.stdout.str() + result.stderr.str()


def test_module_colon_factory_that_fails_to_import_is_a_usage_error(pytester):
    pytester.makepyfile(bad_rt="raise ImportError('no CUDA driver')")
    pytester.syspathinsert()
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--runtime", "bad_rt:factory")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines(["*module 'bad_rt' failed to import: ImportError: no CUDA driver*"])


# -- capabilities -----------------------------------------------------------------------------


def test_missing_capability_skips_naming_runtime_and_capability(pytester):
    use_hook_runtime(pytester, capabilities="capture_sizes=True")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires("capture_sizes")
        def test_declared(runtime):
            pass

        @pytest.mark.requires("execution")
        def test_needs_execution(runtime):
            raise AssertionError("must not run")

        @pytest.mark.requires("execution")
        def test_fills(runtime, padding_fill):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--runtime", "myname", "-rs")
    result.assert_outcomes(passed=1, skipped=5)
    # The missing capability is the reason, not the fills the runtime cannot make.
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]]*runtime 'myname' does not declare capability execution",
                                 "SKIPPED [[]4[]]*runtime 'myname' does not declare capability execution"])


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_only_declared_deselects_what_does_not_apply_and_the_report_counts_it(pytester, workers):
    use_hook_runtime(pytester, capabilities="capture_sizes=True")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires("capture_sizes")
        @pytest.mark.parametrize("b", range(3))
        def test_declared(runtime, b):
            pass

        @pytest.mark.requires("execution")
        @pytest.mark.parametrize("b", range(2))
        def test_needs_execution(runtime, b):
            raise AssertionError("must not run")

        @pytest.mark.requires("lora", "speculative")
        def test_needs_two(runtime):
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("--runtime", "myname", "--only-declared", "--report-dir", "out", *workers)
    result.assert_outcomes(passed=3)
    data = json.loads((pytester.path / "out" / "conformance-myname.json").read_text())
    assert data["collected"] == 3 and data["summary"] == {"passed": 3}
    assert data["not_applicable"] == {"runtime 'myname' does not declare capability execution": 2,
                                      "runtime 'myname' does not declare capability lora, speculative": 1}
    summary = (pytester.path / "out" / "conformance-myname.md").read_text()
    assert "ran 3 of the 3 collected tests (100%" in summary
    assert "deselected (--only-declared): 2 tests: runtime 'myname' does not declare capability execution" in summary


def test_a_second_in_process_session_runs_in_this_process_too(pytester):
    """The first inner session takes PYTEST_CURRENT_TEST away when it ends; the second must still know
    it is nested and not fork a supervisor (whose child would go on running the outer session)."""
    use_hook_runtime(pytester)
    pytester.makepyfile("def test_x(runtime):\n    pass\n")
    for _ in range(2):
        result = pytester.runpytest("--runtime", "myname", "-p", "no:xdist")
        result.assert_outcomes(passed=1)


def test_unknown_capability_is_a_usage_error(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires("teleport")
        def test_x(runtime):
            pass
        """
    )
    result = pytester.runpytest("--runtime", "myname")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x*unknown capability 'teleport'*known: capture_sizes*"])


# -- known failures ---------------------------------------------------------------------------

KNOWN_FAILURE_TESTS = """
def test_broken(runtime):
    raise AssertionError("padded row wrote slot 0")

def test_fixed(runtime):
    pass
"""


def test_known_failure_becomes_strict_xfail(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(pytester, {
        "test": "test_kf.py::test_broken*", "category": "notyet", "reason": "slot 0 is written; engine#123",
    })
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path), "-rx")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL*test_broken*known failure [[]notyet[]] slot 0 is written; engine#123*"])


def test_known_failure_that_passes_fails_as_strict_xpass(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(pytester, {
        "test": "test_kf.py::test_fixed[myname]", "category": "notimpl", "reason": "no LoRA yet",
    })
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*XPASS(strict)*no LoRA yet*",
        "*This test now passes: remove its entry 'test_kf.py::test_fixed[[]myname[]]' from *known_failures.toml*",
    ])


def test_a_non_strict_entry_lets_its_test_pass_and_still_bounds_a_failure(pytester):
    """strict = false: a failure that depends on what ran before it; a pass is xpassed, not a failure,
    and a failure outside the bound is still one."""
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(
        pytester,
        {"test": "test_kf.py::test_fixed[myname]", "category": "notyet", "reason": "order-dependent",
         "strict": False, "match": "elements differ"},
        {"test": "test_kf.py::test_broken[myname]", "category": "notyet", "reason": "order-dependent",
         "strict": False, "match": "elements differ"},
    )
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(xpassed=1, failed=1)
    result.stdout.fnmatch_lines(["*Not covered by known failure *failure #2*: its text does not match 'elements differ'*"])


@pytest.mark.parametrize("entry,message", [
    ({"strict": "no"}, "strict must be true or false"),
    ({"strict": False}, "strict = false needs a bound"),
])
def test_a_non_strict_entry_must_be_a_bool_and_bounded(pytester, entry, message):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(pytester, {"test": "test_kf.py::test_broken*", "category": "notyet",
                                           "reason": "order-dependent", **entry})
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_entry_matching_no_collected_test_is_reported_stale(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(
        pytester,
        {"test": "test_kf.py::test_broken*", "category": "notyet", "reason": "wrong"},
        {"test": "test_kf.py::test_renamed*", "category": "never", "reason": "gone"},
        {"test": "test_elsewhere.py::test_y", "category": "never", "reason": "file not collected"},
    )
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*stale known failures*", "*failure #2: 'test_kf.py::test_renamed*' matches no test*"])
    result.stdout.no_fnmatch_line("*test_elsewhere*matches no test*")


def test_run_of_selected_node_ids_reports_no_stale_entries(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(pytester, {"test": "test_kf.py::test_broken*", "category": "notyet", "reason": "r"})
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path), "test_kf.py::test_fixed")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*stale known failures*")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"test": "test_kf.py::*", "category": "wontfix", "reason": "r"}, "*failure #1 has category 'wontfix'*"),
        ({"test": "test_kf.py::*", "category": "never"}, "*failure #1 is missing ['reason']*"),
    ],
    ids=["bad-category", "missing-reason"],
)
def test_invalid_known_failure_entry_is_a_usage_error(pytester, entry, message):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(pytester, entry)
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines([message.replace("[", "[[]")])


def test_runtime_owned_known_failures_are_loaded_without_the_option(pytester):
    body = 'known_failures = Path(__file__).with_name("engine_known_failures.toml")'
    use_hook_runtime(pytester, body=body)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    write_known_failures(
        pytester, {"test": "test_kf.py::test_broken*", "category": "never", "reason": "by design"},
        filename="engine_known_failures.toml",
    )
    result = pytester.runpytest("--runtime", "myname", "-rx")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL*test_broken*known failure [[]never[]] by design*"])


# -- report -----------------------------------------------------------------------------------


def test_report_dir_gets_json_and_markdown(pytester, monkeypatch):
    use_hook_runtime(pytester)
    pytester.makepyfile(
        """
        import pytest

        def test_ok(runtime):
            pass

        def test_raises(runtime):
            raise RuntimeError("engine exploded")

        def test_skipped(runtime):
            pytest.skip("no GPU here")

        @pytest.mark.xfail(reason="known bad", strict=True)
        def test_expected_failure(runtime):
            raise AssertionError("rows moved by 7e-05")
        """
    )
    # A subprocess: whatever the report imports (torch, for the device line) must not be imported
    # here and then dropped again by an in-process run's sys.modules snapshot.
    result = pytester.runpytest_subprocess("--runtime", "myname", "--report-dir", "out")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["conformance report: *conformance-myname.json, *conformance-myname.md"])

    data = json.loads((pytester.path / "out" / "conformance-myname.json").read_text())
    assert (data["runtime"], data["version"], data["complete"]) == ("myname", "1.2", True)
    assert data["capabilities"]["capture_sizes"] is True and data["device"]
    assert data["summary"] == {"passed": 1, "failed": 1, "skipped": 1, "xfailed": 1}
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    assert {name: t["outcome"] for name, t in tests.items()} == {
        "test_ok[myname]": "passed", "test_raises[myname]": "failed",
        "test_skipped[myname]": "skipped", "test_expected_failure[myname]": "xfailed",
    }
    assert "RuntimeError: engine exploded" in tests["test_raises[myname]"]["reason"]
    assert "no GPU here" in tests["test_skipped[myname]"]["reason"]
    # An xfail keeps what it stands for and the failure it covered (the finding's figures, run by run).
    assert tests["test_expected_failure[myname]"]["reason"].startswith("known bad")
    assert "rows moved by 7e-05" in tests["test_expected_failure[myname]"]["reason"]
    markdown = (pytester.path / "out" / "conformance-myname.md").read_text()
    assert markdown.startswith("# Conformance report: myname 1.2")
    assert "### test_report_dir_gets_json_and_markdown.py::test_raises[myname]" in markdown


# -- hypothesis profile -----------------------------------------------------------------------


@pytest.mark.parametrize("args, profile", [([], "dev"), (["--hypothesis-profile", "ci"], "ci")], ids=["default", "ci"])
def test_hypothesis_profile_and_seed_in_header(pytester, monkeypatch, args, profile):
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == 0
    result.stdout.re_match_lines([rf"hypothesis: profile {profile}, seed \d+$"])


SEEDED = """
from hypothesis import given, strategies as st
from harness.checks import Check

SEEN = []

@given(n=st.integers(0, 10**9))
def test_draws(check, n):
    SEEN.append(n)
    if len(SEEN) == 5:
        print("DRAWN", SEEN)
    check.that(n >= 0, what="never fails")

def test_fails(check):
    check.that(False, what="always fails")
"""


def test_every_run_has_a_seed_that_reproduces_it_and_failures_name_it(pytester, monkeypatch):
    # Under CI, the harder case: there hypothesis derandomizes by default, and the seed must still
    # decide what is drawn (elsewhere hypothesis's default already lets it).
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_seeded=SEEDED)
    unseeded = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    seed = next(line for line in unseeded.outlines if line.startswith("hypothesis:")).rsplit(" ", 1)[1]
    unseeded.stdout.fnmatch_lines(["*reproduce: pytest 'test_seeded.py::test_fails*' --runtime reference*"])
    again = pytester.runpytest_subprocess("-s", "--hypothesis-seed", seed, "-p", "no:cacheprovider")
    other = pytester.runpytest_subprocess("-s", "--hypothesis-seed", str(int(seed) + 1), "-p", "no:cacheprovider")
    assert drawn_examples(unseeded) and drawn_examples(again) == drawn_examples(unseeded) != drawn_examples(other)


def drawn_examples(result) -> list[str]:
    return [line[line.index("DRAWN"):] for line in result.outlines if "DRAWN" in line]


# -- xdist ------------------------------------------------------------------------------------


def test_xdist_workers_resolve_the_runtime_and_one_report_is_written(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("b", range(6))
        def test_x(runtime, b):
            assert runtime.name == "myname"
        """
    )
    result = pytester.runpytest("--runtime", "myname", "-n", "2", "--report-dir", "out")
    result.assert_outcomes(passed=6)
    assert sum("conformance report:" in line for line in result.outlines) == 1
    data = json.loads((pytester.path / "out" / "conformance-myname.json").read_text())
    assert data["complete"] is True and data["summary"] == {"passed": 6}
    assert len(data["tests"]) == 6 and data["collected"] == 6 and data["not_applicable"] == {}
    assert sorted(p.name for p in (pytester.path / "out").iterdir()) == ["conformance-myname.json", "conformance-myname.md"]


def test_xdist_keeps_a_file_of_shared_process_resources_on_one_worker(pytester):
    """harness.session.scheduling.ONE_WORKER_PER_FILE: the data-parallel suite's tests share one rank pool
    per process, so they run on one worker; other tests still spread over both."""
    use_hook_runtime(pytester)
    record = """
        import os, pytest

        @pytest.mark.parametrize("b", range(NUMBER))
        def test_x(runtime, b):
            with open(os.path.join(os.path.dirname(__file__), "..", "workers.txt"), "a") as f:
                f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    """
    pytester.mkdir("suites")
    pytester.makepyfile(**{"suites/test_data_parallel_execution": record.replace("NUMBER", "6"),
                           "suites/test_other": record.replace("NUMBER", "40")})
    result = pytester.runpytest("--runtime", "myname", "-n", "2")
    result.assert_outcomes(passed=46)
    workers: dict[str, set] = {}
    for line in (pytester.path / "workers.txt").read_text().splitlines():
        module, worker = line.split()
        workers.setdefault(module.rsplit(".", 1)[-1], set()).add(worker)
    assert len(workers["test_data_parallel_execution"]) == 1, workers
    assert len(workers["test_other"]) == 2, workers


@pytest.mark.parametrize("args, reason", [
    ([], None),
    (["--benchmark-disable"], "--benchmark-disable: pytest-benchmark times nothing"),
    (["-n", "2"], "pytest-benchmark cannot time tests under xdist"),
], ids=["timed", "benchmark-disable", "xdist"])
def test_the_benchmark_lane_skips_where_pytest_benchmark_times_nothing(pytester, monkeypatch, args, reason):
    """Under xdist or --benchmark-disable, pytest-benchmark runs a benchmarked function once and keeps
    no timings: every test of the lane is skipped (plugin.bench_engines), with the reason the header
    gives (harness.session.header.benchmark_lane_off), not left to fail reading timings that are not
    there. The session says it is on CUDA here (a conftest's graph_backend), so that the lane's own
    fixture decides; timed, the fixture gives its engines (built only when a test asks)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test's own worker: the session is not one
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(scope="session")
        def graph_backend():
            return "cuda"
        """
    )
    pytester.makepyfile(
        """
        def test_lane(bench_engines):
            assert bench_engines is not None
        """
    )
    result = pytester.runpytest("--runtime", "reference", "-rs", *(args if "-n" in args else ["-p", "no:xdist", *args]))
    if reason is None:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        assert any(reason in line for line in result.outlines), result.outlines[-10:]


def test_xdist_reports_stale_entries_from_the_whole_collection(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=KNOWN_FAILURE_TESTS)
    path = write_known_failures(
        pytester,
        {"test": "test_kf.py::test_broken*", "category": "notyet", "reason": "deselected, not stale"},
        {"test": "test_kf.py::test_renamed*", "category": "never", "reason": "gone"},
    )
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path), "-n", "2", "-k", "fixed")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*stale known failures*", "*failure #2: 'test_kf.py::test_renamed*' matches no test*"])
    result.stdout.no_fnmatch_line("*failure #1*matches no test*")


def test_xdist_unknown_capability_errors_with_its_message(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile("import pytest\n\n@pytest.mark.requires('teleport')\ndef test_x(runtime):\n    pass\n")
    result = pytester.runpytest("--runtime", "myname", "-n", "2")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_x[[]myname[]]: unknown capability 'teleport'*"])


def test_a_hanging_test_times_out_and_the_run_goes_on(pytester):
    pytester.makepyfile(test_hang="""
        import time
        def test_hangs():
            time.sleep(30)
        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("--test-timeout", "0.5", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*TimeoutError: test ran past --test-timeout=0.5 s*"])


# -- known failures: literal ids, bounds, coverage ------------------------------------------------

BOUNDED_TESTS = """
import pytest
from harness.checks import Check

@pytest.mark.parametrize("case", ["a-FULL", "b-FULL"])
def test_numbers(check, case):
    check.note_difference(1e-7 if case.startswith("a") else 0.5)
    check.that(False, what="logits differ by rounding")

def test_other(check):
    raise KeyError("a different bug")
"""


def test_a_parametrised_id_in_a_pattern_is_literal(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=BOUNDED_TESTS)
    path = write_known_failures(pytester, {
        "test": "test_kf.py::test_numbers[myname-a-*]", "category": "notyet", "reason": "rounding"})
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(failed=2, xfailed=1)


def test_bounds_cover_only_the_failures_they_describe(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=BOUNDED_TESTS)
    path = write_known_failures(
        pytester,
        {"test": "test_kf.py::test_numbers[*]", "category": "notyet", "reason": "Inductor rounding",
         "max_difference": 1e-6, "match": "differ by rounding"},
        {"test": "test_kf.py::test_other*", "category": "notyet", "reason": "known crash", "raises": "ValueError"},
    )
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(failed=2, xfailed=1)
    for line in ("*Not covered by known failure *failure #1*: the largest difference 0.5 is above the entry's "
                 "max_difference 1e-06*", "*Not covered by known failure *failure #2*: it raised KeyError, the entry "
                 "allows ValueError*", "*1 covered by *failure #1* Inductor rounding*"):
        result.stdout.fnmatch_lines([line])


def test_a_difference_bound_never_covers_a_value_that_became_nan(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_nan="""
        import torch

        def test_rounding(check):
            check.same_bits(torch.tensor([1.0, 2.000001]), torch.tensor([1.0, 2.0]), what="logits", source="a test")

        def test_nan(check):
            check.same_bits(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, -0.13]), what="logits", source="a test")
    """)
    path = write_known_failures(pytester, {"test": "test_nan.py::test_*", "category": "notyet", "reason": "rounding",
                                           "max_difference": 1e-6})
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*got nan, expected -0.1299*largest difference inf*"])
    result.stdout.fnmatch_lines(["*Not covered by known failure *failure #1*: the largest difference inf*"])


def test_a_stale_pattern_says_its_likely_cause(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=BOUNDED_TESTS)
    path = write_known_failures(
        pytester, {"test": "test_kf.py::test_numbers[[]myname-a-FULL[]]", "category": "notyet", "reason": "old"},
        {"test": "test_kf.py::test_numbers[a-FULL]", "category": "notyet", "reason": "no runtime name"})
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path))
    result.stdout.fnmatch_lines(["*failure #1*matches no test; it uses fnmatch's escapes*",
                                 "*failure #2*matches no test; the part in brackets must equal the test id's "
                                 "parameters, runtime name first*"])


@pytest.mark.parametrize("entry, message", [
    ({"test": "x", "category": "never", "reason": "r", "max_difference": -1}, "*max_difference must be a number >= 0*"),
    ({"test": "x", "category": "never", "reason": "r", "match": "("}, "*match '(' is not a regular expression*"),
    ({"test": "x", "category": "never", "reason": "r", "bound": 1}, "*unknown keys ['bound']*"),
], ids=["negative-difference", "bad-regex", "unknown-key"])
def test_invalid_bounds_are_usage_errors(pytester, entry, message):
    use_hook_runtime(pytester)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(write_known_failures(pytester, entry)))
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines([message.replace("[", "[[]")])


# -- usage errors and readable failures ------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_graph_backend_cuda_without_cuda_is_one_usage_error(pytester):
    pytester.makepyfile("def test_x(): pass\ndef test_y(): pass")
    result = pytester.runpytest("--graph-backend", "cuda")
    assert result.ret == USAGE_ERROR
    result.stderr.fnmatch_lines(["*--graph-backend cuda needs a CUDA device*--graph-backend emulated*"])


def test_a_session_on_the_cpu_computes_on_one_thread_outside_xdist_too(pytester):
    """machine.share: the emulator's small matrices gain nothing from a thread on every core, which
    would only spin (reports/cpu/2026-12-03-speed-7/experiments.txt): in a session of one process as in
    each xdist worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as torch starts on a machine of two cores or more (this worker computes on one)
    try:
        pytester.makepyfile("import torch\n\ndef test_threads(graph_backend):\n    assert torch.get_num_threads() == 1\n")
        result = pytester.runpytest("--runtime", "reference", "--graph-backend", "emulated", "-p", "no:xdist")
    finally:
        torch.set_num_threads(threads)
    result.assert_outcomes(passed=1)


def test_long_values_are_cut_to_a_window_around_the_first_difference(pytester):
    pytester.makepyfile("""
        def test_long(check):
            expected = list(range(300))
            actual = expected[:150] + [-1] + expected[151:]
            check.equal(actual, expected, what="padded sizes", source="a test")
    """)
    result = pytester.runpytest()
    result.stdout.fnmatch_lines([
        "*expected: [[]... 142 before, 142, 143, *, 150, *, 158, ... 141 after[]] (length 300, from index 142)*",
        "*actual:   [[]... 142 before, 142, *, -1, *, 158, ... 141 after[]] (length 300, from index 142)*",
        "*first difference: at index 150: expected 150, got -1*",
    ])
    assert len(result.stdout.str()) < 6000


def test_a_failure_is_covered_by_any_matching_entry_whose_bounds_describe_it(pytester):
    use_hook_runtime(pytester)
    pytester.makepyfile(test_kf=BOUNDED_TESTS)
    path = write_known_failures(
        pytester,
        {"test": "test_kf.py::test_numbers[*]", "category": "notyet", "reason": "rounding", "max_difference": 1e-6},
        {"test": "test_kf.py::test_*", "category": "notyet", "reason": "the whole file is broken", "match": "differ by rounding"},
    )
    result = pytester.runpytest("--runtime", "myname", "--known-failures", str(path), "-rx")
    result.assert_outcomes(failed=1, xfailed=2)  # test_other raises KeyError: neither entry's bounds cover it
    result.stdout.fnmatch_lines(["*XFAIL*b-FULL*the whole file is broken*"])
