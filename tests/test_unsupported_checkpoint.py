"""An engine that refuses the checkpoint gets one verdict: the tests that need the checkpoint are
skipped with one reason (one summary line, counted in the report), the rest run, and nothing fails."""
import json
from pathlib import Path

import pytest

from harness.runtime import checkpoint

ROOT = Path(__file__).resolve().parent.parent
SUITES = ["test_padding.py", "test_dispatch.py", "test_replay_equivalence.py", "test_numerical_anchor.py"]


def run(pytester, runtime: str):
    report_dir = pytester.path / "report"
    result = pytester.runpytest_subprocess(
        *[str(ROOT / "suites" / name) for name in SUITES], "--runtime", f"tests.refusing_runtimes:{runtime}",
        "--report-dir", str(report_dir), "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT), "-rs")
    name = {"RefusesTheCheckpoint": "refuses-checkpoint", "RefusesWithAPlainError": "refuses-plainly"}[runtime]
    return result, json.loads((report_dir / f"conformance-{name}.json").read_text())


def test_a_refused_checkpoint_is_one_verdict_and_the_rest_runs(pytester):
    result, report = run(pytester, "RefusesTheCheckpoint")
    output = result.stdout.str()
    assert result.ret == 0, output[-3000:]
    outcomes = [t["outcome"] for t in report["tests"]]
    assert "failed" not in outcomes and "error" not in outcomes
    verdict = [line for line in output.splitlines() if checkpoint.MARK in line]
    assert len(verdict) == 1, verdict  # one summary line, with the count
    assert "llama3 RoPE" in verdict[0]
    entry = report["checkpoint"]
    assert entry["version"] == checkpoint.version("tiny") and "llama3 RoPE" in entry["refused"]
    assert entry["not_run"] >= 20 and f"SKIPPED [{entry['not_run']}]" in verdict[0]
    policy = [t for t in report["tests"] if t["nodeid"].startswith(("suites/test_padding.py", "suites/test_dispatch.py"))
              and t["outcome"] == "passed"]
    assert policy, "the tests that need no checkpoint still run"


def test_a_plain_error_at_build_stays_a_failure_per_test(pytester):
    """The check above, shown to tell the two apart: only the protocol's exception is a verdict."""
    result, report = run(pytester, "RefusesWithAPlainError")
    assert result.ret != 0
    assert sum(t["outcome"] in ("failed", "error") for t in report["tests"]) >= 20
    assert report["checkpoint"]["refused"] is None and report["checkpoint"]["not_run"] == 0


def test_a_build_without_a_checkpoint_asks_the_engine(monkeypatch):
    monkeypatch.setattr(checkpoint, "REFUSED", {"tiny": "refused"})

    class Config:
        checkpoint, preset = None, "tiny"

    class Runtime:
        def build(self, config):
            return "engine"

    assert checkpoint.build(Runtime(), Config()) == "engine"
    Config.checkpoint = "/some/folder"
    with pytest.raises(pytest.skip.Exception, match="refused"):
        checkpoint.build(Runtime(), Config())
