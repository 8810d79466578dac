"""vLLM's, SGLang's and LMDeploy's own unit tests of their CUDA-graph policy, run against the policy
calculator and the plugins' restatements (tests/peer_tests/, docs/spec.md section 12).

- Every translated case of vLLM 0.25's and 0.33's tests agrees with the calculator for its release;
  every translated case of SGLang 0.5.23's and LMDeploy 0.18.0's with the plugin's policy.
- The data is well formed: every case translated (with a question the runner knows) or not
  modelled with a reason; a release holds only files that release has.
- A calculator (or a plugin restatement) that gets one fact wrong is caught by the engine tests named for it
  (tests/broken_calculators.py).
- The committed report (reports/peer-tests/) is what the data renders to now.
"""
from __future__ import annotations

import pytest

from tests import broken_calculators
from tests.peer_tests import cases
from tests.peer_tests.calculators import CALCULATORS

TRANSLATED = [pytest.param(release, case, id=cases.case_id(peer, case))
              for release in cases.RELEASES for peer in cases.load(release) for case in peer.cases
              if case["status"] == "translated"]


@pytest.mark.parametrize("release,case", TRANSLATED)
def test_translated_case_agrees_with_vllm(release, case):
    disagreements = cases.check(CALCULATORS[release](), case)
    assert not disagreements, (f"{cases.ENGINES[release][0]} {release} ({case['test']}) and the calculator disagree:\n  "
                               + "\n  ".join(disagreements))


@pytest.mark.parametrize("release", cases.RELEASES)
def test_every_case_is_translated_or_says_why_not(release):
    peers = cases.load(release)
    assert peers, f"no peer data for {release}"
    for peer in peers:
        names = [case["test"] for case in peer.cases]
        assert len(names) == len(set(names)), f"{peer.path.name}: a test listed twice"
        for case in peer.cases:
            where = f"{peer.path.name}: {case['test']}"
            assert case["status"] in cases.STATUSES, where
            if case["status"] == "not_modelled":
                assert len(case.get("reason", "")) > 20, f"{where}: not modelled without a reason"
            else:
                assert case["question"] in cases.QUESTIONS, f"{where}: unknown question {case['question']!r}"


def test_the_checker_reports_a_disagreement_in_one_line_each():
    case = {"test": "made up", "status": "translated", "question": "sizes",
            "config": {"max_num_seqs": 8}, "expect": {"max": 17, "contains": [3]}}
    assert cases.check(CALCULATORS["0.33"](), case) == [
        "max capture size: vLLM 17, calculator 16", "capture sizes lack 3, which vLLM captures"]


@pytest.mark.parametrize("broken", list(broken_calculators.CATCHES), ids=lambda b: b.__name__)
def test_a_broken_calculator_is_caught_by_the_engine_tests_named_for_it(broken):
    named = broken_calculators.CATCHES[broken]
    caught = set()
    release = getattr(broken, "peer_release", "0.33")
    for peer in cases.load(release):
        for case in peer.cases:
            name = case["test"].split("[", 1)[0].split("::")[-1]
            if case["status"] == "translated" and name in named and cases.check(broken(), case):
                caught.add(name)
    missing = [name for name in named if name not in caught]
    assert not missing, f"{broken.__name__} passes {cases.ENGINES[release][0]}'s {missing}"


def test_the_committed_report_is_a_fresh_render():
    from pathlib import Path

    from tests.peer_tests import report

    results = report.run()
    folder = Path(__file__).resolve().parents[1] / "reports" / "peer-tests"
    fix = "run `python scripts/peer_tests_report.py` and commit reports/peer-tests/"
    assert (folder / "peer-tests.md").read_text() == report.render_markdown(results), fix
    assert (folder / "peer-tests.json").read_text() == report.render_json(results), fix
