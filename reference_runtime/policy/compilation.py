"""vLLM's compilation settings that decide the graph mode before the backends are consulted
(SPEC 2.3, 5.3): optimization levels, enforce_eager, the attention-quant fusion, and the
validation of compile_sizes against the capture sizes.

What comes out is the input of resolve_mode: the config mode and whether piecewise graphs can
be captured at all.
"""
from __future__ import annotations

from dataclasses import dataclass

from .modes import CUDAGraphMode
from .padding import PaddingTable

# vLLM's -O levels (config/vllm.py OPTIMIZATION_LEVEL_00..03): (piecewise compilation on, cudagraph_mode).
OPTIMIZATION_LEVELS = {
    0: (False, CUDAGraphMode.NONE),
    1: (True, CUDAGraphMode.PIECEWISE),
    2: (True, CUDAGraphMode.FULL_AND_PIECEWISE),
    3: (True, CUDAGraphMode.FULL_AND_PIECEWISE),
}
DEFAULT_OPTIMIZATION_LEVEL = 2


@dataclass(frozen=True)
class CompilationDefaults:
    """What a level and enforce_eager make of the user's settings."""

    mode: CUDAGraphMode  # the config mode, before resolution against the backends
    piecewise_compilation: bool  # vLLM's CompilationMode.VLLM_COMPILE: the forward is compiled in pieces
    attention_quant_fusion: bool  # fuse_attn_quant's default (off at every level for now)
    max_capture_size: int | None  # 0 where enforce_eager captures nothing; None: from the sizes

    @property
    def attention_in_splitting_ops(self) -> bool:
        """Unless told otherwise vLLM cuts a compiled forward at attention (set_splitting_ops_for_v1)."""
        return self.piecewise_compilation and not self.attention_quant_fusion


def compilation_defaults(optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL, *, enforce_eager: bool = False,
                         mode: CUDAGraphMode | str | None = None,
                         piecewise_compilation: bool | None = None) -> CompilationDefaults:
    """The config mode and compilation a level gives, with the user's explicit settings kept.

    enforce_eager wins over everything: no compilation, mode NONE, a max capture size of 0
    (VllmConfig.__post_init__). Otherwise a user's mode or compilation is kept and the level
    fills what is unset (VllmConfig._apply_optimization_level_defaults).
    """
    if isinstance(optimization_level, bool) or optimization_level not in OPTIMIZATION_LEVELS:
        raise ValueError(f"optimization_level must be one of 0, 1, 2, 3 (vLLM's -O0..-O3), got {optimization_level!r}")
    if enforce_eager:
        return CompilationDefaults(CUDAGraphMode.NONE, False, False, 0)
    level_compiles, level_mode = OPTIMIZATION_LEVELS[optimization_level]
    chosen = level_mode if mode is None else CUDAGraphMode.parse(mode)
    compiles = level_compiles if piecewise_compilation is None else piecewise_compilation
    return CompilationDefaults(chosen, compiles, False, None)


def check_compile_sizes(compile_sizes, capture_sizes, mode: CUDAGraphMode | str) -> list[int]:
    """vLLM compiles a kernel for each compile size; padding must not move a batch of that size off it.

    Returns the sizes, sorted and unique ("cudagraph_capture_sizes" stands for all of them).
    Raises ValueError naming the first size that padding would change, unless no graph is
    captured (mode NONE or no sizes), where vLLM skips the check (CudagraphDispatcher).
    """
    mode = CUDAGraphMode.parse(mode)
    sizes: set[int] = set()
    for size in compile_sizes:
        if size == "cudagraph_capture_sizes":
            sizes.update(capture_sizes)
        elif isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"compile_sizes holds integers >= 1 or 'cudagraph_capture_sizes', got {size!r}")
        else:
            sizes.add(size)
    if mode is CUDAGraphMode.NONE or not capture_sizes:
        return sorted(sizes)
    table = PaddingTable(sorted(capture_sizes))
    for size in sorted(sizes):
        padded = table.padded(size)
        if padded is not None and padded != size:
            raise ValueError(
                f"compile_sizes holds {size}, which cudagraph padding would run at {padded}; "
                f"use sizes from the capture sizes ({', '.join(map(str, sorted(capture_sizes)))}) "
                "or sizes above the largest"
            )
    return sorted(sizes)
