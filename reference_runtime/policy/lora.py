"""LoRA cases: which active-adapter counts get graphs of their own."""
from __future__ import annotations

import bisect

from .config import PolicyConfig


def captured_lora_counts(max_loras: int, specialize_active_loras: bool) -> list[int]:
    """Adapter counts captured when LoRA graphs are specialised.

    With count specialisation: the powers of two up to max_loras, plus max_loras + 1
    (the +1 stands for the batch slot that runs without an adapter). Without it, one
    case covers every count.
    """
    if not specialize_active_loras:
        return [max_loras + 1]
    counts = []
    power = 1
    while power <= max_loras:
        counts.append(power)
        power *= 2
    counts.append(max_loras + 1)
    return sorted(set(counts))


def lora_cases(config: PolicyConfig) -> list[int]:
    """Every num_active_loras a graph is captured for (0: no LoRA).

    Without LoRA specialisation the V1 runner captures only the LoRA case, so a batch without
    adapters runs eager; the V2 runner also captures the no-LoRA case.
    """
    if not config.lora_enabled:
        return [0]
    if config.specialize_lora:
        return [0] + captured_lora_counts(config.max_loras, config.specialize_active_loras)
    return ([0] if config.rules.lora_case_without_adapters else []) + [config.max_loras + 1]


def effective_active_loras(config: PolicyConfig, num_active_loras: int) -> int:
    """Round a batch's active adapter count up to a captured case."""
    if num_active_loras < 0:
        raise ValueError(f"num_active_loras must be >= 0, got {num_active_loras}")
    if num_active_loras == 0:
        return 0
    if not config.lora_enabled:
        raise ValueError(f"num_active_loras ({num_active_loras}) must be 0 when LoRA is off (max_loras=0)")
    if num_active_loras > config.max_loras:
        raise ValueError(f"num_active_loras ({num_active_loras}) must be <= max_loras ({config.max_loras})")
    if not config.specialize_lora or not config.specialize_active_loras:
        return config.max_loras + 1
    counts = captured_lora_counts(config.max_loras, True)
    return counts[bisect.bisect_left(counts, num_active_loras)]
