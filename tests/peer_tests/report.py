"""The peer-test report: per vLLM release and test file, cases translated, passing and not
modelled (with reasons). Rendered from a run of every case (scripts/peer_tests_report.py writes
reports/peer-tests/; tests/test_peer_tests.py checks the committed copy is a fresh render)."""
from __future__ import annotations

import json

from . import cases
from .calculators import CALCULATORS


def run() -> dict:
    """{release: [{vllm_file, translated, passing, failing: [test], not_modelled: [{test, reason}]}]}."""
    results = {}
    for release in cases.RELEASES:
        rows = []
        for peer in cases.load(release):
            translated = [case for case in peer.cases if case["status"] == "translated"]
            failing = [case["test"] for case in translated if cases.check(CALCULATORS[release](), case)]
            rows.append({"vllm_file": peer.vllm_file, "translated": len(translated),
                         "passing": len(translated) - len(failing), "failing": failing,
                         "not_modelled": [{"test": case["test"], "reason": case["reason"]}
                                          for case in peer.cases if case["status"] == "not_modelled"]})
        results[release] = rows
    return results


def render_json(results: dict) -> str:
    return json.dumps(results, indent=1) + "\n"


def render_markdown(results: dict) -> str:
    lines = ["# vLLM's own tests of its CUDA-graph policy, run against the calculator", "",
             "Each vLLM unit test that checks a fact of the graph policy, translated case by case from the",
             "release's source distribution (`tests/peer_tests/vllm-<release>/`, one file per vLLM test file),",
             "and run against the calculator for that release (docs/spec.md section 12). A case is one test,",
             "or one parameter or assert group of it. Rendered by `python scripts/peer_tests_report.py`.", ""]
    for release, rows in results.items():
        total = {k: sum(row[k] for row in rows) for k in ("translated", "passing")}
        skipped = sum(len(row["not_modelled"]) for row in rows)
        lines += [f"## vLLM {release}", "",
                  f"{total['passing']} of {total['translated']} translated cases pass; {skipped} not modelled.", "",
                  "| vLLM test file | translated | passing | not modelled |", "|---|---|---|---|"]
        lines += [f"| `{row['vllm_file']}` | {row['translated']} | {row['passing']} | {len(row['not_modelled'])} |"
                  for row in rows]
        failing = [(row["vllm_file"], test) for row in rows for test in row["failing"]]
        if failing:
            lines += ["", "Failing:", ""] + [f"- `{file}::{test}`" for file, test in failing]
        lines += ["", "Not modelled:", ""]
        lines += [f"- `{row['vllm_file']}::{item['test']}`: {item['reason']}" for row in rows for item in row["not_modelled"]]
        lines.append("")
    return "\n".join(lines)
