"""On a machine without CUDA: the graph runtimes say so and the execution suites skip with that
reason; their bucket policy is still checked; the eager runtime runs the execution suites."""
import json
from pathlib import Path

import pytest

pytest.importorskip("cudagraph_transformers", reason="plugins/transformers-graph is not installed")
torch = pytest.importorskip("torch")
import transformers  # noqa: E402,F401  (before any in-process session: they restore sys.modules after)

ROOT = Path(__file__).resolve().parents[3]


def run(pytester, runtime):
    """Every suite against the runtime, in this process (its imports are already paid for)."""
    report_dir = pytester.path / "report"
    result = pytester.runpytest(
        str(ROOT / "suites"), "--runtime", runtime, "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider",
        "-p", "no:xdist", "--rootdir", str(ROOT), "--benchmark-skip",
    )
    return result, json.loads((report_dir / f"conformance-{runtime}.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_graph_runtime_without_cuda_skips_execution_and_checks_its_buckets(pytester):
    result, report = run(pytester, "transformers-graph")
    assert result.ret == 0, result.stdout.str()[-3000:]
    outcomes = {t["outcome"] for t in report["tests"]}
    assert "failed" not in outcomes and "error" not in outcomes
    passed = {t["nodeid"].split("::")[0] for t in report["tests"] if t["outcome"] == "passed"}
    assert "suites/test_padding.py" in passed
    skipped = [t for t in report["tests"] if "test_replay_equivalence" in t["nodeid"]]
    assert skipped and all("execution" in t["reason"] for t in skipped)


def test_eager_runtime_runs_the_execution_suites_on_cpu(pytester):
    """Eager only: anchored to transformers, its bucket policy checked, every graph test skipped
    because each graph mode resolves to NONE (its own word: it declares no policy to ask)."""
    result, report = run(pytester, "transformers-eager")
    assert result.ret == 0, result.stdout.str()[-3000:]
    passed = {t["nodeid"].split("::")[0] for t in report["tests"] if t["outcome"] == "passed"}
    assert {"suites/test_numerical_anchor.py", "suites/test_padding.py"} <= passed
    graph_tests = [t for t in report["tests"] if "test_replay_equivalence" in t["nodeid"]]
    assert graph_tests and all(("resolves" in t["reason"] and "to NONE" in t["reason"]) or "speculative" in t["reason"]
                               for t in graph_tests)
