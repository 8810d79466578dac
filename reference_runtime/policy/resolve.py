"""Mode resolution: what a requested graph mode becomes given the attention backends (SPEC 5).

Every downgrade adds a warning; an impossible request raises ValueError saying what would work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .modes import AttentionCGSupport, CUDAGraphMode


@dataclass(frozen=True)
class Resolution:
    requested: CUDAGraphMode
    resolved: CUDAGraphMode
    warnings: tuple[str, ...] = field(default=())


def resolve_mode(
    requested: CUDAGraphMode | str,
    support: AttentionCGSupport | str,
    *,
    num_speculative_tokens: int = 0,
    attention_in_splitting_ops: bool = True,
    splitting_ops_empty: bool = False,
) -> Resolution:
    """Resolve like vLLM: the mode that the weakest backend can honour, with the same fallbacks.

    `attention_in_splitting_ops` means piecewise graphs split at attention, so attention can run
    eagerly between pieces; without it a PIECEWISE routine is not available.
    """
    requested = CUDAGraphMode.parse(requested)
    support = AttentionCGSupport.parse(support)
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {num_speculative_tokens!r}")
    q = 1 + num_speculative_tokens
    piecewise = attention_in_splitting_ops and not splitting_ops_empty
    mode = requested
    warnings: list[str] = []

    def downgrade(to: CUDAGraphMode, why: str) -> None:
        nonlocal mode
        warnings.append(f"cudagraph_mode {mode.name} -> {to.name}: {why}")
        mode = to

    # Config-time rules (vLLM's compilation config), before the backends are consulted.
    if splitting_ops_empty and mode is CUDAGraphMode.FULL_AND_PIECEWISE:
        downgrade(CUDAGraphMode.FULL, "splitting_ops is empty, so the whole forward is one piece")
    if not piecewise and mode.has_piecewise():
        downgrade(CUDAGraphMode.NONE, "piecewise graphs need the forward split at attention (splitting_ops)")

    # Runner-time rules: what the weakest attention backend can be captured with.

    if mode.mixed_mode() is CUDAGraphMode.FULL and support is not AttentionCGSupport.ALWAYS:
        if support is AttentionCGSupport.NEVER:
            raise ValueError(
                f"cudagraph_mode {requested.name} needs full graphs of mixed batches, but the attention "
                f"backend's graph support is NEVER; use cudagraph_mode=PIECEWISE (with attention in "
                f"splitting_ops) or NONE"
            )
        if piecewise:
            downgrade(CUDAGraphMode.FULL_AND_PIECEWISE,
                      f"attention supports only {support.name} in full graphs; mixed batches run piecewise")
        else:
            downgrade(CUDAGraphMode.FULL_DECODE_ONLY,
                      f"attention supports only {support.name} in full graphs; mixed batches run eager")

    if mode.decode_mode() is CUDAGraphMode.FULL and support is AttentionCGSupport.NEVER:
        downgrade(CUDAGraphMode.PIECEWISE if piecewise else CUDAGraphMode.NONE,
                  "attention cannot be captured (NEVER)")

    if mode.decode_mode() is CUDAGraphMode.FULL and q > 1 and support < AttentionCGSupport.UNIFORM_BATCH:
        downgrade(CUDAGraphMode.PIECEWISE if piecewise else CUDAGraphMode.NONE,
                  f"uniform decode of q={q} tokens per request needs UNIFORM_BATCH support, attention has {support.name}")

    if mode.has_full() and support is AttentionCGSupport.NEVER:
        raise ValueError(
            f"cudagraph_mode {mode.name} keeps full graphs, but attention graph support is NEVER; "
            f"use PIECEWISE or NONE"
        )
    return Resolution(requested, mode, tuple(warnings))
