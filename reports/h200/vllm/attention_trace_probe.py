"""Which of Triton attention's two kernels each call takes: the probe behind run_9569f4d/events.log
(its `attention` lines), which refuted the 2D/3D lead (README.md, "The lane at 9569f4d"). It ran from
the engine's build then; now it is a pytest plugin, off unless asked for:

    CUDAGRAPH_VLLM_ATTENTION_TRACE=rows_follow PYTHONPATH=reports/h200/vllm:$PYTHONPATH \
        python -m pytest -p attention_trace_probe suites/test_replay_equivalence.py --runtime vllm-engine

vLLM 0.25's `unified_attention` launches a 2D kernel or a 3D one that splits each sequence's KV in
segments (a different reduction order), by the rule `kernel()` restates (`use_3d` in
vllm/v1/attention/ops/triton_unified_attention.py, its batch-invariance switch left out). With
CUDAGRAPH_VLLM_ATTENTION_TRACE set to part of a test id, every call during such a test is an event
(the kit's `EventLog.trace_calls`): the rule's inputs, whether a graph is being captured (a FULL
graph's one line is its capture) and torch's float32 matmul precision (a process-wide knob).
"""
from __future__ import annotations

import os

from cudagraph_vllm_engine import settings

VARIABLE = "CUDAGRAPH_VLLM_ATTENTION_TRACE"
SEGMENT_BUFFERS = ("num_par_softmax_segments", "softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum")


def kernel(num_seqs: int, max_seqlen_q: int, threshold: int | None, has_segment_buffers: bool) -> str:
    """"3d" where vLLM 0.25 launches the split kernel, else "2d"."""
    split = threshold is not None and has_segment_buffers and max_seqlen_q <= 1 and num_seqs <= threshold
    return "3d" if split else "2d"


def describe(*args, **kwargs) -> str:
    """One call of `unified_attention`: the rule's inputs and the kernel it picks."""
    import torch

    num_seqs, max_q = len(kwargs["seqused_k"]), kwargs["max_seqlen_q"]
    threshold = kwargs.get("seq_threshold_3D")
    buffers = all(kwargs.get(name) is not None for name in SEGMENT_BUFFERS)
    return (f"capturing={torch.cuda.is_current_stream_capturing()} num_seqs={num_seqs} max_seqlen_q={max_q} "
            f"max_seqlen_k={kwargs['max_seqlen_k']} threshold={threshold} kernel={kernel(num_seqs, max_q, threshold, buffers)} "
            f"matmul_precision={torch.get_float32_matmul_precision()}")


def install() -> bool:
    """Wrap the Triton backend's `unified_attention` (once) where the variable asks for it."""
    if not os.environ.get(VARIABLE):
        return False  # vLLM's backend module is not even imported
    import vllm.v1.attention.backends.triton_attn as backend

    return settings.EVENTS.trace_calls(backend, "unified_attention", VARIABLE, "attention", describe)


def pytest_configure(config) -> None:
    """Installed before any engine is built, once vLLM's environment is set (vLLM reads it at import)."""
    if os.environ.get(VARIABLE):
        settings.apply_environment()
        install()
