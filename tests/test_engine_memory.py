"""What an engine leaves allocated after its test (docs/reliability.md): engines built for one test
alone are closed in its teardown, what they still hold is measured, up to the runtime's declared
`memory_kept_per_build` per build is not the test's leak, and anything more (or memory kept per
step) fails the test that built them, never a later one.

On the CPU, with a stand-in CUDA allocator: a weak set of CPU tensors is what is allocated (as in
test_hostile_runtimes.py), in this process, which gets back what the stand-in replaced; on a GPU
also with real CUDA memory and CUDA graphs, in a subprocess.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import harness.expectations.anchor as anchor
from tests.test_hostile_runtimes import PLUGIN, STAND_IN_REPLACES, importable_from_anywhere, putting_back  # noqa: F401

RUNTIMES = '''
import os
import weakref
from dataclasses import replace

import torch

import harness.reliability.robustness
from reference_runtime.adapter import ReferenceRuntime, runner_config
from reference_runtime.engine.runner import ModelRunner

ON_CUDA = os.environ.get("MEMORY_TEST_DEVICE") == "cuda"
live = weakref.WeakSet()  # the stand-in allocator: what is allocated is what is alive
if not ON_CUDA:
    torch.cuda.is_initialized = lambda: True
    torch.cuda.is_available = lambda: False  # no device behind it, on a GPU machine too (the report header asks)
    torch.cuda.device_count = lambda: 1
    torch.cuda.memory_allocated = lambda device=None: sum(t.numel() for t in live)
    torch.cuda.get_rng_state_all = lambda: []
    torch.cuda.empty_cache = lambda: None
    harness.reliability.robustness.cuda_probe = lambda: None
MiB = 1 << 20
LIBRARY = []  # what an engine's library keeps process-wide


def allocate():
    tensor = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda" if ON_CUDA else "cpu")
    live.add(tensor)
    return tensor


class Engine(ModelRunner):
    keeps_per_step = False

    def step(self, requests, padding_fill=None):
        if self.keeps_per_step:
            LIBRARY.append(allocate())
        return super().step(requests, padding_fill)


class KeepsPerBuild(ReferenceRuntime):
    """Its library keeps 64 MiB per engine that close() cannot release, and it says so."""

    name = "keeps-per-build"
    capabilities = replace(ReferenceRuntime.capabilities, memory_kept_per_build=64 * MiB)
    engine = Engine

    def build(self, config):
        LIBRARY.append(allocate())
        return self.engine(runner_config(config))


class KeepsPerBuildUndeclared(KeepsPerBuild):
    """Keeps 64 MiB per engine and declares nothing."""

    name = "keeps-per-build-undeclared"
    capabilities = ReferenceRuntime.capabilities


class StepEngine(Engine):
    keeps_per_step = True


class KeepsPerStep(KeepsPerBuild):
    """Declares 64 MiB per build, and keeps 64 MiB more on every step."""

    name = "keeps-per-step"
    engine = StepEngine


class ClosingEngine(Engine):
    def __init__(self, config):
        super().__init__(config)
        self.held = allocate()
        LIBRARY.append(self.held)  # a process-wide cache that holds it until close()

    def close(self):
        LIBRARY.remove(self.held)


class ClosesWhatItHolds(ReferenceRuntime):
    """Not broken: its library holds 64 MiB per engine until close() releases it; declares nothing."""

    name = "closes-what-it-holds"
    engine = ClosingEngine

    def build(self, config):
        return self.engine(runner_config(config))
'''

TESTS = '''
from harness.protocol import PolicyConfig, Request


def test_a_fresh_engine_of_two_steps(engines):
    engine = engines.get(mode="NONE", capture=False, fresh=True)
    rid = engines.new_id()
    engine.step([Request(rid, (1, 2, 3), 0)])
    engine.step([Request(rid, (4,), 3)])


def test_a_later_test(runtime):
    runtime.capture_sizes(PolicyConfig())
'''


DEVICES = ["stand-in", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                    reason="needs a CUDA device"))]


def run_memory(pytester, monkeypatch, runtime: str, device: str = "stand-in",
               tests: str = TESTS) -> tuple[dict[str, dict], dict]:
    """({test name: its JSON entry}, the JSON report) of `tests` against one of RUNTIMES, with the
    stand-in allocator (in this process, its replacements put back after the session: a fresh
    interpreter's imports cost seconds a session) or on a GPU with CUDA graphs (in a subprocess,
    whose CUDA memory is its own)."""
    pytester.makepyfile(memory_runtimes=RUNTIMES, test_inner=tests)
    pytester.makeconftest("import memory_runtimes  # noqa: F401 (the stand-in allocator, before any test)\n")
    monkeypatch.setenv("MEMORY_TEST_DEVICE", device)
    args = (*PLUGIN, "--runtime", f"memory_runtimes:{runtime}", "--report-dir", "out", "-p", "no:cacheprovider",
            "-p", "no:xdist")
    if device == "cuda":
        result = pytester.runpytest_subprocess(*args, "--graph-backend", "cuda")
    else:
        with putting_back([*STAND_IN_REPLACES, (anchor, "Anchor")]):  # ANCHOR_TESTS replaces the anchor too
            result = pytester.runpytest(*args)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    (report,) = (pytester.path / "out").glob("conformance-*.json")
    data = json.loads(report.read_text())
    return {entry["nodeid"].split("::")[1].split("[")[0]: entry for entry in data["tests"]}, data


def outcomes(tests: dict) -> dict[str, str]:
    return {name: entry["outcome"] for name, entry in tests.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_what_a_runtime_declares_it_keeps_per_build_is_not_a_leak(pytester, monkeypatch, device):
    tests, data = run_memory(pytester, monkeypatch, "KeepsPerBuild", device)
    assert outcomes(tests)["test_a_fresh_engine_of_two_steps"] == "passed", tests
    assert outcomes(tests)["test_a_later_test"] == "passed", tests
    assert data["capabilities"]["memory_kept_per_build"] == 64 << 20


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mutant,leaked", [("KeepsPerBuildUndeclared", 64), ("KeepsPerStep", 128)],
                         ids=["KeepsPerBuildUndeclared", "KeepsPerStep"])
def test_memory_kept_beyond_the_declaration_fails_the_test_that_built_the_engine(pytester, monkeypatch, record_property,
                                                                                  mutant, leaked, device):
    tests, _ = run_memory(pytester, monkeypatch, mutant, device)
    assert outcomes(tests) == {"test_a_fresh_engine_of_two_steps": "error", "test_a_later_test": "passed"}, tests
    reason = tests["test_a_fresh_engine_of_two_steps"]["reason"]
    found = re.search(r"CUDA memory allocated: ([0-9.]+) MiB more than before the test", reason)
    assert found and leaked <= float(found.group(1)) < leaked + 40, reason  # a GPU may add a cuBLAS workspace
    record_property("caught_by", ["isolation: memory kept beyond memory_kept_per_build"])


@pytest.mark.parametrize("device", DEVICES)
def test_an_engine_that_releases_its_memory_in_close_leaves_nothing(pytester, monkeypatch, device):
    tests, _ = run_memory(pytester, monkeypatch, "ClosesWhatItHolds", device)
    assert outcomes(tests)["test_a_fresh_engine_of_two_steps"] == "passed", tests


def test_a_negative_declaration_is_refused():
    from harness.protocol import Capabilities
    from harness.runtime import registry

    class Runtime:
        name, version = "negative", "1"
        capabilities = Capabilities(memory_kept_per_build=-1)

    with pytest.raises(registry.RuntimeLoadError, match="memory_kept_per_build=-1"):
        registry.check(Runtime(), "negative")


ANCHOR_TESTS = '''
import harness.expectations.anchor as anchor_module
import memory_runtimes


class StandInAnchor:
    """transformers' model for the anchor, as 64 MiB of the stand-in allocator."""

    def __init__(self, checkpoint, device="cpu"):
        self.weights = memory_runtimes.allocate()


anchor_module.Anchor = StandInAnchor


def test_the_first_to_ask_for_the_anchor(engines):
    engines.anchor()


def test_asks_again(engines):
    assert engines.anchor() is engines.anchor()


def test_asks_for_the_anchor_and_leaks(engines):
    engines.anchor()
    memory_runtimes.LIBRARY.append(memory_runtimes.allocate())
'''


def test_the_anchor_is_the_harness_memory_and_hides_no_leak(pytester, monkeypatch):
    """transformers' model for the anchor is loaded once a session (EngineFactory.anchor), whichever
    test asks first, and its memory is the harness's; a test that leaks beside it still fails."""
    tests, _ = run_memory(pytester, monkeypatch, "ClosesWhatItHolds", tests=ANCHOR_TESTS)
    assert outcomes(tests) == {"test_the_first_to_ask_for_the_anchor": "passed", "test_asks_again": "passed",
                               "test_asks_for_the_anchor_and_leaks": "error"}, tests
    assert "64.0 MiB more than before the test" in tests["test_asks_for_the_anchor_and_leaks"]["reason"]


LAST_TEST_CACHES = '''
def test_the_last_test_caches_an_engine(engines):
    engines.get(mode="NONE", capture=False)  # kept for later tests; the session's end closes it in this teardown
'''


def test_an_engine_the_last_test_cached_is_not_its_leak(pytester, monkeypatch):
    """The session's end closes the cached engines in the last test's teardown: the engine that test
    cached is the factory's memory still (its runtime holds 64 MiB per engine until close())."""
    tests, _ = run_memory(pytester, monkeypatch, "ClosesWhatItHolds", tests=LAST_TEST_CACHES)
    assert outcomes(tests) == {"test_the_last_test_caches_an_engine": "passed"}, tests
