"""The minimal runtime of the authoring guide passes every suite it declares, execution included,
and skips the rest with a reason that names the capability it lacks."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"


def test_minimal_runtime_passes_what_it_declares(pytester):
    assert len((ROOT / "examples" / "minimal_runtime.py").read_text().splitlines()) <= 170
    report_dir = pytester.path / "report"
    result = pytester.runpytest(
        str(SUITES), "--runtime", "examples.minimal_runtime:MinimalRuntime", "--report-dir", str(report_dir),
        "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT))
    report = json.loads((report_dir / "conformance-minimal.json").read_text())
    outcomes = {t["outcome"] for t in report["tests"]}
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert outcomes == {"passed", "skipped"}
    passed = {t["nodeid"].split("::")[0] for t in report["tests"] if t["outcome"] == "passed"}
    assert passed == {f"suites/test_{name}.py" for name in (
        "capture_sizes", "padding", "dispatch", "capture_accounting", "capture_side_effects", "fallback",
        "launch_overhead", "padding_isolation", "replay_equivalence", "static_addresses", "batch_invariance",
        "context_end")}
    reasons = {t.get("reason", "") for t in report["tests"] if t["outcome"] == "skipped"}
    assert all("runtime 'minimal'" in reason or "benchmarks need CUDA" in reason for reason in reasons), reasons
    for capability in ("vllm_rules", "loads_checkpoint", "kv_inspection", "attention_backends"):
        assert any(capability in reason for reason in reasons), capability
