"""A capability added since the release an engine was written for, and gating tests it ran then,
is announced once with the number of tests and since when, and recorded in the report."""
import json
from pathlib import Path

from harness.protocol import Capabilities
from harness.session import coverage

ROOT = Path(__file__).resolve().parent.parent


def test_every_gate_names_a_declared_capability_and_a_release():
    for gate in coverage.GATES:
        assert gate.capability in Capabilities.names() and all(c in Capabilities.names() for c in gate.before)
        assert f"`{gate.capability}`" in (ROOT / "CHANGELOG.md").read_text()


def test_only_an_engine_that_ran_them_before_is_told():
    tests = [{"outcome": "skipped", "reason": "runtime 'x' does not declare capability speculative_steps"},
             {"outcome": "skipped", "reason": "runtime 'x': it does not declare speculative_steps"},
             {"outcome": "skipped", "reason": "runtime 'x' does not declare capability kv_inspection"},
             {"outcome": "passed", "reason": ""}]
    before = Capabilities(execution=True, speculative=True)
    assert [(c["capability"], c["since"], c["tests"]) for c in coverage.changes(before, tests)] == [
        ("speculative_steps", "0.2.0", 2)]
    assert coverage.changes(Capabilities(execution=True), tests) == []  # never ran them
    assert coverage.changes(Capabilities(execution=True, speculative=True, speculative_steps=True), tests) == []


def test_the_run_says_it_once_and_the_report_records_it(pytester):
    """The reference engine as a 0.1.0 engine that declared speculative but not speculative_steps."""
    pytester.makepyfile(old_engine="""
from dataclasses import replace
from reference_runtime.adapter import ReferenceRuntime

class Declared010(ReferenceRuntime):
    name = "declared-0-1-0"
    def __init__(self):
        super().__init__()
        self.capabilities = replace(self.capabilities, speculative_steps=False)
""")
    report_dir = pytester.path / "report"
    result = pytester.runpytest_subprocess(
        str(ROOT / "suites" / "test_replay_equivalence.py"), "--runtime", "old_engine:Declared010",
        "--report-dir", str(report_dir), "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
        "-k", "q_tokens or speculative or verify")
    lines = [line for line in result.stdout.lines if line.startswith("coverage changed:")]
    assert len(lines) == 1, result.stdout.str()[-3000:]
    report = json.loads((report_dir / "conformance-declared-0-1-0.json").read_text())
    (change,) = report["coverage_changes"]
    assert change["capability"] == "speculative_steps" and change["since"] == "0.2.0" and change["tests"] >= 1
    assert f"coverage changed: {change['tests']} tests" in lines[0]
