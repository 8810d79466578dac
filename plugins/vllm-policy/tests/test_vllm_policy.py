"""The vllm-policy runtime against the installed vLLM. Skipped where vLLM cannot be imported.

Run with `python -m pytest plugins/vllm-policy/tests` after `bash scripts/setup_vllm_policy.sh`.
"""
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("vllm.config", reason="vLLM is not installed (bash scripts/setup_vllm_policy.sh)")

from harness.session.known_failures import load  # noqa: E402
from harness.protocol import PolicyConfig, RankBatch, ResolveRequest  # noqa: E402

from cudagraph_vllm_policy.runtime import KNOWN_FAILURES, VllmPolicyRuntime  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
POLICY_SUITES = ["test_capture_sizes.py", "test_padding.py", "test_dispatch.py", "test_mode_resolution.py",
                 "test_data_parallel.py"]
INTERMITTENT: set[str] = set()  # none since the oracle follows vLLM on filtered-out user sizes and DP eager sizes


@pytest.fixture(scope="module")
def vllm_runtime():
    return VllmPolicyRuntime()


def test_registered_through_the_entry_point():
    entry = {ep.name: ep for ep in metadata.entry_points(group="cudagraph_conformance.runtimes")}["vllm-policy"]
    assert entry.load() is VllmPolicyRuntime


def test_sizes_come_from_vllm_on_both_platform_maxima(vllm_runtime):
    import vllm

    assert vllm.__version__ in vllm_runtime.version
    sizes = vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=256))
    assert (len(sizes), sizes[-1]) == (51, 512)
    assert vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=1024, platform_max=1024))[-1] == 1024


def test_the_device_stand_in_ends_with_each_question(vllm_runtime):
    from vllm.platforms import current_platform

    before = type(current_platform)
    vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, platform_max=1024))
    vllm_runtime.resolve_mode(ResolveRequest("FULL", "UNIFORM_BATCH"))
    assert type(current_platform) is before


def test_downgrades_carry_vllm_warnings_and_rejections_are_value_errors(vllm_runtime):
    result = vllm_runtime.resolve_mode(ResolveRequest("FULL", "UNIFORM_BATCH"))
    assert result.resolved == "FULL_AND_PIECEWISE"
    assert any("setting cudagraph_mode=FULL_AND_PIECEWISE" in w for w in result.warnings)
    with pytest.raises(ValueError, match="PIECEWISE"):
        vllm_runtime.resolve_mode(ResolveRequest("FULL", "NEVER"))
    with pytest.raises(ValueError, match="at least one element"):
        vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, capture_sizes=()))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_data_parallel_ranks_agree_through_vllm(vllm_runtime, runner):
    config = PolicyConfig(max_num_seqs=64, rules=f"vllm-0.33/{runner}")
    agreed = vllm_runtime.dp_dispatch(config, [RankBatch(5, 5, True), RankBatch(20, 3, False)])
    assert {(d.runtime_mode, d.descriptor.num_padded_tokens) for d in agreed} == {("PIECEWISE", 24)}
    eager = vllm_runtime.dp_dispatch(config, [RankBatch(3, 3, True), RankBatch(200, 10, False)])
    # V1 ranks keep their own padded size on eager (3 -> 4); V2 ranks their unpadded one.
    assert [d.descriptor.num_padded_tokens for d in eager] == ([4, 200] if runner == "v1" else [3, 200])


def test_each_runner_is_answered_by_its_own_vllm_code(vllm_runtime):
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    v1 = PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2, rules="vllm-0.33/v1")
    v2 = PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2, rules="vllm-0.33/v2")
    assert isinstance(vllm_runtime._dispatcher(v1), CudagraphDispatcher)
    assert isinstance(vllm_runtime._dispatcher(v2), CudaGraphManager)
    assert len(vllm_runtime.capture_sizes(v1)) == 56  # V1 rounds the sizes to multiples of q = 3
    assert len(vllm_runtime.capture_sizes(v2)) == 60  # V2 keeps them and rounds its decode keys
    assert vllm_runtime.dispatch(v1, 7, 3, False).descriptor.num_padded_tokens == 9
    assert vllm_runtime.dispatch(v2, 7, 3, False).descriptor.num_padded_tokens == 8


def test_the_runner_switch_ends_with_each_question(vllm_runtime):
    before = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, rules="vllm-0.33/v1"))
    vllm_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, rules="vllm-0.33/v2"))
    assert os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == before


def test_known_failures_file_is_valid():
    assert load(KNOWN_FAILURES)


def test_policy_suites_pass_or_fail_as_known(tmp_path):
    """The five policy suites (both runners) in a fresh hypothesis database: every known failure
    xfails, none is stale, and nothing else fails except the intermittent property tests."""
    report_dir = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *(str(ROOT / "suites" / s) for s in POLICY_SUITES), "--runtime",
         "vllm-policy", "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", str(ROOT)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
    )
    report = json.loads((report_dir / "conformance-vllm-policy.json").read_text())
    outcomes = {t["nodeid"]: t["outcome"] for t in report["tests"]}
    failed = {n for n, outcome in outcomes.items() if outcome == "failed"}
    assert failed <= INTERMITTENT, sorted(failed)
    # An error (a test that left the process changed, say) is no known failure either.
    errors = {n: o for n, o in outcomes.items() if o not in ("passed", "failed", "xfailed", "skipped")}
    assert not errors and result.returncode == (1 if failed else 0), (errors, result.stdout[-3000:])
    assert sum(outcome == "xfailed" for outcome in outcomes.values()) >= 9  # the INFO-logged downgrades
    assert "stale known failures" not in result.stdout, result.stdout[-3000:]
