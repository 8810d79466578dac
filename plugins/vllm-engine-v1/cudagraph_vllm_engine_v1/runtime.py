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
import weakref
from pathlib import Path

from harness import protocol as p
from harness.kit.checks import require_cuda

from cudagraph_vllm_engine import settings
from cudagraph_vllm_engine.policy import VERSION
from cudagraph_vllm_engine.runtime import KNOWN_FAILURES as POLICY_KNOWN_FAILURES
from cudagraph_vllm_engine.runtime import MEMORY_KEPT_PER_BUILD, PRECISION_WHY, VllmEngineRuntime, _Policy, precision

from . import __version__
from .lora import LORA_DTYPES, lora_args
from .policy import RUNNER_SWITCH

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


class VllmEngineV1PolicyRuntime(_Policy):
    """vLLM 0.25's V1 policy alone, on any machine where vLLM 0.25 imports: the answers `vllm-engine-v1`
    gives, for the policy suites and for scripts/vllm_versions_compare.py --oracle."""

    name = "vllm-engine-v1-policy"
    known_failures = str(POLICY_KNOWN_FAILURES)  # the config's silent downgrades: VllmConfig's, either runner

    def __init__(self):
        settings.apply_environment()
        force_v1_runner()
        from .policy import VllmV1Policy

        vllm_version = self._start_policy(VllmV1Policy, RULES)
        self.version = f"{__version__} (vLLM {vllm_version}, V1 model runner, policy only)"
        self.capabilities = p.Capabilities(
            capture_sizes=True, dispatch=True, mode_resolution=True, rules=RULES, lora=True, speculative=True,
            notes=f"vLLM {vllm_version}'s own policy code (policy.py) for its V1 model runner: "
                  "CudagraphDispatcher's keys and dispatch, resolution with use_v2_model_runner=False")


class VllmEngineV1Runtime(VllmEngineRuntime):
    name = "vllm-engine-v1"
    known_failures = str(KNOWN_FAILURES)

    def __init__(self):
        settings.apply_environment()
        force_v1_runner()
        require_cuda("vllm-engine-v1", "vLLM")
        from .policy import VllmV1Policy

        vllm_version = self._start_policy(VllmV1Policy, RULES)
        self.version = f"{__version__} (vLLM {vllm_version}, V1 model runner)"
        arithmetic = precision()
        self.capabilities = p.Capabilities(
            capture_sizes=True, dispatch=True, mode_resolution=True, rules=RULES, lora=True, lora_steps=True, speculative=True, speculative_steps=True, execution=True, graph_backends=("cuda",),
            attention_backends=((settings.ATTENTION_BACKEND, self.policy.support),),
            padding_fills=("zeros", "random"), loads_checkpoint=True, kv_inspection=True, input_inspection=True,
            outputs_alias_graph_buffers=False, precision=arithmetic, declarations={"lora_dtypes": LORA_DTYPES},
            # V2's bound: the V1 lane's smoke measures what each closed V1 engine keeps, within it
            # (reports/h100/vllm-v1/run_678fe06/smoke.log, "SMOKE memory").
            memory_kept_per_build=MEMORY_KEPT_PER_BUILD,
            notes=NOTES.format(vllm=vllm_version, backend=settings.ATTENTION_BACKEND, precision=arithmetic,
                               why=PRECISION_WHY[arithmetic]))
        self.engines_built = 0
        self.live = weakref.WeakSet()

    def build(self, config: p.EngineConfig):
        from .engine import VllmV1Engine
        from .policy import v1_graph_keys

        self._check_config(config)
        lora_args(config.policy, tuple(config.lora_adapters), config.dtype)  # refuses what vLLM cannot take, by name
        expected = self.policy.answer(config.policy)
        self.engines_built += 1
        policy = config.policy
        label = (f"V1 engine #{self.engines_built} {policy.mode} {config.dtype} seqs={policy.max_num_seqs} "
                 f"tokens={policy.max_num_batched_tokens} k={policy.num_speculative_tokens}")
        engine = VllmV1Engine(config, label, self.live)
        return self._held_to_policy(engine, (expected.mode, list(expected.sizes), v1_graph_keys(expected.dispatcher)),
                                    label)
