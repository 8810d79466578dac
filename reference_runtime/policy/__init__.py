"""vLLM's graph policy in pure Python (no torch): sizes, padding, keys, dispatch, resolution.

Execution code depends on this package; this package depends on nothing but the standard library.
"""
from .config import PolicyConfig
from .data_parallel import dp_dispatch
from .compilation import check_compile_sizes, compilation_defaults
from .dispatch import BatchDescriptor, Dispatcher, is_uniform_decode, prompt_step_runs_as_decode, uniform_token_count
from .lora import captured_lora_counts, effective_active_loras, lora_cases
from .modes import AttentionCGSupport, CUDAGraphMode, weakest_support
from .padding import Padding, PaddingTable
from .resolve import Resolution, resolve_mode, without_piecewise
from .sizes import capture_sizes, grid, max_capture_size

__all__ = [
    "AttentionCGSupport", "BatchDescriptor", "CUDAGraphMode", "Dispatcher", "Padding", "PaddingTable",
    "PolicyConfig", "Resolution", "capture_sizes", "captured_lora_counts", "dp_dispatch",
    "effective_active_loras", "grid", "lora_cases", "max_capture_size",
    "resolve_mode", "weakest_support", "check_compile_sizes", "compilation_defaults", "is_uniform_decode",
    "uniform_token_count", "without_piecewise", "prompt_step_runs_as_decode",
]
