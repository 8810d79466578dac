"""Mode resolution: what a requested graph mode becomes given the attention backends (SPEC 5).

Every downgrade adds a warning; an impossible request raises ValueError saying what would work.
vLLM keeps two inputs apart that decide it: whether attention is among the splitting ops (the
forward is cut at attention, so attention may run eagerly between pieces) and whether piecewise
graphs can be captured at all (a compiled submodule, or breakable CUDA graphs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .modes import AttentionCGSupport, CUDAGraphMode

RELEASES = ("0.33", "0.25")  # vLLM releases whose resolution this module knows (docs/spec.md 11)


@dataclass(frozen=True)
class Resolution:
    requested: CUDAGraphMode
    resolved: CUDAGraphMode
    warnings: tuple[str, ...] = field(default=())


def without_piecewise(mode: CUDAGraphMode, release: str = "0.33") -> CUDAGraphMode:
    """What a mode that needs piecewise graphs becomes where none can be captured.

    vLLM 0.33 keeps the FULL decode routine (CUDAGraphMode.without_piecewise); 0.25 turns any such
    mode into NONE (VllmConfig.__post_init__)."""
    if not mode.has_piecewise():
        return mode
    if release == "0.25" or mode is CUDAGraphMode.PIECEWISE:
        return CUDAGraphMode.NONE
    return CUDAGraphMode.FULL_DECODE_ONLY


def config_time_mode(
    requested: CUDAGraphMode | str,
    *,
    attention_in_splitting_ops: bool = True,
    splitting_ops_empty: bool = False,
    piecewise_capture: bool | None = None,
    attention_quant_fusion: bool = False,
    release: str = "0.33",
) -> CUDAGraphMode:
    """The mode vLLM's config holds before any attention backend is known (VllmConfig.__post_init__,
    CompilationConfig.set_splitting_ops_for_v1): resolve_mode's first half, with the same inputs."""
    split = attention_in_splitting_ops and not splitting_ops_empty and not attention_quant_fusion
    piecewise = split if piecewise_capture is None else piecewise_capture
    return _config_time(CUDAGraphMode.parse(requested), split=split, piecewise=piecewise, release=release,
                        splitting_ops_empty=splitting_ops_empty, attention_quant_fusion=attention_quant_fusion)[0]


def _config_time(mode: CUDAGraphMode, *, split: bool, piecewise: bool, release: str, splitting_ops_empty: bool,
                 attention_quant_fusion: bool) -> tuple[CUDAGraphMode, tuple[str, ...]]:
    warnings: list[str] = []
    if release not in RELEASES:
        raise ValueError(f"release must be one of {', '.join(RELEASES)} (vLLM releases modelled), got {release!r}")

    def downgrade(to: CUDAGraphMode, why: str) -> None:
        nonlocal mode
        if to is not mode:
            warnings.append(f"cudagraph_mode {mode.name} -> {to.name}: {why}")
            mode = to

    if attention_quant_fusion and mode.has_piecewise():
        downgrade(CUDAGraphMode.FULL, "the attention-quant fusion empties the splitting ops, so no pieces exist")
    if splitting_ops_empty and mode is CUDAGraphMode.FULL_AND_PIECEWISE:
        downgrade(CUDAGraphMode.FULL, "splitting_ops is empty, so the whole forward is one piece")
    if splitting_ops_empty and mode is CUDAGraphMode.PIECEWISE:
        downgrade(CUDAGraphMode.NONE, "splitting_ops is empty, so there are no pieces to capture")
    if not piecewise and mode.has_piecewise():
        downgrade(without_piecewise(mode, release), "piecewise graphs cannot be captured (no piecewise compilation)")
    return mode, tuple(warnings)


def resolve_mode(
    requested: CUDAGraphMode | str,
    support: AttentionCGSupport | str,
    *,
    num_speculative_tokens: int = 0,
    attention_in_splitting_ops: bool = True,
    splitting_ops_empty: bool = False,
    piecewise_capture: bool | None = None,
    attention_quant_fusion: bool = False,
    release: str = "0.33",
) -> Resolution:
    """Resolve like vLLM: the mode that the weakest backend can honour, with the same fallbacks.

    `attention_in_splitting_ops`: the forward is cut at attention (vLLM's
    splitting_ops_contain_attention). `piecewise_capture`: piecewise graphs can be captured (vLLM's
    piecewise compilation or breakable CUDA graphs); None keeps the older single-flag meaning,
    available exactly where attention is split. `attention_quant_fusion`: vLLM's fuse_attn_quant
    pass under piecewise compilation without Inductor partition, which needs attention inside one
    graph. `release`: the vLLM release whose rules apply.
    """
    requested = CUDAGraphMode.parse(requested)
    support = AttentionCGSupport.parse(support)
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {num_speculative_tokens!r}")
    q = 1 + num_speculative_tokens
    split = attention_in_splitting_ops and not splitting_ops_empty and not attention_quant_fusion
    piecewise = split if piecewise_capture is None else piecewise_capture
    mode, warnings = _config_time(requested, split=split, piecewise=piecewise, release=release,
                                  splitting_ops_empty=splitting_ops_empty, attention_quant_fusion=attention_quant_fusion)
    warnings = list(warnings)

    def downgrade(to: CUDAGraphMode, why: str) -> None:
        nonlocal mode
        if to is not mode:
            warnings.append(f"cudagraph_mode {mode.name} -> {to.name}: {why}")
            mode = to

    # Runner-time rules: what the weakest attention backend can be captured with.
    if mode.mixed_mode() is CUDAGraphMode.FULL and support is not AttentionCGSupport.ALWAYS:
        if support is AttentionCGSupport.NEVER:
            raise ValueError(
                f"cudagraph_mode {requested.name} needs full graphs of mixed batches, but the attention "
                f"backend's graph support is NEVER; use cudagraph_mode=PIECEWISE (with attention in "
                f"splitting_ops) or NONE"
            )
        if split:
            downgrade(CUDAGraphMode.FULL_AND_PIECEWISE,
                      f"attention supports only {support.name} in full graphs; mixed batches run piecewise")
        else:
            downgrade(CUDAGraphMode.FULL_DECODE_ONLY,
                      f"attention supports only {support.name} in full graphs; mixed batches run eager")

    if mode.decode_mode() is CUDAGraphMode.FULL and support is AttentionCGSupport.NEVER:
        downgrade(CUDAGraphMode.PIECEWISE if split else CUDAGraphMode.NONE, "attention cannot be captured (NEVER)")

    if mode.decode_mode() is CUDAGraphMode.FULL and q > 1 and support < AttentionCGSupport.UNIFORM_BATCH:
        downgrade(CUDAGraphMode.PIECEWISE if split else CUDAGraphMode.NONE,
                  f"uniform decode of q={q} tokens per request needs UNIFORM_BATCH support, attention has {support.name}")

    # vLLM 0.33 checks once more at the runner: a fallback to pieces needs piecewise capture too.
    if release == "0.33" and not piecewise and mode.has_piecewise():
        downgrade(without_piecewise(mode, release), "piecewise graphs cannot be captured (no piecewise capture)")

    if mode.has_full() and support is AttentionCGSupport.NEVER:
        raise ValueError(
            f"cudagraph_mode {mode.name} keeps full graphs, but attention graph support is NEVER; "
            f"use PIECEWISE or NONE"
        )
    return Resolution(requested, mode, tuple(warnings))
