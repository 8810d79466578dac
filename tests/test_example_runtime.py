"""The minimal runtime of the authoring guide passes the suites it declares and skips the rest."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_minimal_runtime_passes_what_it_declares(pytester):
    assert len((ROOT / "examples" / "minimal_runtime.py").read_text().splitlines()) < 100
    report_dir = pytester.path / "report"
    result = pytester.runpytest_subprocess(
        str(ROOT / "suites"), "--runtime", "examples.minimal_runtime:MinimalRuntime", "--report-dir",
        str(report_dir), "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
    )
    report = json.loads((report_dir / "conformance-minimal.json").read_text())
    outcomes = {t["outcome"] for t in report["tests"]}
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert outcomes == {"passed", "skipped"}
    passed = {t["nodeid"].split("::")[0] for t in report["tests"] if t["outcome"] == "passed"}
    assert passed == {"suites/test_capture_sizes.py", "suites/test_padding.py"}
    reasons = {t.get("reason", "") for t in report["tests"] if t["outcome"] == "skipped"}
    assert all("runtime 'minimal'" in reason for reason in reasons)
    assert any("vllm_policy" in reason for reason in reasons) and any("execution" in reason for reason in reasons)
