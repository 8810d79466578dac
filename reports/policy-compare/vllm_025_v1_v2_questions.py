"""One-off probe (issue 55): the questions where vLLM 0.25's V1 and V2 runners could differ at the top of
the grid and at an off-grid max_num_seqs, each asked of vLLM's own code for both runners
(`vllm-engine-v1-policy`, `vllm-engine-policy`) and of the harness's oracle under rules `vllm-0.25/v1`
and `vllm-0.25/v2`. Run in the venv of scripts/setup_vllm_versions.sh, with vLLM 0.25 on the path:

    PYTHONPATH=DIR/vllm-0.25 DIR/venv/bin/python reports/policy-compare/vllm_025_v1_v2_questions.py \
        > reports/policy-compare/vllm-0.25-v1-vs-v2-questions.md

Writes a Markdown table (one row per question: V1's answer, V2's answer, whether the oracle agrees with
each) and exits 1 where the oracle and vLLM's code disagree.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import replace

from harness.expectations import oracle
from harness.protocol import PolicyConfig
from harness.runtime import registry

FAP = "FULL_AND_PIECEWISE"
# (what is asked, config, real tokens, uniform decode): q = 1 + num_speculative_tokens
QUESTIONS = [
    ("top of the grid, a mixed batch of 512 tokens", PolicyConfig(), 512, False),
    ("one above the top: 513 tokens", PolicyConfig(), 513, False),
    ("a decode batch of 255 requests", PolicyConfig(), 255, True),
    ("FULL: a mixed batch of 512 tokens", PolicyConfig(mode="FULL"), 512, False),
    ("q = 3: the top verify batch, 166 requests (498 tokens)", PolicyConfig(num_speculative_tokens=2), 498, True),
    ("q = 3: a verify batch of 165 requests (495 tokens)", PolicyConfig(num_speculative_tokens=2), 495, True),
    ("q = 3: a verify batch of 167 requests (501 tokens)", PolicyConfig(num_speculative_tokens=2), 501, True),
    ("q = 3: a mixed batch of 497 tokens", PolicyConfig(num_speculative_tokens=2), 497, False),
    ("q = 3: a mixed batch of 499 tokens", PolicyConfig(num_speculative_tokens=2), 499, False),
    ("q = 3: a verify batch of 10 requests (30 tokens)", PolicyConfig(num_speculative_tokens=2), 30, True),
    ("max_num_seqs 20: a decode batch of 17", PolicyConfig(max_num_seqs=20), 17, True),
    ("max_num_seqs 20: a decode batch of 20", PolicyConfig(max_num_seqs=20), 20, True),
    ("max_num_seqs 20, FULL_DECODE_ONLY: a decode batch of 20",
     PolicyConfig(max_num_seqs=20, mode="FULL_DECODE_ONLY"), 20, True),
    ("max_num_seqs 20, FULL: a decode batch of 20", PolicyConfig(max_num_seqs=20, mode="FULL"), 20, True),
    ("max_num_seqs 20, q = 3: a verify batch of 17 (51 tokens)",
     PolicyConfig(max_num_seqs=20, num_speculative_tokens=2), 51, True),
    ("max_num_seqs 20, q = 3: a verify batch of 20 (60 tokens)",
     PolicyConfig(max_num_seqs=20, num_speculative_tokens=2), 60, True),
]
SIZES = [("default", PolicyConfig()), ("q = 3", PolicyConfig(num_speculative_tokens=2)),
         ("max_num_seqs 20", PolicyConfig(max_num_seqs=20)),
         ("max_num_seqs 20, q = 3", PolicyConfig(max_num_seqs=20, num_speculative_tokens=2))]
RUNNERS = (("V1", "vllm-engine-v1-policy", "vllm-0.25/v1"), ("V2", "vllm-engine-policy", "vllm-0.25/v2"))


def shown(dispatch) -> str:
    d = dispatch.descriptor
    return f"{dispatch.runtime_mode} {d.num_padded_tokens}" + (
        f" ({d.num_padded_rows} rows)" if dispatch.runtime_mode == "FULL" else "")


def sizes_shown(sizes) -> str:
    sizes = list(sizes)
    return f"{len(sizes)} sizes, largest {sizes[-3:]}" if len(sizes) > 8 else f"{sizes}"


def main() -> int:
    warnings.simplefilter("ignore", DeprecationWarning)
    runtimes = {name: registry.resolve(name, option="--answer") for _, name, _ in RUNNERS}
    wrong = 0
    print("# vLLM 0.25: V1 and V2 runners on the same questions\n")
    print("Written by `reports/policy-compare/vllm_025_v1_v2_questions.py`: each answer is vLLM 0.25.0's own code "
          "(`vllm-engine-v1-policy`: the V1 runner's CudagraphDispatcher; `vllm-engine-policy`: the V2 runner's "
          "CudaGraphManager), on the CPU; \"oracle\" says whether `harness.expectations.oracle` under "
          "`vllm-0.25/v1` or `vllm-0.25/v2` gives the same.\n")
    print("| question | V1 | V2 | oracle |\n|---|---|---|---|")
    for what, config, tokens, uniform in QUESTIONS:
        cells, agree = [], []
        for _, name, rules in RUNNERS:
            asked = replace(config, rules=rules)
            theirs = runtimes[name].dispatch(asked, tokens, tokens // asked.query_len if uniform else None, uniform)
            ours = oracle.dispatch(asked, tokens, tokens // asked.query_len if uniform else None, uniform)
            same = (theirs.runtime_mode, theirs.descriptor.num_padded_tokens, theirs.descriptor.num_padded_rows) == \
                (ours.runtime_mode, ours.descriptor.num_padded_tokens, ours.descriptor.num_padded_rows) \
                or (theirs.runtime_mode == ours.runtime_mode == "NONE"
                    and theirs.descriptor.num_padded_tokens == ours.descriptor.num_padded_tokens)
            wrong += not same
            cells.append(shown(theirs))
            agree.append("same" if same else f"DIFFERS ({shown(ours)})")
        differ = " **differ**" if cells[0] != cells[1] else ""
        print(f"| {what}{differ} | {cells[0]} | {cells[1]} | {' / '.join(agree)} |")
    print("\n| capture sizes | V1 | V2 |\n|---|---|---|")
    for what, config in SIZES:
        cells = []
        for _, name, rules in RUNNERS:
            asked = replace(config, rules=rules)
            theirs, ours = list(runtimes[name].capture_sizes(asked)), oracle.capture_sizes(asked)
            wrong += theirs != list(ours)
            cells.append(sizes_shown(theirs) + ("" if theirs == list(ours) else " (oracle DIFFERS)"))
        print(f"| {what} | {cells[0]} | {cells[1]} |")
    print(f"\nAnswers where the oracle and vLLM's code disagree: {wrong}.")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
