"""The calculator for each vLLM release, behind one small interface the peer cases ask.

vLLM 0.33 is answered by the policy calculator (`reference_runtime.policy`, what
`python -m reference_runtime` prints). vLLM 0.25 by the same calculator where it takes a release
(resolution; the settings before it are the same in both), and by the harness's oracle for sizes,
keys and dispatch, the one model of 0.25's sizes and graph search (docs/spec.md section 11).
SGLang's and LMDeploy's tests are answered by the plugins' own restatements of their engines'
rules (`cudagraph_sglang_policy.runtime`'s runner rules, `cudagraph_lmdeploy_engine.policy`), which
import neither engine. A broken calculator in the self-tests (tests/broken_calculators.py) replaces
one method.
"""
from __future__ import annotations

from dataclasses import asdict

from harness import protocol
from harness.expectations import oracle
from reference_runtime import policy
from reference_runtime.policy.resolve import config_time_mode

KEY_FIELDS = ("num_tokens", "num_reqs", "uniform", "has_lora", "num_active_loras")
# vLLM's tests name a key's sizes as vLLM's BatchDescriptor does; ours name them as padded.
VLLM_NAMES = {"num_padded_tokens": "num_tokens", "num_padded_rows": "num_reqs"}


def key_fields(key) -> dict:
    """A graph key's fields under vLLM's names, as its tests write them."""
    return {VLLM_NAMES.get(name, name): value for name, value in asdict(key).items()}


def sizes_of(value) -> tuple[int, ...] | None:
    """Capture sizes as written in a case: a list, or "A..B" for every integer from A to B."""
    if isinstance(value, str):
        first, last = value.split("..")
        return tuple(range(int(first), int(last) + 1))
    return None if value is None else tuple(value)


class Calculator:
    """vLLM 0.33's policy as the calculator answers it."""

    release = "0.33"

    def __init__(self):
        self._dispatchers: dict = {}

    # -- sizes, keys, dispatch ---------------------------------------------------------------
    def policy_config(self, config: dict) -> policy.PolicyConfig:
        schedule = config.get("speculative_schedule")
        return policy.PolicyConfig(**{**config, "capture_sizes": sizes_of(config.get("capture_sizes")),
                                      "speculative_schedule": None if schedule is None else tuple(map(tuple, schedule))})

    def dispatcher(self, config: dict, initialized: bool = True) -> policy.Dispatcher:
        key = (tuple(sorted((k, str(v)) for k, v in config.items())), initialized)
        if key not in self._dispatchers:
            dispatcher = policy.Dispatcher(self.policy_config(config))
            if initialized:
                dispatcher.initialize_keys()
            self._dispatchers[key] = dispatcher
        return self._dispatchers[key]

    def capture_sizes(self, config: dict) -> list[int]:
        return policy.capture_sizes(self.policy_config(config))

    def key_counts(self, config: dict) -> dict[str, int]:
        keys = self.dispatcher(config).keys
        return {mode.name: len(found) for mode, found in keys.items()}

    def key_sizes(self, config: dict) -> dict[str, set[int]]:
        return {mode.name: {k.num_padded_tokens for k in found} for mode, found in self.dispatcher(config).keys.items()}

    def full_decode_keys(self, config: dict) -> list[dict]:
        return [key_fields(k) for k in self.dispatcher(config).keys[policy.CUDAGraphMode.FULL] if k.uniform]

    def decode_query_lens(self, config: dict) -> list[int]:
        return self.dispatcher(config).decode_query_lens

    def capture_order(self, config: dict, initialized: bool = True) -> list[tuple[str, list[dict]]]:
        return [(mode.name, [key_fields(k) for k in keys]) for mode, keys in self.dispatcher(config, initialized).capture_keys()]

    def dispatch(self, config: dict, num_real_tokens: int, num_real_rows: int | None, uniform: bool,
                 allowed_modes: tuple[str, ...] | None) -> tuple[str, dict]:
        allowed = frozenset(policy.CUDAGraphMode[m] for m in allowed_modes) if allowed_modes else \
            frozenset(policy.CUDAGraphMode[m] for m in protocol.RUNTIME_MODES)
        mode, key = self.dispatcher(config).dispatch(num_real_tokens, num_real_rows, uniform, 0, allowed)
        return mode.name, key_fields(key)

    def dispatcher_refuses(self, mode: str, piecewise_capture: bool) -> bool:
        try:
            policy.Dispatcher(policy.PolicyConfig(mode=mode), piecewise_capture=piecewise_capture)
        except ValueError:
            return True
        return False

    # -- resolution and the settings before it -----------------------------------------------
    def resolve(self, request: dict) -> str:
        request = dict(request)
        mode, support = request.pop("mode"), request.pop("support")
        try:
            return policy.resolve_mode(mode, support, release=self.release, **request).resolved.name
        except ValueError:
            return "error"

    def config_mode(self, inputs: dict) -> str:
        inputs = dict(inputs)
        return config_time_mode(inputs.pop("mode"), release=self.release, **inputs).name

    def defaults(self, inputs: dict) -> dict:
        found = policy.compilation_defaults(**inputs)
        return {**asdict(found), "mode": found.mode.name, "attention_in_splitting_ops": found.attention_in_splitting_ops}

    def compile_sizes(self, inputs: dict) -> list[int]:
        return policy.check_compile_sizes(inputs["compile_sizes"], inputs["capture_sizes"], inputs["mode"])

    def uniform(self, requests: list) -> int | None:
        """requests: [tokens this step, prompt tokens computed before (None: past the prompt), drafts]."""
        eligible = all(computed is None or policy.prompt_step_runs_as_decode(tokens - drafts, computed)
                       for tokens, computed, drafts in requests)
        return policy.uniform_token_count([tokens for tokens, _, _ in requests], decode_graph_eligible=eligible)

    def runs_as_decode(self, tokens: int, computed: int, drafts: int) -> bool:
        return policy.prompt_step_runs_as_decode(tokens - drafts, computed)

    def is_uniform_decode(self, query_lens: list[int], query_len: int) -> bool:
        return policy.is_uniform_decode(query_lens, query_len)

    def weakest(self, levels: list[str]) -> str:
        return policy.weakest_support(levels).name


class Calculator025(Calculator):
    """vLLM 0.25: resolution by the calculator's 0.25 rules; sizes, keys and dispatch by the oracle
    (under a dynamic speculative schedule, with 0.25's decode graphs of every scheduled q)."""

    release = "0.25"

    def _oracle_config(self, config: dict) -> protocol.PolicyConfig:
        fields = {name: value for name, value in config.items()
                  if name not in ("runner", "speculative_schedule")}  # vLLM's words; the oracle takes its q apart
        return protocol.PolicyConfig(**{**fields, "capture_sizes": sizes_of(config.get("capture_sizes")),
                                        "rules": f"vllm-{self.release}/{config.get('runner', 'v2')}"})

    def decode_query_lens(self, config: dict) -> list[int]:
        """The q of every decode graph: under a dynamic speculative schedule, 0.25's every scheduled q."""
        return list(self._decode_lens(config) or (1 + config.get("num_speculative_tokens", 0),))

    def _decode_lens(self, config: dict) -> tuple[int, ...] | None:
        schedule = config.get("speculative_schedule")
        return None if schedule is None else oracle.speculative_decode_query_lens(schedule)

    def _graph_keys(self, config: dict) -> dict:
        return oracle.graph_keys(self._oracle_config(config), self._decode_lens(config))

    def capture_sizes(self, config: dict) -> list[int]:
        return oracle.capture_sizes(self._oracle_config(config))

    def key_counts(self, config: dict) -> dict[str, int]:
        return {mode: len(keys) for mode, keys in self._graph_keys(config).items()}

    def key_sizes(self, config: dict) -> dict[str, set[int]]:
        return {mode: {k.num_padded_tokens for k in keys} for mode, keys in self._graph_keys(config).items()}

    def capture_order(self, config: dict, initialized: bool = True) -> list[tuple[str, list[dict]]]:
        if not initialized:
            return []
        keys = self._graph_keys(config)
        return [(mode, [key_fields(k) for k in sorted(keys[mode], key=lambda k: -k.num_padded_tokens)])
                for mode in ("PIECEWISE", "FULL") if keys[mode]]

    def dispatch(self, config: dict, num_real_tokens: int, num_real_rows: int | None, uniform: bool,
                 allowed_modes: tuple[str, ...] | None) -> tuple[str, dict]:
        allowed = frozenset(allowed_modes or protocol.RUNTIME_MODES)
        found = oracle.dispatch(self._oracle_config(config), num_real_tokens, num_real_rows, uniform, 0, allowed,
                                self._decode_lens(config))
        return found.runtime_mode, key_fields(found.descriptor)


class SglangCalculator:
    """SGLang 0.5.23's runner rules as the sglang-policy plugin restates them (its `_prefill`, `_decode`)."""

    release = "sglang-0.5.23"

    def graphs(self, graphs: dict):
        from cudagraph_sglang_policy.runtime import Graphs

        return Graphs(q=graphs.get("q", 1), decode_mode=graphs.get("decode_mode", "FULL"),
                      capture_bs=tuple(graphs.get("capture_bs", (1,))), prefill_mode=graphs["prefill_mode"],
                      prefill_tokens=tuple(graphs["prefill_tokens"]), prefill_slots=graphs.get("prefill_slots"))

    def prefill(self, graphs: dict, num_real_tokens: int, num_real_rows: int) -> tuple[str, int | None]:
        """(runtime mode, the graph's token count or None) for an extend batch."""
        from cudagraph_sglang_policy.runtime import _prefill

        found = _prefill(self.graphs(graphs), num_real_tokens, num_real_rows)
        return found.runtime_mode, None if found.runtime_mode == "NONE" else found.descriptor.num_padded_tokens


class LmdeployCalculator:
    """LMDeploy 0.18.0's capture batch sizes as the lmdeploy-engine plugin's policy restates them."""

    release = "lmdeploy-0.18.0"

    def __init__(self):
        from cudagraph_lmdeploy_engine import policy as lmdeploy

        self.lmdeploy = lmdeploy
        self.policy = lmdeploy.LmdeployPolicy()

    def config(self, config: dict) -> protocol.PolicyConfig:
        return protocol.PolicyConfig(**{**config, "capture_sizes": sizes_of(config.get("capture_sizes"))})

    def capture_sizes(self, config: dict) -> list[int]:
        return self.policy.capture_sizes(self.config(config))

    def user_sizes(self, sizes: list, max_batch_size: int) -> list[int]:
        return self.lmdeploy.user_batch_sizes(sizes, max_batch_size)

    def dispatch(self, config: dict, batch_size: int) -> tuple[str, int | None]:
        """A decode batch of batch_size requests, one token each: (runtime mode, graph size or None)."""
        found = self.policy.dispatch(self.config(config), batch_size, batch_size, True)
        return found.runtime_mode, None if found.runtime_mode == "NONE" else found.descriptor.num_padded_tokens


CALCULATORS = {"0.33": Calculator, "0.25": Calculator025, SglangCalculator.release: SglangCalculator,
               LmdeployCalculator.release: LmdeployCalculator}
