"""The `vllm-engine-v1` runtime: vLLM 0.25 with its V1 model runner (vllm/v1/worker/
gpu_model_runner.py) and that runner's CudagraphDispatcher, one GPU, in this process.

- Policy: vLLM's own code for the V1 runner (policy.py): resolution with
  use_v2_model_runner=False, the keys of a CudagraphDispatcher on the same VllmConfig, its dispatch.
  Declared as vLLM 0.25's V1 rules (`Capabilities.rules` "vllm-0.25/v1"): the policy suites hold it
  to the spec's 0.25 V1 values and the oracle (docs/spec.md section 11), and every build and step to
  the same. `vllm-engine-v1-policy` gives the same answers on any machine (cudagraph_vllm_engine/without_gpu.py).
- Execution: a real engine (engine.py); the mode and padded size of every step read from the
  dispatcher's answer and the forward context the forward ran under; ngram verify steps with the
  drafts this runtime schedules.

vLLM chooses its runner from VLLM_USE_V2_MODEL_RUNNER (vllm/envs.py); this runtime sets it to 0
before vLLM is imported, so it cannot share a process with `vllm-engine` (the suites run one
runtime per process).
"""
from __future__ import annotations

import os
from pathlib import Path

from harness import protocol as p

from cudagraph_vllm_engine.policy import VERSION
from cudagraph_vllm_engine.runtime import KNOWN_FAILURES as POLICY_KNOWN_FAILURES
from cudagraph_vllm_engine.runtime import VllmEnginePolicyRuntime, VllmEngineRuntime

from . import __version__
from .lora import LORA_DTYPES, lora_args
from .policy import RUNNER_SWITCH, VllmV1Policy, v1_graph_keys

KNOWN_FAILURES = Path(__file__).with_name("known_failures.toml")
NOTES = ("vLLM {vllm} V1 model runner (GPUModelRunner, CudagraphDispatcher), in-process, {backend} attention; this "
         "runtime is the scheduler: each step re-sends every scheduled request as a resumed request with its tokens "
         "(NewRequestData); a request of q = k + 1 tokens after a context in an engine with k speculative tokens is a "
         "verify step: its last k tokens are handed over as scheduled_spec_decode_tokens (ngram method; the proposer "
         "proposes nothing where numba is missing: ngram_stand_in.py); mode and padded size: the forward context's "
         "cudagraph_runtime_mode and BatchDescriptor, checked against the dispatcher's answer and the input length; "
         "logits: compute_logits on every real token's hidden state, raw; eager_step: the dispatcher's answer "
         "replaced by NONE at the padded shape; LoRA: the harness's PEFT adapters as LoRARequests on each request's "
         "NewRequestData, loaded by the runner's LoRA manager (lora.py); StepResult.key: the forward context's "
         "BatchDescriptor; "
         "precision {precision}: {why}")


def force_v1_runner(environ=os.environ) -> None:
    """vLLM reads the switch when a VllmConfig asks which runner to use; an explicit 1 is refused."""
    if environ.get(RUNNER_SWITCH, "0") not in ("0", "false", "False"):
        raise p.RuntimeUnavailable(f"vllm-engine-v1 drives vLLM's V1 model runner; {RUNNER_SWITCH}="
                                   f"{environ[RUNNER_SWITCH]!r} asks for V2 (unset it, or use vllm-engine)")
    environ[RUNNER_SWITCH] = "0"


RULES = f"vllm-{VERSION}/v1"  # vLLM 0.25's V1 runner, as harness.vocabulary.VLLM_RELEASES models it


class _V1:
    """What the V1 runner's runtimes say otherwise than V2's (cudagraph_vllm_engine.runtime._Policy)."""

    RUNNER = "V1"
    RULES = RULES
    POLICY_CLASS = VllmV1Policy
    POLICY_NOTES = ("vLLM {vllm}'s own policy code (policy.py) for its V1 model runner: CudagraphDispatcher's keys "
                    "and dispatch, resolution with use_v2_model_runner=False")
    PLUGIN_VERSION = __version__

    def _choose_runner(self) -> None:
        force_v1_runner()


class VllmEngineV1PolicyRuntime(_V1, VllmEnginePolicyRuntime):
    """vLLM 0.25's V1 policy alone, on any machine where vLLM 0.25 imports: the answers `vllm-engine-v1`
    gives, for the policy suites and for scripts/vllm_versions_compare.py --oracle."""

    name = "vllm-engine-v1-policy"
    known_failures = str(POLICY_KNOWN_FAILURES)  # the config's silent downgrades: VllmConfig's, either runner


class VllmEngineV1Runtime(_V1, VllmEngineRuntime):
    name = "vllm-engine-v1"
    known_failures = str(KNOWN_FAILURES)
    NOTES = NOTES
    # memory_kept_per_build is V2's bound: the V1 lane's smoke measures each closed V1 engine within it
    # (reports/h100/vllm-v1/run_99c9622/smoke.log, "SMOKE memory").
    RUNS = dict(lora_steps=True, speculative_steps=True, declarations={"lora_dtypes": LORA_DTYPES})
    LABEL = "V1 engine"
    graph_keys = staticmethod(v1_graph_keys)

    def engine_class(self):
        from .engine import VllmV1Engine

        return VllmV1Engine

    def _check_config(self, config: p.EngineConfig) -> None:
        super()._check_config(config)
        lora_args(config.policy, tuple(config.lora_adapters), config.dtype)  # refuses what vLLM cannot take, by name
