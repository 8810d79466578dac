"""An engine written against the previous release's documented API (tests/frozen_plugin, 0.1.0)
runs every suite at HEAD: it passes what it declares, and the only complaints are deprecations,
each naming where its import went."""
import json
from pathlib import Path

from harness import moved

ROOT = Path(__file__).resolve().parent.parent
FROZEN = ROOT / "tests" / "frozen_plugin" / "frozen_runtime.py"


def test_the_frozen_plugin_is_the_0_1_0_example_and_uses_a_moved_path():
    source = FROZEN.read_text()
    assert "from harness import presets\n" in source  # 0.1.0's path: the shim must keep it working
    assert "harness.presets" in moved.MOVED


def test_a_plugin_written_for_0_1_0_passes_at_head_with_deprecations_only(pytester):
    report_dir = pytester.path / "report"
    result = pytester.runpytest_subprocess(
        str(ROOT / "suites"), "--runtime", "tests.frozen_plugin.frozen_runtime:MinimalRuntime",
        "--report-dir", str(report_dir), "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
        "-W", "error::DeprecationWarning:harness", "-W", "error::FutureWarning")
    output = result.stdout.str()
    assert result.ret == 0, output[-3000:]
    report = json.loads((report_dir / "conformance-minimal.json").read_text())
    assert {t["outcome"] for t in report["tests"]} == {"passed", "skipped"}
    assert sum(t["outcome"] == "passed" for t in report["tests"]) >= 50
    # Told once, in the header, where the old import went (Python hides the warning itself).
    assert output.count("deprecated: harness.presets moved to harness.expectations.presets in harness 0.2.0") == 1
    warned = [line for line in output.splitlines() if "Warning:" in line]
    assert all("DeprecationWarning" in line or "frozen_runtime.py" in line for line in warned), warned
