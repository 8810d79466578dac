"""The smoke stage of the GPU run: harness.smoke (the kit's one smoke driver) for vLLM, after
vLLM's environment is set (settings.apply_environment, before anything imports vLLM or the hub).
Every config mode is built once as the suites build them (so the compile caches it leaves are the
suites' too), captured, driven through the shared generation scenario and closed; the first engine
stays open as the suites' shared engines do and is closed last. After each close: the CUDA memory
the build left allocated (`SMOKE memory`; a capture on a stream of torch's pool that no matmul ran
on before leaves that stream's cuBLAS workspace, 32 MiB on an H200, which the harness allows any
test once).

    python -m cudagraph_vllm_engine.smoke [--modes NONE,PIECEWISE,FULL,FULL_DECODE_ONLY,FULL_AND_PIECEWISE]

Numbers are reported, not judged (the suites judge); the exit status is 0 when every mode built
and ran.
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


def engine_config(runtime, mode: str):
    """The config the suites' engine factory makes for this mode (harness.smoke.engine_config)."""
    from harness.smoke import engine_config as suites_config

    return suites_config(runtime, mode, PRESET)


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
