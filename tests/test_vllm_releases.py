"""A runtime's declared vLLM release (Capabilities.rules "vllm-0.25", docs/spec.md section 11).

- The oracle's rules for vLLM 0.25's V2 runner, each where it departs from 0.33: no decode sizes
  appended (the off-grid max_num_seqs, n x q), a 512 cap on any device, one key search across both
  modes. (They were checked against vLLM 0.25's own code on the CPU: reports/vllm-engine-policy/.)
- Its V1 runner: 0.25's sizes rounded to whole requests, keyed and dispatched as 0.33's V1 does, and
  no FULL graphs under dynamic speculative decoding (checked against vLLM 0.25's own dispatcher:
  reports/policy-compare/vllm-0.25-v1-vs-oracle.md).
- A runtime that declares 0.25 and answers with 0.33's rules is caught by the spec's 0.25 values,
  and one that declares 0.25's V1 runner and answers with 0.33's V1 rules or 0.25's V2 rules by its
  V1 values; a case that holds an engine to a runner the runtime's rules do not follow skips saying
  so (tests/test_broken_runtimes.py has them in the catch table).
- A release or runner the harness does not know, or 0.25 with data parallelism, is refused at load.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from harness.expectations import expected, oracle
from harness.protocol import Capabilities, Descriptor, Dispatch, PolicyConfig
from harness.runtime import registry
from tests.catching import run_suites

OLD = dict(rules="vllm-0.25/v2")
OLD_V1 = dict(rules="vllm-0.25/v1")


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


@pytest.mark.parametrize("q,count,largest,count_033,largest_033", [
    (2, 50, 512, 50, 512),  # the grid's odd sizes 1 rounded to 2: one size fewer than V2's 51
    (3, 49, 498, 56, 504),  # 1 and 2 become 3, 512 becomes 513 (over the cap); 0.33 appends n x 3 first
    (4, 49, 512, 49, 512),
])
def test_vllm_025_v1_rounds_its_own_grid_to_whole_requests(q, count, largest, count_033, largest_033):
    config = PolicyConfig(max_num_seqs=256, num_speculative_tokens=q - 1, **OLD_V1)
    sizes = oracle.capture_sizes(config)
    assert (len(sizes), sizes[-1]) == (count, largest) and all(s % q == 0 for s in sizes)
    newer = oracle.capture_sizes(PolicyConfig(max_num_seqs=256, num_speculative_tokens=q - 1, rules="vllm-0.33/v1"))
    assert (len(newer), newer[-1]) == (count_033, largest_033)


def test_vllm_025_v1_dispatches_as_033s_v1_over_its_own_sizes():
    seqs264 = PolicyConfig(max_num_seqs=264, **OLD_V1)
    # 264 is no size: 264 decode requests pad to 272, above the 264 tokens V1's decode keys reach.
    assert oracle.dispatch(seqs264, 264, 264, True) == Dispatch("PIECEWISE", Descriptor(272, None, False))
    assert oracle.dispatch(replace(seqs264, rules="vllm-0.33/v1"), 264, 264, True) == Dispatch(
        "FULL", Descriptor(264, 264, True))
    q3 = PolicyConfig(max_num_seqs=64, num_speculative_tokens=2, **OLD_V1)
    # V1 searches FULL's exact key first, over sizes rounded to 3: 30 uniform tokens replay FULL 33
    # (0.25's V2 meets PIECEWISE 32 first), and an eager step is keyed by its size alone.
    assert oracle.dispatch(q3, 30, 10, True) == Dispatch("FULL", Descriptor(33, 11, True))
    assert oracle.dispatch(replace(q3, mode="FULL_DECODE_ONLY"), 5, 2, False) == Dispatch("NONE", Descriptor(5))


def test_vllm_025_v1_has_no_full_graphs_under_dynamic_speculative_decoding():
    lens = oracle.speculative_decode_query_lens([(1, 8, 3), (9, 64, 1)])
    v1 = PolicyConfig(max_num_seqs=64, num_speculative_tokens=3, **OLD_V1)
    assert oracle.dynamic_sd_mode(v1) == "PIECEWISE" and oracle.dynamic_sd_mode(replace(v1, **OLD)) == v1.mode
    keys = oracle.graph_keys(v1, lens)
    assert not keys["FULL"] and keys["PIECEWISE"] == oracle.graph_keys(replace(v1, mode="PIECEWISE"))["PIECEWISE"]
    assert oracle.dispatch(v1, 8, 2, True, decode_query_lens=lens).runtime_mode == "PIECEWISE"
    with pytest.raises(ValueError, match="modelled for vLLM 0.25's V1 runner and the V2 runner only"):
        oracle.dispatch(replace(v1, rules="vllm-0.33/v1"), 8, 2, True, decode_query_lens=lens)


def test_the_data_parallel_agreement_of_vllm_025_is_not_modelled():
    with pytest.raises(ValueError, match="does not model vLLM 0.25's data-parallel agreement"):
        oracle.dp_dispatch(PolicyConfig(**OLD), [])


@pytest.mark.parametrize("capabilities,message", [
    (Capabilities(rules="vllm-0.30"), "'0.30' is not a vLLM release"),
    (Capabilities(rules="vllm-0.25/v3"), "runner\\(s\\) v2, v1 only"),
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


def test_cases_for_a_runner_the_rules_do_not_follow_skip_saying_so(pytester):
    report = run_suites(pytester, "tests.broken_runtimes:DeclaresVllm025V1AnswersVllm033V1", [
        "test_capture_sizes.py::test_spec_counts", "test_dispatch.py::test_v2_without_specialisation_a_batch_without_lora_keeps_its_graph"])
    prefix = "declares-vllm-0.25-v1-answers-0.33"
    outcomes = {t["nodeid"].split("[", 1)[1].rstrip("]").removeprefix(prefix).lstrip("-"): (t["outcome"], t.get("reason") or "")
                for t in report["tests"]}
    for skipped in ("v2-q2-full", ""):  # a case naming V2, and a test marked for V2
        assert outcomes[skipped][0] == "skipped"
        assert "declares vLLM 0.25's policy, modelled here for runner(s) v1" in outcomes[skipped][1]
    assert outcomes["v1-q3-full"][0] == "failed" and "(49, 498)" not in outcomes["v1-q3-full"][1]
    assert outcomes["v1-q2-full"][0] == "passed"  # where 0.25's V1 and 0.33's agree, the spec's value holds
    assert outcomes["seqs264-offgrid"][0] == "failed"  # a case naming no runner is asked in V1
    assert report["capabilities"]["rules"] == "vllm-0.25/v1"


def test_a_runtime_declaring_025_without_a_runner_is_asked_in_both():
    caps = Capabilities(rules="vllm-0.25")
    assert caps.vllm_runners == ("v2", "v1")
    runtime = type("Declares", (), {"capabilities": caps})()
    assert expected.vllm_rules(runtime, PolicyConfig()).rules == "vllm-0.25/v2"  # the default runner stays V2's
    assert expected.vllm_rules(runtime, PolicyConfig(rules="vllm-0.33/v1")).rules == "vllm-0.25/v1"
    assert expected.by_release(runtime, "0.33", {"0.25": "V2", "0.25/v1": "V1"},
                               expected.vllm_rules(runtime, PolicyConfig(rules="vllm-0.33/v1"))) == "V1"
    assert expected.by_release(runtime, "0.33", {"0.25": "V2", "0.25/v1": "V1"}, PolicyConfig(**OLD)) == "V2"
    assert expected.by_release(runtime, "0.33", {"0.25": "both"}, PolicyConfig(**OLD_V1)) == "both"
