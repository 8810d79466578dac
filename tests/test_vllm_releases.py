"""A runtime's declared vLLM release (Capabilities.rules "vllm-0.25", docs/spec.md section 11).

- The oracle's rules for vLLM 0.25's V2 runner, each where it departs from 0.33: no decode sizes
  appended (the off-grid max_num_seqs, n x q), a 512 cap on any device, one key search across both
  modes. (They were checked against vLLM 0.25's own code on the CPU: reports/vllm-engine-policy/.)
- A runtime that declares 0.25 and answers with 0.33's rules is caught by the spec's 0.25 values;
  its cases that hold an engine to the V1 runner, which the harness does not model for 0.25, skip
  saying so (tests/test_broken_runtimes.py has it in the catch table).
- A release the harness does not know, or 0.25 with data parallelism, is refused at load.
"""
from __future__ import annotations

import pytest

from harness.expectations import oracle
from harness.protocol import Capabilities, Descriptor, Dispatch, PolicyConfig
from harness.runtime import registry
from tests.catching import run_suites

OLD = dict(rules="vllm-0.25/v2")


@pytest.mark.parametrize("config,count,largest", [
    (PolicyConfig(max_num_seqs=264), 51, 512),  # 0.33: 52 (264 appended)
    (PolicyConfig(max_num_seqs=100), 28, 200),  # 0.33: 29 (100 appended)
    (PolicyConfig(max_num_seqs=1024, platform_max=1024), 51, 512),  # 0.33: 83, up to 1024
    (PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2), 51, 512),  # 0.33: 60
])
def test_vllm_025_appends_no_decode_sizes_and_caps_at_512(config, count, largest):
    sizes = oracle.capture_sizes(PolicyConfig(**{**config.__dict__, **OLD}))
    assert (len(sizes), sizes[-1]) == (count, largest)
    assert oracle.capture_sizes(config) != sizes  # the spec's 0.33 differs


def test_vllm_025_searches_both_modes_keys_at_once():
    q3 = PolicyConfig(max_num_seqs=64, num_speculative_tokens=2, **OLD)
    # 30 uniform tokens: PIECEWISE 32 is the smallest key that holds them (0.33 looks for FULL first: 33).
    assert oracle.dispatch(q3, 30, 10, True) == Dispatch("PIECEWISE", Descriptor(32, None, False))
    # 5 mixed tokens: the smallest key is the decode graph at 6, which takes no mixed batch: eager.
    assert oracle.dispatch(q3, 5, 2, False) == Dispatch("NONE", Descriptor(5, 2, False))
    assert oracle.dispatch(PolicyConfig(max_num_seqs=64, num_speculative_tokens=2), 5, 2, False) == Dispatch(
        "PIECEWISE", Descriptor(6, None, False))  # 0.33: 6 is a size (2 x q appended), and PIECEWISE is searched too


def test_the_data_parallel_agreement_of_vllm_025_is_not_modelled():
    with pytest.raises(ValueError, match="does not model vLLM 0.25's data-parallel agreement"):
        oracle.dp_dispatch(PolicyConfig(**OLD), [])


@pytest.mark.parametrize("capabilities,message", [
    (Capabilities(rules="vllm-0.30"), "'0.30' is not a vLLM release"),
    (Capabilities(rules="vllm-0.25/v1"), "runner\\(s\\) v2 only"),
    (Capabilities(rules="vllm"), "ENGINE-RELEASE"),
    (Capabilities(rules="vllm-0.25", data_parallel=True), "data-parallel agreement of vLLM 0.33"),
    (Capabilities(speculative_steps=True, execution=True), "speculative_steps .* needs speculative"),
])
def test_a_release_the_harness_does_not_model_is_refused_at_load(capabilities, message):
    class Runtime:
        name, version = "declares", "1"

    runtime = Runtime()
    runtime.capabilities = capabilities
    with pytest.raises(registry.RuntimeLoadError, match=message):
        registry.check(runtime, "declares")


def test_cases_for_a_runner_the_release_is_not_modelled_for_skip_saying_so(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:DeclaresVllm025AnswersVllm033", [
        "test_capture_sizes.py::test_spec_counts", "test_dispatch.py::test_v1_without_specialisation_a_batch_without_lora_has_no_graph"])
    prefix = "declares-vllm-0.25-answers-0.33"
    outcomes = {t["nodeid"].split("[", 1)[1].rstrip("]").removeprefix(prefix).lstrip("-"): (t["outcome"], t.get("reason") or "")
                for t in report["tests"]}
    assert outcomes["v1-q2-full"][0] == "skipped"
    assert "declares vLLM 0.25's policy, modelled here for runner(s) v2" in outcomes["v1-q2-full"][1]
    assert outcomes["seqs264-offgrid"][0] == "failed" and "(51, 512)" not in outcomes["seqs264-offgrid"][1]
    assert outcomes["cap32"][0] == "passed"  # where 0.25 and 0.33 agree, the spec's value holds
    assert report["capabilities"]["rules"] == "vllm-0.25"
