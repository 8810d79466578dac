"""The `vllm-engine` runtime: vLLM 0.25's own engine (V2 model runner, Triton attention, one GPU,
in this process) behind the harness protocol. Policy: vLLM's own code for the config (policy.py), no
engine needed. Execution: a real engine on the harness's checkpoint (engine.py), graphs captured by
vLLM's capture_model, each step an exact batch this runtime schedules, its mode and padded size
read from vLLM's dispatcher and the path its forward took. vLLM is imported when the runtime is
made, never at import, so listing runtimes stays cheap where vLLM is absent (CI).
"""
from __future__ import annotations

import os
import warnings
import weakref
from pathlib import Path

from harness import protocol as p
from harness.kit.checks import check_built, check_mode, check_one_gpu_config, require_cuda
from harness.kit.delegate import PolicyDelegate

from . import __version__, settings
from .policy import VERSION, VllmPolicy, check_version, graph_descriptors
from .without_gpu import stand_in_for_an_h200

KNOWN_FAILURES = Path(__file__).with_name("known_failures.toml")
NOTES = ("vLLM {vllm} V2 model runner, in-process, {backend} attention; this runtime is the scheduler: each step "
         "re-sends every scheduled request as a resumed request with its tokens (NewRequestData), so a step runs "
         "exactly the harness's batch; logits: the model's compute_logits on the hidden states the runner produced, "
         "every real token, raw (not log-softmax); eager_step: the same engine with vLLM's dispatcher forced to NONE "
         "at the padded shape (same compiled kernels, no graph); config mode NONE: enforce_eager (no torch.compile); "
         "engines q = 1, no LoRA adapters; sizes are the device's (PolicyConfig.platform_max is not used); padded-row "
         "fills: zeros or random valid ids and positions (the padded inputs are integers); precision {precision}: "
         "{why}")
PRECISION_WHY = {
    "tf32": "Triton's float32 tl.dot (the Triton attention backend) rounds to TF32 by default; vLLM's other "
            "products are cuBLAS at float32 matmul precision 'highest'",
    "ieee": "TRITON_F32_DEFAULT=ieee makes Triton's float32 tl.dot IEEE too",
}
POLICY_NOTES = ("vLLM {vllm}'s own policy code (policy.py) for its V2 model runner; questions with speculative tokens "
                "are asked of a config with an EAGLE draft (the policy model's config), with LoRA of one with LoRA "
                "enabled and no adapter")


def precision() -> str:
    """How this process's vLLM does its float32 arithmetic: Triton's float32 dots are TF32 unless
    TRITON_F32_DEFAULT=ieee (read by Triton when it compiles a kernel)."""
    return "ieee" if os.environ.get("TRITON_F32_DEFAULT", "").lower() == "ieee" else "tf32"


class _Policy(PolicyDelegate):
    """The protocol's policy questions, answered by vLLM 0.25's own code (policy.VllmPolicy). What a
    runner's runtimes say differently are these class attributes and `_choose_runner`
    (cudagraph_vllm_engine_v1.runtime sets them for the V1 runner)."""

    RUNNER = "V2"
    RULES = f"vllm-{VERSION}/v2"
    POLICY_CLASS = VllmPolicy
    POLICY_NOTES = POLICY_NOTES
    PLUGIN_VERSION = __version__
    policy: VllmPolicy

    def _choose_runner(self) -> None:
        """Before vLLM is imported: V2 is the runner vLLM 0.25 chooses for the configs this runtime builds."""

    def _prepare_process(self) -> None:
        """vLLM's environment and its runner switch, set before anything imports vLLM."""
        settings.apply_environment()
        self._choose_runner()

    def _start_policy(self) -> str:
        """vLLM imported and its release checked, the policy made and asked once; returns vLLM's version.
        Without a GPU (a policy runtime only: an engine runtime requires one) without_gpu.py stands in."""
        import torch
        import vllm  # fails here, with the reason shown by the harness, when vLLM is not installed

        check_version(vllm.__version__)
        if not torch.cuda.is_available():
            stand_in_for_an_h200()
        self.policy = self.POLICY_CLASS()
        with settings.process_state_restored():  # vLLM's config modules set LD_LIBRARY_PATH when first
            self.policy.answer(p.PolicyConfig(rules=self.RULES))  # imported (vllm/env_override.py): here, not in a test
        return vllm.__version__


class VllmEnginePolicyRuntime(_Policy):
    """vLLM 0.25's policy alone, on any machine where vLLM 0.25 imports (a GPU is not needed:
    without_gpu.py says what stands in): the answers `vllm-engine` gives, for the policy suites and
    for scripts/vllm_versions_compare.py."""

    name = "vllm-engine-policy"
    known_failures = str(KNOWN_FAILURES)

    def __init__(self):
        self._prepare_process()
        vllm_version = self._start_policy()
        self.version = f"{self.PLUGIN_VERSION} (vLLM {vllm_version}, {self.RUNNER} model runner, policy only)"
        self.capabilities = p.Capabilities(
            capture_sizes=True, dispatch=True, mode_resolution=True, rules=self.RULES,
            lora=True, speculative=True, notes=self.POLICY_NOTES.format(vllm=vllm_version))


MEMORY_KEPT_PER_BUILD = 192 << 20  # bytes


class VllmEngineRuntime(_Policy):
    name = "vllm-engine"
    known_failures = str(KNOWN_FAILURES)
    NOTES = NOTES
    RUNS: dict = {}  # the capabilities a runner's engines add to these (V1: LoRA and verify steps)
    LABEL = "engine"  # how the events log names this runtime's engines
    graph_keys = staticmethod(graph_descriptors)  # a policy answer's graph keys, as the engine reports its own

    def __init__(self):
        self._prepare_process()
        require_cuda(self.name, "vLLM")
        vllm_version = self._start_policy()
        self.version = f"{self.PLUGIN_VERSION} (vLLM {vllm_version}, {self.RUNNER} model runner)"
        arithmetic = precision()
        self.capabilities = p.Capabilities(
            capture_sizes=True, dispatch=True, mode_resolution=True, rules=self.RULES,
            lora=True, speculative=True, execution=True, graph_backends=("cuda",),
            attention_backends=((settings.ATTENTION_BACKEND, self.policy.support),),
            padding_fills=("zeros", "random"), loads_checkpoint=True, kv_inspection=True, input_inspection=True,
            outputs_alias_graph_buffers=False, precision=arithmetic,
            # What a closed engine still leaves allocated, measured on an H200 after every close()
            # (reports/h200/vllm/run_16062a0/smoke.log, its "SMOKE memory" lines).
            memory_kept_per_build=MEMORY_KEPT_PER_BUILD,
            notes=self.NOTES.format(vllm=vllm_version, backend=settings.ATTENTION_BACKEND, precision=arithmetic,
                                    why=PRECISION_WHY[arithmetic]),
            **self.RUNS)
        self.engines_built = 0
        self.live = weakref.WeakSet()  # engines built and not yet closed: the last close releases the process's share

    # -- execution --------------------------------------------------------------------------
    def engine_class(self):
        from .engine import VllmEngine

        return VllmEngine

    def build(self, config: p.EngineConfig):
        self._check_config(config)
        expected = self.policy.answer(config.policy)  # raises ValueError where vLLM rejects the config
        self.engines_built += 1
        policy = config.policy
        label = (f"{self.LABEL} #{self.engines_built} {policy.mode} {config.dtype} seqs={policy.max_num_seqs} "
                 f"tokens={policy.max_num_batched_tokens}" + (f" k={policy.num_speculative_tokens}"
                                                              if policy.num_speculative_tokens else ""))
        engine = self.engine_class()(config, label, self.live)
        return self._held_to_policy(engine, (expected.mode, list(expected.sizes), self.graph_keys(expected.dispatcher)),
                                    label)

    @staticmethod
    def _held_to_policy(engine, answered: tuple, label: str):
        """The built engine if it resolved, sized and keyed its graphs as this runtime's policy answers
        for its config (closed and refused if not), with its resolution and vLLM's warnings."""
        built = (engine.resolved, engine.capture_sizes(), engine.graph_descriptors())
        check_built(engine, built, answered, label, "vLLM", settings.EVENTS)
        mode = engine.config.policy.mode
        engine.resolution = p.Resolution(mode, engine.resolved, engine.build_warnings)
        if engine.resolved != mode:
            for message in engine.build_warnings:
                warnings.warn(f"vLLM: {message}", stacklevel=3)
        return engine

    def _check_config(self, config: p.EngineConfig) -> None:
        check_one_gpu_config(config, self.name, settings.ATTENTION_BACKEND,
                             f"the {settings.ATTENTION_BACKEND} backend")
        check_mode(config)
