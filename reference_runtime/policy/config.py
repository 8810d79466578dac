"""The policy's inputs, validated once, with errors that name the field and its limit."""
from __future__ import annotations

from dataclasses import dataclass

from .modes import CUDAGraphMode
from .speculation import check_schedule

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
PLATFORM_MAX_DEFAULT = 512  # 1024 on SM100 (B200 class)
DEFAULT_RUNNER = "v2"  # vLLM 0.33 runs V2 unless a feature needs V1


@dataclass(frozen=True)
class RunnerRules:
    """Where vLLM's two model runners differ in graph policy, one rule a field (docs/runners.md)."""

    rounds_sizes_to_q: bool  # with FULL decode graphs and q > 1 the sizes themselves become multiples of q (sizes.py)
    rounds_decode_keys_to_q: bool  # uniform-decode keys at each size rounded up to whole requests (dispatch.py)
    smallest_key_that_holds: bool  # dispatch: the smallest key of a mode that holds the batch, not the exact padded key
    eager_key_keeps_counts: bool  # an eager step's key keeps its request and adapter counts (else the trivial key)
    lora_case_without_adapters: bool  # without LoRA specialisation a no-adapter case is captured too (lora.py)
    dp_pads_to_unpadded_max: bool  # data parallel: ranks meet at the largest unpadded size, not the largest padded
    dp_uniform_only_if_all: bool  # data parallel: a rank stays uniform only if every rank is
    dp_keeps_counts: bool  # data parallel: each rank re-dispatches its own request count, in any mode it holds


RUNNERS = {
    "v1": RunnerRules(rounds_sizes_to_q=True, rounds_decode_keys_to_q=False, smallest_key_that_holds=False,
                      eager_key_keeps_counts=False, lora_case_without_adapters=False, dp_pads_to_unpadded_max=False,
                      dp_uniform_only_if_all=False, dp_keeps_counts=False),
    "v2": RunnerRules(rounds_sizes_to_q=False, rounds_decode_keys_to_q=True, smallest_key_that_holds=True,
                      eager_key_keeps_counts=True, lora_case_without_adapters=True, dp_pads_to_unpadded_max=True,
                      dp_uniform_only_if_all=True, dp_keeps_counts=True),
}


@dataclass(frozen=True)
class PolicyConfig:
    """What decides sizes, keys and dispatch: the scheduler limits and the graph options."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: max(8192, max_num_seqs)
    num_speculative_tokens: int = 0
    platform_max: int = PLATFORM_MAX_DEFAULT
    capture_sizes: tuple[int, ...] | None = None  # user-given sizes
    max_capture_size: int | None = None  # user-given max
    mode: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE
    max_loras: int = 0  # 0: LoRA off
    specialize_lora: bool = True  # capture separate no-LoRA and LoRA graphs
    specialize_active_loras: bool = False  # one graph per captured active-adapter count
    runner: str = DEFAULT_RUNNER  # vLLM's model runner whose rules apply (docs/runners.md)
    # Dynamic speculative decoding: ((first batch, last batch, speculative tokens), ...); None: static.
    speculative_schedule: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "mode", CUDAGraphMode.parse(self.mode))
        if self.capture_sizes is not None:
            object.__setattr__(self, "capture_sizes", tuple(self.capture_sizes))
        if self.speculative_schedule is not None:
            object.__setattr__(self, "speculative_schedule", check_schedule(self.speculative_schedule))
        _check_int("max_num_seqs", self.max_num_seqs, minimum=1)
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0)
        _check_int("platform_max", self.platform_max, minimum=1)
        _check_int("max_loras", self.max_loras, minimum=0)
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)} (vLLM's model runners), got {self.runner!r}")
        if self.max_num_batched_tokens is not None:
            _check_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                    f"max_num_seqs ({self.max_num_seqs}): every running request needs at least one token per step"
                )
        if self.max_capture_size is not None:
            # A max of 0 is how vLLM says "no graphs"; it goes only with mode NONE (CompilationConfig).
            _check_int("max_capture_size", self.max_capture_size, minimum=0)
            if self.max_capture_size == 0 and self.mode is not CUDAGraphMode.NONE:
                raise ValueError(f"max_capture_size 0 captures no graph, but mode {self.mode.name} needs graphs; "
                                 "give a max >= 1, or mode NONE")
        if self.capture_sizes is not None:
            for size in self.capture_sizes:
                _check_int("capture_sizes", size, minimum=1)

    @property
    def rules(self) -> RunnerRules:
        """The rules of the model runner this config names."""
        return RUNNERS[self.runner]

    @property
    def query_len(self) -> int:
        """Tokens per request in a uniform decode step: 1 + speculative tokens."""
        return 1 + self.num_speculative_tokens

    @property
    def batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, self.max_num_seqs)

    @property
    def lora_enabled(self) -> bool:
        return self.max_loras > 0


def _check_int(name: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
