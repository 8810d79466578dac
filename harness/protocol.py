"""The runtime protocol: what a runtime gives the harness, and nothing more.

A runtime is an object with a `name`, a `version`, a `capabilities` dataclass and the
operations below. Policy operations are pure questions (sizes, padding, dispatch,
resolution); execution operations build an engine and run steps. A runtime answers
only what its capabilities declare; the harness never calls the rest.

Types here are plain data (strings for modes and support levels, ints, tuples) so that
a runtime from any package, vLLM's included, can answer without importing ours.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")
CONFIG_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
SUPPORT_LEVELS = ("NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS")


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can be asked. Suites declare needs with `@pytest.mark.requires(name)`."""

    capture_sizes: bool = False  # answers capture_sizes() and padded_size()
    vllm_policy: bool = False  # its sizes, keys and resolution follow vLLM's grid and table
    dispatch: bool = False  # answers dispatch()
    mode_resolution: bool = False  # answers resolve_mode()
    data_parallel: bool = False  # answers dp_dispatch()
    lora: bool = False  # dispatch() takes num_active_loras
    speculative: bool = False  # policy takes num_speculative_tokens > 0
    execution: bool = False  # build() gives an Engine
    graph_backends: tuple[str, ...] = ()  # e.g. ("emulated", "cuda")
    batch_invariant: bool = False  # graph rows equal an unpadded eager run bit for bit
    outputs_alias_graph_buffers: bool = False  # a step's outputs are overwritten by the next replay
    attention_backends: tuple[tuple[str, str], ...] = ()  # (backend name, declared support level)
    padding_fills: tuple[str, ...] = ()  # what step(padding_fill=...) can put in padded rows
    kv_inspection: bool = False  # engines answer kv_snapshot() and slot_of()
    address_checks: bool = False  # engines answer swap_static_buffer() (to prove a moved input fails)
    notes: str = ""  # free text shown in the report header (what is emulated, what stands in)

    def has(self, name: str) -> bool:
        value = getattr(self, name, None)
        if value is None:
            raise KeyError(name)
        return bool(value)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "notes"]

    def summary(self) -> str:
        on = [f.name for f in fields(self) if f.name != "notes" and isinstance(getattr(self, f.name), bool) and getattr(self, f.name)]
        text = ", ".join(on) or "none"
        if self.graph_backends:
            text += f"; graph backends: {', '.join(self.graph_backends)}"
        return text


@dataclass(frozen=True)
class PolicyConfig:
    """Scheduler limits and graph options that decide sizes and keys (SPEC 3-4)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: the runtime's default (vLLM: 8192)
    num_speculative_tokens: int = 0
    platform_max: int = 512  # 1024 on SM100 (B200 class)
    capture_sizes: tuple[int, ...] | None = None  # user-given sizes
    max_capture_size: int | None = None  # user-given max
    mode: str = "FULL_AND_PIECEWISE"  # the (resolved) config mode
    max_loras: int = 0  # 0: LoRA off
    specialize_lora: bool = True  # separate graphs with and without LoRA
    specialize_active_loras: bool = False  # separate graphs per captured adapter count

    @property
    def query_len(self) -> int:
        return 1 + self.num_speculative_tokens


@dataclass(frozen=True)
class Descriptor:
    """A graph key (vLLM's BatchDescriptor). num_reqs is None on relaxed keys."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0


@dataclass(frozen=True)
class Dispatch:
    runtime_mode: str  # one of RUNTIME_MODES
    descriptor: Descriptor


@dataclass(frozen=True)
class ResolveRequest:
    mode: str  # one of CONFIG_MODES
    support: str  # the weakest backend's level, one of SUPPORT_LEVELS
    num_speculative_tokens: int = 0
    attention_in_splitting_ops: bool = True  # piecewise graphs can split at attention
    splitting_ops_empty: bool = False  # nothing to split at: the whole forward is one piece


@dataclass(frozen=True)
class Resolution:
    requested: str
    resolved: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankBatch:
    """One data-parallel rank's batch before the ranks agree."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@runtime_checkable
class Runtime(Protocol):
    """The object a runtime factory returns.

    Policy operations raise ValueError with a message for impossible configs.
    """

    name: str
    version: str
    capabilities: Capabilities

    def capture_sizes(self, config: PolicyConfig) -> Sequence[int]: ...

    def padded_size(self, config: PolicyConfig, num_tokens: int) -> int | None:
        """The graph size a batch of num_tokens runs at; None when it runs eager (above the max)."""

    def dispatch(
        self, config: PolicyConfig, num_tokens: int, num_reqs: int | None = None,
        uniform: bool = False, num_active_loras: int = 0,
    ) -> Dispatch: ...

    def resolve_mode(self, request: ResolveRequest) -> Resolution: ...

    def dp_dispatch(self, config: PolicyConfig, ranks: Sequence[RankBatch]) -> list[Dispatch]:
        """What each data-parallel rank runs once the ranks have agreed."""

    def build(self, config: "EngineConfig") -> "Engine": ...


# ---------------------------------------------------------------------------------------
# Execution (filled by runtimes that declare `execution`)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineConfig:
    """What to build: a model preset on a device, with graph options."""

    preset: str = "tiny"
    dtype: str = "float32"
    device: str = "cpu"
    graph_backend: str = "emulated"  # "cuda" or "emulated"
    mode: str = "FULL_AND_PIECEWISE"
    attention_backends: tuple[str, ...] = ()  # empty: the runtime's default
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(max_num_seqs=16))
    seed: int = 0
    compile: bool = False
    max_model_len: int = 128  # longest request (prompt + output) the engine must hold
    kv_tokens: int | None = None  # KV-cache capacity in tokens; None: the runtime's default
    options: Mapping[str, Any] = field(default_factory=dict)  # runtime-specific extras


@dataclass(frozen=True)
class Request:
    """One request's part of a step: the tokens it brings and the KV it has."""

    request_id: int
    token_ids: tuple[int, ...]  # 1 for decode, q for a verify step, more for prefill
    context_len: int  # tokens already in the KV cache before this step


@dataclass
class StepResult:
    logits: Any  # [num_real_tokens, vocab] tensor
    runtime_mode: str  # what actually ran
    num_tokens: int  # real tokens
    padded_num_tokens: int  # tokens the step ran at


@dataclass
class CaptureReport:
    graphs: Mapping[str, int]  # runtime mode -> graphs captured
    seconds: float
    memory_bytes: int | None
    order: Sequence[tuple[str, int]] = ()  # (runtime mode, num_tokens) in capture order


class Engine(Protocol):
    """A built model with its caches and graphs.

    `resolution` is the mode the engine resolved at build time from the requested mode and
    its attention backends.
    """

    resolution: Resolution

    def capture(self) -> CaptureReport: ...

    def step(self, requests: Sequence[Request], padding_fill: str | None = None) -> StepResult:
        """Pad, dispatch and run one step as the engine would in service.

        `padding_fill` (one of the capabilities' `padding_fills`) says what padded rows hold
        instead of the engine's own padding values: "zeros", "random", "nan", "inf".
        """

    def eager_step(self, requests: Sequence[Request], padded_num_tokens: int) -> StepResult:
        """Run the same step eagerly at a given padded shape (the equality baseline)."""

    def static_buffer_addresses(self) -> Mapping[str, int]: ...

    def capture_report(self) -> CaptureReport: ...

    def launch_counts(self) -> Mapping[str, int]:
        """Submissions per step by runtime mode (kernels for eager, graph launches + copies for graphs)."""

    def release(self, request_id: int) -> None:
        """Forget a finished request and free its KV blocks."""

    def kv_snapshot(self) -> Any:
        """A copy of every real KV-cache slot, indexed by slot first (capability kv_inspection)."""

    def slot_of(self, request_id: int, position: int) -> int:
        """The KV slot that holds a request's position (capability kv_inspection)."""

    def swap_static_buffer(self, name: str) -> None:
        """Replace a static input with a new tensor, as a buggy step would (capability address_checks).

        The next replay of any graph that reads it must raise instead of computing on stale memory.
        """
