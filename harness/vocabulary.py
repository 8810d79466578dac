"""The words the harness and every runtime share: modes, support levels, the resolution table,
the padding rule, and where an expected value comes from. One place for each fact (docs/spec.md
sections 2, 4 and 5 say what they mean).

Plain strings and pure functions, no torch, so a runtime from any package can speak them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

# -- what a run and a step can be asked for ------------------------------------------------------
GRAPH_BACKENDS = ("cuda", "emulated")  # the CPU emulator (harness.graphs.emulator) or real CUDA graphs
PADDING_FILLS = ("zeros", "random", "nan", "inf")  # what step(padding_fill=...) may put in padded rows
# How an engine's arithmetic is done (Capabilities.precision), most exact first: "ieee" float32
# throughout; "tf32" float32 tensors whose matrix products round their inputs to TF32 (Triton's
# default for a float32 dot, cuBLAS with allow_tf32); "bfloat16" / "float16": the engine computes in
# that dtype whatever it is asked, so the harness builds it in that dtype. docs/spec.md gives the
# tolerance each one earns against the float32 anchor.
PRECISIONS = ("ieee", "tf32", "bfloat16", "float16")


# vLLM releases whose graph policy the harness models (Capabilities.rules "vllm-RELEASE"): for each, the
# model runners whose rules it knows and whether it knows its data-parallel agreement. 0.33 is the
# spec (docs/spec.md sections 3-5, docs/runners.md); 0.25 is its V2 and V1 runners where they differ
# (docs/spec.md section 11, from each release's own code: reports/policy-compare/vllm-0.25-vs-0.33.md,
# reports/policy-compare/vllm-0.25-v1-vs-oracle.md).
@dataclass(frozen=True)
class VllmRelease:
    runners: tuple[str, ...]
    data_parallel: bool


SPEC_RELEASE = "0.33"
VLLM_RELEASES = {"0.33": VllmRelease(("v1", "v2"), data_parallel=True), "0.25": VllmRelease(("v2", "v1"), data_parallel=False)}


# -- rules names: whose policy a runtime follows (Capabilities.rules, PolicyConfig.rules) ------
@dataclass(frozen=True)
class Rules:
    family: str | None  # "vllm", "lmdeploy", ...; None: a runtime's own rules
    release: str | None  # "0.33"
    runner: str | None  # a vLLM model runner, "v1" or "v2"; None: not named


def parse_rules(name: str | None) -> Rules:
    """"vllm-0.33/v2" -> Rules("vllm", "0.33", "v2"); "lmdeploy-0.18" -> Rules("lmdeploy", "0.18", None);
    None or "" -> a runtime's own rules. ValueError for a name of another shape."""
    if not name:
        return Rules(None, None, None)
    if not isinstance(name, str):
        raise ValueError(f"a rules name is a string such as 'vllm-0.33/v2', got {name!r}")
    head, slash, runner = name.partition("/")
    family, _, release = head.partition("-")
    if not family or not release or "/" in runner or (slash and not runner):
        raise ValueError(f"a rules name is ENGINE-RELEASE[/RUNNER], such as 'vllm-0.33/v2' or 'lmdeploy-0.18'; "
                         f"got {name!r}")
    return Rules(family, release, runner or None)


def rules_name(family: str, release: str, runner: str | None = None) -> str:
    return f"{family}-{release}" + (f"/{runner}" if runner else "")


def engine_dtype(precision: str) -> str:
    """The dtype the harness builds an engine in: the precision where it names one, else float32."""
    return precision if precision in ("bfloat16", "float16") else "float32"

# -- modes (spec section 2) -------------------------------------------------------------------
# What one step runs, lowest first: data-parallel ranks agree on the lowest.
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
FDO, FAP = "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"
CONFIG_MODES = ("NONE", "PIECEWISE", "FULL", FDO, FAP)
# A config mode is a pair of routines: (uniform decode batches, every other batch).
ROUTINES = {
    "NONE": ("NONE", "NONE"),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE"),
    "FULL": ("FULL", "FULL"),
    FDO: ("FULL", "NONE"),
    FAP: ("FULL", "PIECEWISE"),
}


GRAPH_MODES = tuple(m for m in CONFIG_MODES if m != "NONE")  # the config modes that capture graphs
# The config modes whose mixed routine is a graph: prefill and mixed batches replay one there too.
MIXED_GRAPH_MODES = tuple(m for m in CONFIG_MODES if ROUTINES[m][1] != "NONE")


def lowest(modes) -> str:
    return min(modes, key=RUNTIME_MODES.index)


# -- attention graph support (spec section 5), strongest first --------------------------------
SUPPORT_LEVELS = ("ALWAYS", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE", "NEVER")
SHORT_NAMES = {"UNIFORM_SINGLE_TOKEN_DECODE": "USTD"}


def weakest(levels) -> str:
    """A model with several attention backends takes the weakest one's level."""
    return max(levels, key=SUPPORT_LEVELS.index)


# -- mode resolution (spec section 5) ---------------------------------------------------------
ERROR = "error"
# requested -> resolved, one column per SUPPORT_LEVELS entry; default set-up, q = 1.
RESOLUTION_TABLE = {
    "NONE": ("NONE", "NONE", "NONE", "NONE"),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE", "PIECEWISE", "PIECEWISE"),
    "FULL": ("FULL", FAP, FAP, ERROR),
    FDO: (FDO, FDO, FDO, "PIECEWISE"),
    FAP: (FAP, FAP, FAP, "PIECEWISE"),
}
# Without attention in the splitting ops and without piecewise capture (no piecewise graphs at all),
# vLLM 0.33 (docs/spec.md 5.3); None: the spec fixes no value.
RESOLUTION_TABLE_NO_PIECEWISE = {
    "NONE": ("NONE", "NONE", "NONE", "NONE"),
    "PIECEWISE": ("NONE", "NONE", "NONE", "NONE"),
    "FULL": ("FULL", FDO, FDO, ERROR),
    FDO: (FDO, FDO, FDO, "NONE"),
    FAP: (FDO, FDO, FDO, "NONE"),
}
# Where a release departs from the table above (docs/spec.md section 11): vLLM 0.25 turns every mode
# that needs piecewise graphs into NONE when none can be captured.
RESOLUTION_NO_PIECEWISE_BY_RELEASE = {"0.25": {FAP: ("NONE", "NONE", "NONE", "NONE")}}


@dataclass(frozen=True)
class ExpectedResolution:
    resolved: str | None  # None: the spec fixes no value for this cell
    error: bool = False


def expected_resolution(mode: str, support: str, num_speculative_tokens: int = 0,
                        attention_in_splitting_ops: bool = True,
                        splitting_ops_empty: bool = False, vllm_version: str = "0.33",
                        piecewise_capture: bool = True) -> ExpectedResolution:
    """The spec's cell for a request, with its q > 1 and empty-splitting-ops rules applied, for the
    given vLLM release. Without piecewise capture the cells are those without attention split: a
    downgrade to pieces is undone by vLLM 0.33's second check (docs/spec.md 5.3). (The calculator's
    resolve_mode answers the finer inputs too: capture without attention split, the fusion.)"""
    piecewise = attention_in_splitting_ops and not splitting_ops_empty and piecewise_capture
    if splitting_ops_empty and mode == FAP:
        mode = "FULL"
    table = RESOLUTION_TABLE
    if not piecewise:
        table = {**RESOLUTION_TABLE_NO_PIECEWISE, **RESOLUTION_NO_PIECEWISE_BY_RELEASE.get(vllm_version, {})}
    cell = table[mode][SUPPORT_LEVELS.index(support)]
    if cell == ERROR:
        return ExpectedResolution(None, error=True)
    if (num_speculative_tokens > 0 and cell is not None and ROUTINES[cell][0] == "FULL"
            and support in ("UNIFORM_SINGLE_TOKEN_DECODE", "NEVER")):
        cell = "PIECEWISE" if piecewise else "NONE"
    return ExpectedResolution(cell)


# -- padding (spec section 4) -----------------------------------------------------------------
def padded(sizes, num_real_tokens: int) -> int | None:
    """The smallest capture size that holds num_real_tokens; None above the largest (runs eager)."""
    sizes = sorted(sizes)
    index = bisect.bisect_left(sizes, num_real_tokens)
    return sizes[index] if index < len(sizes) else None


def waste_percent(num_real_tokens: int, padded_to: int) -> float:
    return 100.0 * (padded_to - num_real_tokens) / padded_to


# -- where an expected value comes from (every failure message names one) ---------------------
SPEC = "the spec (vLLM's policy)"
CONTRACT = "the protocol's rules for every runtime (docs/authoring.md)"
ORACLE = "the harness's independent oracle"
OWN_POLICY = "the runtime's own declared policy"
INDEPENDENT_FORWARD = "an independent forward (transformers on the same checkpoint)"
EAGER = "an eager step of the same runtime at the same shape"
OBSERVED = "what the harness observed"
RUNTIME_WORD = "the runtime's own report (not observable by the harness)"


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "GRAPH_BACKENDS", "PADDING_FILLS", "PRECISIONS", "VllmRelease", "SPEC_RELEASE", "VLLM_RELEASES",
    "Rules", "parse_rules", "rules_name",
    "engine_dtype", "RUNTIME_MODES", "FDO", "FAP", "CONFIG_MODES", "ROUTINES", "GRAPH_MODES",
    "MIXED_GRAPH_MODES", "lowest", "SUPPORT_LEVELS", "SHORT_NAMES", "weakest", "ERROR",
    "RESOLUTION_TABLE", "RESOLUTION_TABLE_NO_PIECEWISE", "ExpectedResolution",
    "expected_resolution", "padded", "waste_percent", "SPEC", "CONTRACT", "ORACLE", "OWN_POLICY",
    "INDEPENDENT_FORWARD", "EAGER", "OBSERVED", "RUNTIME_WORD",
]
