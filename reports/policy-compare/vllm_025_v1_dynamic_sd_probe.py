"""One-off probe (issue 55): vLLM 0.25.0's V1 runner under dynamic speculative decoding, its own
config code beside the oracle's `dynamic_sd_mode`.

A VllmConfig is made for each config mode with a draft of k = 3 (ngram under V1, EAGLE under V2,
which takes no ngram) and a schedule of speculative tokens by batch size (`num_speculative_tokens_per_batch_size`), under the V1 runner and under V2;
the mode it keeps is vLLM's answer (config/vllm.py `_maybe_override_dynamic_sd_cudagraph_mode`).
Run in the venv of scripts/setup_vllm_versions.sh, with vLLM 0.25 and this repository on the path:

    PYTHONPATH=DIR/vllm-0.25:.:plugins/vllm-engine DIR/venv/bin/python reports/policy-compare/vllm_025_v1_dynamic_sd_probe.py

Prints one line per mode and runner and exits 1 on any disagreement.
"""
from __future__ import annotations

import os
import sys

from harness.expectations import oracle
from harness.protocol import PolicyConfig
from harness.vocabulary import CONFIG_MODES

SCHEDULE = [(1, 8, 3), (9, 64, 1)]


def main() -> int:
    from cudagraph_vllm_engine.policy import POLICY_MODEL
    from cudagraph_vllm_engine.settings import apply_environment
    from cudagraph_vllm_engine.without_gpu import stand_in_for_an_h200

    apply_environment()
    stand_in_for_an_h200()
    wrong = 0
    for runner in ("v1", "v2"):
        for mode in CONFIG_MODES:
            theirs = vllm_mode_at(POLICY_MODEL, mode, runner)
            ours = oracle.dynamic_sd_mode(PolicyConfig(mode=mode, num_speculative_tokens=3, rules=f"vllm-0.25/{runner}"))
            wrong += theirs != ours
            print(f"{runner} {mode}: vLLM keeps {theirs}, the oracle {ours}" + ("" if theirs == ours else "  DISAGREE"))
    return 1 if wrong else 0


def vllm_mode_at(model_dir, mode: str, runner: str) -> str:
    from cudagraph_vllm_engine import settings
    from cudagraph_vllm_engine.v1_policy import v1_args

    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    config = PolicyConfig(max_num_seqs=64, num_speculative_tokens=3, mode=mode)
    # V2 takes no ngram draft: an EAGLE draft of the same config, as the V2 policy asks (policy.py).
    args = settings.engine_args(model_dir, config, draft=model_dir) if runner == "v2" else v1_args(model_dir, config)
    args.speculative_config = {**args.speculative_config, "num_speculative_tokens_per_batch_size": SCHEDULE}
    config = settings.create_vllm_config(args)
    assert config.use_v2_model_runner == (runner == "v2"), "vLLM chose another runner"
    return config.compilation_config.cudagraph_mode.name


if __name__ == "__main__":
    sys.exit(main())
