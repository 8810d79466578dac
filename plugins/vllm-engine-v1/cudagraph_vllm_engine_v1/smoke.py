"""The V1 smoke stage: vLLM 0.25's V1 model runner (vllm-engine-v1) built for each mode asked
(default FULL_AND_PIECEWISE and FULL_DECODE_ONLY), captured, six steps against transformers and an
eager step each (harness.smoke.drive, the kit's one smoke driver), then an ngram engine (k = 2) with verify steps of q = 3: drafts that
transformers' argmax would accept, then drafts it would reject, each step's logits against
transformers and the drafts vLLM's rejection sampler accepted. SMOKE lines as smoke.py prints them.

    python -m cudagraph_vllm_engine_v1.smoke [--modes FULL_AND_PIECEWISE,FULL_DECODE_ONLY] [--k 2]

Exit status 0 when every engine built and ran.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from cudagraph_vllm_engine import settings
from cudagraph_vllm_engine.smoke import PRESET


def main(argv=None) -> int:
    settings.apply_environment()  # before anything imports vLLM or the hub
    from harness import smoke

    return smoke.main(argv, runtime="cudagraph_vllm_engine_v1.runtime:VllmEngineV1Runtime",
                      modes=("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"), presets=(PRESET,),
                      description=__doc__.splitlines()[0],
                      arguments=lambda parser: parser.add_argument("--k", type=int, default=2), after=ngram_stage)


def ngram_stage(runtime, log, args) -> list[str]:
    """An ngram engine of k speculative tokens, its verify steps against transformers (harness.smoke.verify_steps)."""
    from harness import smoke
    from harness.expectations import presets
    from harness.expectations.anchor import Anchor

    if not args.k:
        return []
    anchor = Anchor(str(presets.checkpoint(PRESET)), device="cuda")

    def verify() -> None:
        base = smoke.engine_config(runtime, "FULL_AND_PIECEWISE", PRESET)  # as the suites make it
        config = replace(base, policy=replace(base.policy, num_speculative_tokens=args.k))
        smoke.verify_steps(runtime, anchor, config, log, f"ngram k={args.k}",
                           said=lambda engine: f"; vLLM accepted {engine.accepted}")

    return smoke.stage(log, f"ngram k={args.k}", verify)


if __name__ == "__main__":
    sys.exit(main())
