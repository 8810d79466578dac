"""The calculator for each vLLM release, behind one small interface the peer cases ask.

vLLM 0.33 is answered by the policy calculator (`reference_runtime.policy`, what
`python -m reference_runtime` prints). vLLM 0.25 by the same calculator where it takes a release
(resolution; the settings before it are the same in both), and by the harness's oracle for sizes,
keys and dispatch, the one model of 0.25's sizes and graph search (docs/spec.md section 11).
A broken calculator in the self-tests (tests/broken_calculators.py) replaces one method.
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
    """vLLM 0.25: resolution by the calculator's 0.25 rules; sizes, keys and dispatch by the oracle."""

    release = "0.25"

    def _oracle_config(self, config: dict) -> protocol.PolicyConfig:
        fields = {name: value for name, value in config.items() if name != "runner"}  # vLLM's word, a rules name here
        return protocol.PolicyConfig(**{**fields, "capture_sizes": sizes_of(config.get("capture_sizes")),
                                        "rules": f"vllm-{self.release}/{config.get('runner', 'v2')}"})

    def capture_sizes(self, config: dict) -> list[int]:
        return oracle.capture_sizes(self._oracle_config(config))

    def key_counts(self, config: dict) -> dict[str, int]:
        return {mode: len(keys) for mode, keys in oracle.graph_keys(self._oracle_config(config)).items()}

    def key_sizes(self, config: dict) -> dict[str, set[int]]:
        return {mode: {k.num_padded_tokens for k in keys} for mode, keys in oracle.graph_keys(self._oracle_config(config)).items()}

    def capture_order(self, config: dict, initialized: bool = True) -> list[tuple[str, list[dict]]]:
        if not initialized:
            return []
        keys = oracle.graph_keys(self._oracle_config(config))
        return [(mode, [key_fields(k) for k in sorted(keys[mode], key=lambda k: -k.num_padded_tokens)])
                for mode in ("PIECEWISE", "FULL") if keys[mode]]

    def dispatch(self, config: dict, num_real_tokens: int, num_real_rows: int | None, uniform: bool,
                 allowed_modes: tuple[str, ...] | None) -> tuple[str, dict]:
        allowed = frozenset(allowed_modes or protocol.RUNTIME_MODES)
        found = oracle.dispatch(self._oracle_config(config), num_real_tokens, num_real_rows, uniform, 0, allowed)
        return found.runtime_mode, key_fields(found.descriptor)


CALCULATORS = {"0.33": Calculator, "0.25": Calculator025}
