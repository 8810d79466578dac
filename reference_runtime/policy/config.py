"""The policy's inputs, validated once, with errors that name the field and its limit."""
from __future__ import annotations

from dataclasses import dataclass

from .modes import CUDAGraphMode

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
PLATFORM_MAX_DEFAULT = 512  # 1024 on SM100 (B200 class)
RUNNERS = ("v1", "v2")  # vLLM's model runners; vLLM 0.33 runs V2 unless a feature needs V1
DEFAULT_RUNNER = "v2"


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

    def __post_init__(self):
        object.__setattr__(self, "mode", CUDAGraphMode.parse(self.mode))
        if self.capture_sizes is not None:
            object.__setattr__(self, "capture_sizes", tuple(self.capture_sizes))
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
            _check_int("max_capture_size", self.max_capture_size, minimum=1)
        if self.capture_sizes is not None:
            for size in self.capture_sizes:
                _check_int("capture_sizes", size, minimum=1)

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
