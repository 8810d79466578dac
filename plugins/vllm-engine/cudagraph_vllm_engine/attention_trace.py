"""Which of Triton attention's two kernels each call takes: a probe's trace, off unless asked for.

vLLM 0.25's `unified_attention` launches a 2D kernel, or a 3D one that splits each sequence's KV
into segments and combines them after; the two reduce in different orders. It picks by the rule
`kernel()` restates (`use_3d` in vllm/v1/attention/ops/triton_unified_attention.py; its batch
invariance switch, off here, is left out). With CUDAGRAPH_VLLM_ATTENTION_TRACE set to part of a
test id, every call made during such a test goes to the events log (settings.event) with the rule's
inputs, whether a graph was being captured and torch's float32 matmul precision (a process-wide
knob): a FULL graph's line is its capture, since its replays run no Python, while eager and
PIECEWISE steps call it at every step.
"""
from __future__ import annotations

import os

from . import settings

VARIABLE = "CUDAGRAPH_VLLM_ATTENTION_TRACE"
SEGMENT_BUFFERS = ("num_par_softmax_segments", "softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum")


def kernel(num_seqs: int, max_seqlen_q: int, threshold: int | None, has_segment_buffers: bool) -> str:
    """"3d" where vLLM 0.25 launches the split kernel, else "2d"."""
    split = threshold is not None and has_segment_buffers and max_seqlen_q <= 1 and num_seqs <= threshold
    return "3d" if split else "2d"


def install() -> bool:
    """Wrap the Triton backend's `unified_attention` (once) where the variable asks for it."""
    wanted = os.environ.get(VARIABLE)
    if not wanted:
        return False
    import torch
    import vllm.v1.attention.backends.triton_attn as backend

    original = backend.unified_attention
    if getattr(original, "traced", False):
        return True

    def traced(*args, **kwargs):
        test = os.environ.get("PYTEST_CURRENT_TEST", "")
        if wanted in test:
            try:
                num_seqs, max_q = len(kwargs["seqused_k"]), kwargs["max_seqlen_q"]
                threshold = kwargs.get("seq_threshold_3D")
                buffers = all(kwargs.get(name) is not None for name in SEGMENT_BUFFERS)
                line = (f"capturing={torch.cuda.is_current_stream_capturing()} num_seqs={num_seqs} "
                        f"max_seqlen_q={max_q} max_seqlen_k={kwargs['max_seqlen_k']} threshold={threshold} "
                        f"kernel={kernel(num_seqs, max_q, threshold, buffers)} "
                        f"matmul_precision={torch.get_float32_matmul_precision()}")
            except Exception as error:  # a probe must not change the run it watches
                line = f"not traced: {error!r}"
            settings.event(f"attention {test.split(' ')[0]} {line}")
        return original(*args, **kwargs)

    traced.traced = True
    backend.unified_attention = traced
    return True
