"""The runtime protocol: what a runtime gives the harness, and nothing more.

A runtime is an object with a `name`, a `version`, `capabilities` and the operations those
capabilities promise; the harness calls nothing else. Policy operations answer questions
(sizes, padding, dispatch, resolution); execution operations build an engine and run steps.
Types are plain data (strings from harness.vocabulary, ints, tensors), so a runtime from any
package can answer without importing more than this module. docs/authoring.md gives each
operation's contract with a failing example.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Protocol, Sequence

from harness.vocabulary import CONFIG_MODES, RUNTIME_MODES, SUPPORT_LEVELS  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can be asked. Suites declare needs with `@pytest.mark.requires(name)`."""

    # policy
    capture_sizes: bool = False  # capture_sizes() and padded_size()
    dispatch: bool = False  # dispatch()
    mode_resolution: bool = False  # resolve_mode()
    data_parallel: bool = False  # dp_dispatch()
    vllm_policy: bool = False  # sizes, keys and resolution follow vLLM's (docs/spec.md 3-5)
    vllm_version: str = "0.33"  # under vllm_policy: the release whose rules they follow (vocabulary.VLLM_RELEASES)
    lora: bool = False  # dispatch() takes num_active_loras
    speculative: bool = False  # policies take num_speculative_tokens > 0
    # execution
    execution: bool = False  # build() gives an Engine
    # with lora: build() loads EngineConfig.lora_adapters, a request may name one (Request.lora), and a
    # step says which graph key it ran (StepResult.key). Since 0.4.0.
    lora_steps: bool = False
    speculative_steps: bool = False  # with speculative: build() takes num_speculative_tokens > 0, steps of q tokens
    # with speculative_steps: a step may follow a verify step whose drafts were partly rejected
    # (Request.num_rejected_tokens), and the engine rolls back as vLLM does (docs/spec.md section 6.7)
    rejected_drafts: bool = False
    graph_backends: tuple[str, ...] = ()  # "emulated" (harness.graphs) and/or "cuda"
    attention_backends: tuple[tuple[str, str], ...] = ()  # (name, support level) pairs build() accepts
    padding_fills: tuple[str, ...] = ()  # what step(padding_fill=...) can put in padded rows
    loads_checkpoint: bool = False  # build() loads EngineConfig.checkpoint (a Hugging Face Llama folder)
    kv_inspection: bool = False  # kv_snapshot() and slot_of()
    input_inspection: bool = False  # last_step_inputs()
    address_checks: bool = False  # swap_static_buffer()
    data_parallel_execution: bool = False  # steps agree across ranks through torch.distributed (docs/data_parallel.md)
    batch_invariant: bool = False  # padded graph rows equal an unpadded eager run bit for bit
    outputs_alias_graph_buffers: bool = False  # a step's logits are overwritten by the next step
    lazy_capture: bool = False  # graphs are recorded while serving, each shape once, not by capture()
    random_padding_ids: bool = False  # padded rows get token ids drawn anew every step (LMDeploy's, for MoE routing)
    precision: str = "ieee"  # how its arithmetic is done, one of PRECISIONS (vocabulary.py)
    # Device bytes a closed engine may leave allocated: what the engine's library keeps per build
    # that Engine.close() cannot release. The harness measures every build; more is a leak (docs/reliability.md).
    memory_kept_per_build: int = 0
    notes: str = ""  # shown in the report header: what is emulated, what stands in

    def has(self, name: str) -> bool:
        if name not in self.names():
            raise KeyError(name)
        return bool(getattr(self, name))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in VALUES]  # the switches

    def summary(self) -> str:
        on = [name for name in self.names() if getattr(self, name) is True]
        text = ", ".join(on) or "none"
        if self.graph_backends:
            text += f"; graph backends: {', '.join(self.graph_backends)}"
        if self.execution:
            text += f"; precision: {self.precision}"
        return text


VALUES = ("notes", "precision", "memory_kept_per_build", "vllm_version")  # declarations that are not switches


@dataclass(frozen=True)
class PolicyConfig:
    """Scheduler limits and graph options that decide sizes and keys (docs/spec.md 3-4)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: the runtime's default (vLLM: 8192)
    num_speculative_tokens: int = 0
    platform_max: int = 512  # 1024 on SM100 (B200 class)
    capture_sizes: tuple[int, ...] | None = None  # user-given sizes, in tokens (as capture_sizes() answers)
    max_capture_size: int | None = None  # user-given max, in tokens
    mode: str = "FULL_AND_PIECEWISE"  # a config mode: requested at build(), resolved in policy questions
    max_loras: int = 0  # 0: LoRA off
    specialize_lora: bool = True  # separate graphs with and without LoRA
    specialize_active_loras: bool = False  # separate graphs per captured adapter count
    runner: str = "v2"  # vLLM's model runner whose rules apply: "v1" or "v2" (vLLM 0.33 runs V2; docs/runners.md)
    vllm_version: str = "0.33"  # and the release whose runner: the harness asks in the runtime's declared one

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
    # vLLM's compilation options; a runtime without them is asked only the defaults.
    attention_in_splitting_ops: bool = True  # piecewise graphs can split at attention
    splitting_ops_empty: bool = False  # nothing to split at: the whole forward is one piece
    # Piecewise graphs can be captured (vLLM 0.33's piecewise_capture_available): False where the loaded
    # model gives no compiled pieces, whatever the splitting ops say (docs/spec.md 5.3). vLLM 0.33 only.
    piecewise_capture: bool = True


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


class RuntimeUnavailable(RuntimeError):
    """Raised by a runtime factory that cannot start on this machine (no GPU, its engine not
    installed), with the reason and what would make it start: the harness shows that message alone,
    where any other exception from a factory is shown with its traceback, as a bug."""


class Runtime(Protocol):
    """The object a runtime factory returns. Impossible configs raise ValueError with a message."""

    name: str
    version: str
    capabilities: Capabilities

    def capture_sizes(self, config: PolicyConfig) -> Sequence[int]: ...
    def padded_size(self, config: PolicyConfig, num_tokens: int) -> int | None: ...  # None: eager
    def dispatch(self, config: PolicyConfig, num_tokens: int, num_reqs: int | None = None,
                 uniform: bool = False, num_active_loras: int = 0) -> Dispatch: ...
    def resolve_mode(self, request: ResolveRequest) -> Resolution: ...
    def dp_dispatch(self, config: PolicyConfig, ranks: Sequence[RankBatch]) -> list[Dispatch]: ...
    def build(self, config: EngineConfig) -> Engine: ...


# -- execution ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineConfig:
    """What to build: a model preset on a device, its graph options and scheduler limits."""

    preset: str = "tiny"  # harness.expectations.presets: the model's shape and seeded weights
    dtype: str = "float32"
    device: str = "cpu"
    graph_backend: str = "emulated"  # "cuda" or "emulated"
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64))
    attention_backends: tuple[str, ...] = ()  # names from Capabilities.attention_backends; empty: default
    seed: int = 0
    max_model_len: int = 128  # longest request (prompt + output) the engine must hold
    kv_tokens: int | None = None  # KV capacity in tokens that must be free after capture; None: default
    checkpoint: str | None = None  # a Hugging Face Llama folder to load (capability loads_checkpoint)
    # (rank, world size): one process per rank, torch.distributed initialised by the harness before
    # build() (gloo on the CPU, NCCL with one GPU per rank); step() then agrees with the other ranks.
    data_parallel: tuple[int, int] | None = None
    # PEFT LoRA adapter folders (capability lora_steps; policy.max_loras >= 1): Request.lora = i names
    # the i-th (from 1, as vLLM's lora_int_id). Since 0.4.0.
    lora_adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    """One request's part of a step: the tokens it brings and the KV it has."""

    request_id: int
    token_ids: tuple[int, ...]  # 1 for decode, q for a verify step, more for prefill
    context_len: int  # tokens already in the KV cache before this step (accepted tokens only)
    # Tokens of this request's previous step that the sampler rejected (its last drafts: vLLM's
    # num_rejected_tokens). context_len already leaves them out, as vLLM's scheduler takes them off
    # num_computed_tokens: this step's tokens go at their positions and slots, and their KV is never
    # read. 0, the default: every draft was accepted. Only for runtimes that declare rejected_drafts.
    num_rejected_tokens: int = 0
    # The LoRA adapter this request runs with: an id into EngineConfig.lora_adapters (from 1), or
    # None for the base model. Only for runtimes that declare lora_steps. Since 0.4.0.
    lora: int | None = None


@dataclass
class StepResult:
    logits: Any  # [num_tokens, vocab] tensor, one row per real token in request order
    runtime_mode: str  # what actually ran: one of RUNTIME_MODES
    num_tokens: int  # real tokens
    padded_num_tokens: int  # tokens the step ran at
    # The graph key the step ran under (its adapter count included), the runtime's word; None where
    # it does not say. Required of runtimes that declare lora_steps. Since 0.4.0.
    key: Descriptor | None = None


@dataclass
class StepInputs:
    """The static inputs of the last step at its padded size: real rows first, then padded rows.

    Token rows come first; then, since 0.4.0, the request rows a graph reads (one per request in
    request order, then the rows that pad the batch), each None where the runtime does not expose
    it, with the reason in `not_exposed`."""

    token_ids: Any  # [padded_num_tokens] integer tensor
    positions: Any  # [padded_num_tokens]
    slot_mapping: Any  # [padded_num_tokens]; padded rows hold `padding_slot`
    padding_slot: int = -1  # the slot id that writes nothing
    # Request rows: real rows first, then padded rows (as many as the step staged).
    seq_lens: Any = None  # [num_padded_rows] each row's context after the step
    query_start_loc: Any = None  # [num_padded_rows + 1] where each row's tokens start, non-decreasing
    block_tables: Any = None  # [num_padded_rows, blocks per row] each row's KV blocks
    block_size: int | None = None  # tokens a KV block holds (slot = block * block_size + offset)
    # The block padded rows' tables hold, which no request owns; None: padded rows read no block (length 0).
    padding_block: int | None = None
    # lora_steps: each token row's adapter id (0: none; padded rows 0). Since 0.4.0.
    lora_ids: Any = None  # [padded_num_tokens]
    not_exposed: Mapping[str, str] = field(default_factory=dict)  # a request-row field left None -> why


@dataclass
class CaptureReport:
    graphs: Mapping[str, int]  # runtime mode -> graphs captured
    seconds: float
    memory_bytes: int | None  # graph memory; None where it cannot be measured
    order: Sequence[tuple[str, int]] = ()  # (runtime mode, num_tokens) in capture order


class Engine(Protocol):
    """A built model with its caches and graphs; `resolution` is what build() resolved."""

    resolution: Resolution

    def capture(self) -> CaptureReport: ...  # once; a second call raises RuntimeError
    # Under data_parallel, step() is collective: every rank calls it each step and the engine agrees
    # on mode and size itself; an idle rank calls step([]), runs a dummy batch and returns logits of
    # shape [0, vocab] with the mode and padded size it ran. eager_step() never communicates.
    def step(self, requests: Sequence[Request], padding_fill: str | None = None) -> StepResult: ...
    def eager_step(self, requests: Sequence[Request], padded_num_tokens: int) -> StepResult: ...
    def release(self, request_id: int) -> None: ...  # forget a request, free its KV
    def static_buffer_addresses(self) -> Mapping[str, int]: ...  # graph inputs only, by name
    def kv_snapshot(self) -> Any: ...  # kv_inspection: every KV slot, slot first
    def slot_of(self, request_id: int, position: int) -> int: ...  # kv_inspection
    def last_step_inputs(self) -> StepInputs: ...  # input_inspection
    def swap_static_buffer(self, name: str) -> None: ...  # address_checks: a new tensor, same values
    # Optional: release what the engine holds (its device memory and what its library keeps for it
    # process-wide). The harness calls it once, when it drops the engine; nothing is called after it.
    def close(self) -> None: ...


class KVCacheFull(RuntimeError):
    """Raised by `Engine.step()` when a step needs KV blocks the cache no longer has: the step ran
    nothing and changed nothing, and the engine serves on once blocks are released. The one way to
    refuse a step for lack of blocks (never a silent eager run, never another request's block). Since 0.4.0."""


class UnsupportedCheckpoint(RuntimeError):
    """Raised by `Runtime.build()` when the engine cannot load `EngineConfig.checkpoint`: the message
    names what it lacks ("llama3 RoPE", "gelu_pytorch_tanh", "attention biases"). The session then
    gives one verdict: the tests that need the checkpoint are skipped with that reason, the rest run
    (harness/runtime/checkpoint.py). Since 0.2.0."""


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "CONFIG_MODES", "RUNTIME_MODES", "SUPPORT_LEVELS", "VALUES",
    "CaptureReport", "Capabilities", "Descriptor", "Dispatch", "Engine", "EngineConfig", "KVCacheFull", "PolicyConfig",
    "RankBatch", "Request", "Resolution", "ResolveRequest", "Runtime", "RuntimeUnavailable", "StepInputs",
    "StepResult", "UnsupportedCheckpoint",
]
