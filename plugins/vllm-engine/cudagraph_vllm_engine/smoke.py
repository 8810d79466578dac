"""The smoke stage of the GPU run: harness.smoke for vLLM, after vLLM's environment is set.
Every mode is built as the suites build them (its compile caches are theirs too), captured, driven
and closed, the first kept open to the end as the suites' shared engines are; after each close, the
CUDA memory left allocated (`SMOKE memory`: a capture on a stream no matmul ran on before leaves its
cuBLAS workspace, 32 MiB on an H200, which the harness allows any test once). Numbers are
reported, not judged; the exit status is 0 when every mode built and ran.

    python -m cudagraph_vllm_engine.smoke [--modes NONE,PIECEWISE,FULL,FULL_DECODE_ONLY,FULL_AND_PIECEWISE]
"""
from __future__ import annotations

import sys

from . import settings

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# vLLM's Triton attention refuses the tiny preset's head size of 16 ('head_size not supported'):
# the small preset's heads are 64 wide.
PRESET = "small"
JOINS = {0: [(1, 5), (2, 11), (3, 3)], 4: [(4, 2)]}  # three prompts, decode steps, a mixed step
STEPS = 6


def policy_questions(runtime, log, args) -> list[str]:
    from harness.protocol import PolicyConfig

    with settings.timed("smoke: policy questions with speculative tokens (vLLM inspects the EAGLE draft once)"):
        sizes = runtime.capture_sizes(PolicyConfig(max_num_seqs=32, num_speculative_tokens=1, rules="vllm-0.25/v2"))
    log("policy", f"policy: q = 2, max_num_seqs 32: {len(sizes)} sizes up to {sizes[-1]}")
    return []


def main(argv=None) -> int:
    settings.apply_environment()  # before anything imports vLLM or the hub
    from harness import smoke

    return smoke.main(argv, runtime="cudagraph_vllm_engine.runtime:VllmEngineRuntime", modes=MODES, presets=(PRESET,),
                      description=__doc__.splitlines()[0], before=policy_questions, joins=JOINS, steps=STEPS,
                      keep_first_open=True)


if __name__ == "__main__":
    sys.exit(main())
