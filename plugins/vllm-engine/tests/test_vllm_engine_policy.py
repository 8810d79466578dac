"""The vllm-engine-policy runtime: vLLM 0.25's own policy code, answering on any machine where vLLM 0.25
imports (scripts/setup_vllm_versions.sh); skipped elsewhere (CI has no vLLM). The policy suites are
its real test (reports/vllm-engine-policy/); these check what stands in and a few answers against the
oracle's 0.25 rules (docs/spec.md section 11)."""
from dataclasses import replace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup_vllm_versions.sh)")
if not vllm.__version__.startswith("0.25"):
    pytest.skip(f"vLLM {vllm.__version__} is installed; this runtime answers with vLLM 0.25", allow_module_level=True)

from harness.expectations import oracle  # noqa: E402
from harness.protocol import PolicyConfig  # noqa: E402

from cudagraph_vllm_engine.runtime import VllmEnginePolicyRuntime  # noqa: E402


@pytest.fixture(scope="module")
def policy_runtime():
    return VllmEnginePolicyRuntime()


def test_it_declares_vllm_025s_policy_and_nothing_it_cannot_answer(policy_runtime):
    caps = policy_runtime.capabilities
    assert (caps.has("vllm_rules"), caps.vllm_release, caps.execution, caps.data_parallel) == (True, "0.25", False, False)


@pytest.mark.parametrize("config", [PolicyConfig(max_num_seqs=264), PolicyConfig(max_num_seqs=100, mode="FULL"),
                                    PolicyConfig(max_num_seqs=64, num_speculative_tokens=2),
                                    PolicyConfig(max_num_seqs=8, max_loras=2, specialize_lora=False)])
def test_answers_are_the_oracles_for_0_25(policy_runtime, config):
    config = replace(config, rules="vllm-0.25/v2")
    sizes = policy_runtime.capture_sizes(config)
    assert sizes == oracle.capture_sizes(config)
    q = config.query_len
    for tokens in range(1, sizes[-1] + 2):
        for reqs, uniform in ((tokens // q, tokens % q == 0 and tokens // q <= config.max_num_seqs),
                              (max(1, min(tokens // 2, config.max_num_seqs)), False)):
            if reqs >= 1:
                assert policy_runtime.dispatch(config, tokens, reqs, uniform) == oracle.dispatch(config, tokens, reqs, uniform)
