"""The peer-test report: per engine release and test file, cases translated, passing and not
modelled (with reasons). Rendered from a run of every case (scripts/peer_tests_report.py writes
reports/peer-tests/; tests/test_peer_tests.py checks the committed copy is a fresh render)."""
from __future__ import annotations

import json

from . import cases
from .calculators import CALCULATORS

# What answers each release's cases, and what was searched where an engine's tree has no test of a fact.
ANSWERED_BY = {
    "0.33": "the policy calculator (`reference_runtime.policy`)",
    "0.25": "the calculator's 0.25 resolution and the harness's oracle for sizes, keys and dispatch",
    "sglang-0.5.23": "the sglang-policy plugin's restatement of SGLang's runner rules "
                     "(`cudagraph_sglang_policy.runtime`: `_prefill`, `_decode`, `_capture_bs`)",
    "lmdeploy-0.18.0": "the lmdeploy-engine plugin's policy (`cudagraph_lmdeploy_engine/policy.py`)",
}
SEARCHED = {
    "sglang-0.5.23": [
        "SGLang's decode batch-size and prefill-bucket lists (`generate_decode_cuda_graph_batch_sizes`, "
        "`generate_prefill_cuda_graph_batch_sizes`) are SGLang's own code, which the plugin calls; its tree's tests "
        "of the runner rules the plugin restates were looked for by the names they call (`can_run_graph`, "
        "`can_replay_locally`, `_pad_to_bucket`, `get_batch_sizes_to_capture`) under `test/registered/unit/`.",
        "A test of `get_batch_sizes_to_capture`'s clamp to the request pool (`test_base_cuda_graph_runner.py`) was "
        "found only in a fork (wangyao-i/sglang), not in sgl-project/sglang's tree: not translated.",
        "`runner/test_decode_cuda_graph_runner.py` tests capture-trace profiling and "
        "`runner/test_decode_cuda_graph_widths.py` DeepSeek-V4's attention widths: no fact the plugin models.",
    ],
    "lmdeploy-0.18.0": [
        "LMDeploy has no unit test of its default capture list (`_get_capture_batch_size_impl`): `git grep` of "
        "`tests/` for `capture_batch_size`, `_get_capture_tokens` and `cudagraph_capture` finds only the two files "
        "in the table (and a stub in `tests/pytorch/spec_decode/test_spec_agent.py`), so the default list has no case.",
    ],
}


def run() -> dict:
    """{release: [{file, translated, passing, failing: [test], not_modelled: [{test, reason}], source}]}."""
    results = {}
    for release in cases.RELEASES:
        rows = []
        for peer in cases.load(release):
            translated = [case for case in peer.cases if case["status"] == "translated"]
            failing = [case["test"] for case in translated if cases.check(CALCULATORS[release](), case)]
            rows.append({"file": peer.file, "translated": len(translated),
                         "passing": len(translated) - len(failing), "failing": failing,
                         "not_modelled": [{"test": case["test"], "reason": case["reason"]}
                                          for case in peer.cases if case["status"] == "not_modelled"],
                         "source": peer.source})
        results[release] = rows
    return results


def render_json(results: dict) -> str:
    return json.dumps(results, indent=1) + "\n"


def render_markdown(results: dict) -> str:
    lines = ["# vLLM's, SGLang's and LMDeploy's own tests of their CUDA-graph policy, run against ours", "",
             "Each engine unit test that checks a fact of the graph policy we model, translated case by case",
             "from the release's source (`tests/peer_tests/<release>/`, one file per test file; vLLM's from its",
             "source distributions, SGLang's and LMDeploy's as each file's source line says) and run against",
             "what models that release (docs/spec.md section 12). A case is one test, or one parameter or assert",
             "group of it. Rendered by `python scripts/peer_tests_report.py`.", ""]
    for release, rows in results.items():
        engine, version, _ = cases.ENGINES[release]
        total = {k: sum(row[k] for row in rows) for k in ("translated", "passing")}
        skipped = sum(len(row["not_modelled"]) for row in rows)
        lines += [f"## {engine} {version}", "", f"Answered by {ANSWERED_BY[release]}.", "",
                  f"{total['passing']} of {total['translated']} translated cases pass; {skipped} not modelled.", "",
                  f"| {engine} test file | translated | passing | not modelled |", "|---|---|---|---|"]
        lines += [f"| `{row['file']}` | {row['translated']} | {row['passing']} | {len(row['not_modelled'])} |"
                  for row in rows]
        sources = [(row["file"], row["source"]) for row in rows if row["source"]]
        if sources:
            lines += ["", "Read from:", ""] + [f"- `{file}`: {source}" for file, source in sources]
        if release in SEARCHED:
            lines += ["", "Searched:", ""] + [f"- {line}" for line in SEARCHED[release]]
        failing = [(row["file"], test) for row in rows for test in row["failing"]]
        if failing:
            lines += ["", "Failing:", ""] + [f"- `{file}::{test}`" for file, test in failing]
        lines += ["", "Not modelled:", ""]
        lines += [f"- `{row['file']}::{item['test']}`: {item['reason']}" for row in rows for item in row["not_modelled"]]
        lines.append("")
    return "\n".join(lines)
