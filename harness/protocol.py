"""The runtime protocol: what a runtime gives the harness, and nothing more.

A runtime is an object with a `name`, a `version`, `capabilities` and the operations those
capabilities promise; the harness calls nothing else. Policy operations answer questions
(sizes, padding, dispatch, resolution); execution operations build an engine and run steps.
Types are plain data (strings from harness.vocabulary, ints, tensors), so a runtime from any
package can answer without importing more than this module. docs/authoring.md gives each
operation's contract with a failing example.

Sizes have one name each: `num_real_tokens` and `num_real_rows` count what a batch brings,
`num_padded_tokens` and `num_padded_rows` what a step or a graph runs at (real rows first, then
padding). `size` means a capture size only. The 0.3.0 names stay as deprecated aliases
(harness/moved.py: `RENAMED`).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Protocol, Sequence

from harness.moved import NAMES_REMOVED_IN, REPLACED, deprecation, name_message, renamed
from harness.vocabulary import CONFIG_MODES, RUNTIME_MODES, SUPPORT_LEVELS  # noqa: F401 (re-exported)
from harness.vocabulary import SPEC_RELEASE, VLLM_RELEASES, parse_rules, rules_name


# Capabilities hold two kinds of thing. Operations: what the harness may ask the runtime (each turns
# on methods or arguments of the protocol). Facts: what the runtime declares about how it works, which
# the suites read to choose their expectations. An engine's own facts are named data in
# `declarations` (DECLARATIONS lists those the harness reads), never a new field per engine.
OPERATIONS = ("capture_sizes", "dispatch", "mode_resolution", "data_parallel", "lora", "speculative", "execution",
              "lora_steps", "speculative_steps", "rejected_drafts", "graph_backends", "attention_backends", "padding_fills",
              "loads_checkpoint", "kv_inspection", "input_inspection", "address_checks", "data_parallel_execution")
FACTS = ("rules", "batch_invariant", "outputs_alias_graph_buffers", "lazy_capture", "precision",
         "memory_kept_per_build", "declarations", "notes")
DECLARATIONS = {  # name -> what declaring it (true) says; the suites check each one they read
    "random_padding_ids": "padded rows get token ids drawn anew every step (LMDeploy's, for MoE routing)",
    # A tuple of dtypes: the LoRA suite builds its engines in the first where the suites' dtype is not
    # among them, and holds the runtime to refusing a LoRA build in any other.
    "lora_dtypes": "the only dtypes its engines run LoRA adapters in (vLLM's LoRA kernels: float16, bfloat16)",
}


class _Declarations(dict):
    """A read-only dict that hashes, so that Capabilities stays a frozen, hashable value (and a report
    writes it as JSON)."""

    def __hash__(self):
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))

    def _read_only(self, *args, **kwargs):
        raise TypeError("Capabilities.declarations is read-only: declare them when you build the Capabilities")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self):  # pickled and copied whole, not item by item
        return (_Declarations, (dict(self),))


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can be asked (operations) and what it declares (facts). Suites declare needs with
    `@pytest.mark.requires(name)`, for a switch of either kind (`has(name)`)."""

    # -- operations: what may be asked --------------------------------------------------------
    # policy
    capture_sizes: bool = False  # capture_sizes() and padded_size()
    dispatch: bool = False  # dispatch()
    mode_resolution: bool = False  # resolve_mode()
    data_parallel: bool = False  # dp_dispatch()
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
    # -- facts: what the runtime declares -----------------------------------------------------
    # The rules its sizes, keys and resolution follow, by name (vocabulary.parse_rules): "vllm-0.33"
    # (vLLM 0.33's, for the runner each config asks), "vllm-0.25/v2" (one runner), "lmdeploy-0.18".
    # The harness holds vLLM's rules to the spec (docs/spec.md 3-5); None or "": the runtime's own rules,
    # each answer checked against what its engine does.
    rules: str | None = None
    batch_invariant: bool = False  # padded graph rows equal an unpadded eager run bit for bit
    outputs_alias_graph_buffers: bool = False  # a step's logits are overwritten by the next step
    lazy_capture: bool = False  # graphs are recorded while serving, each shape once, not by capture()
    precision: str = "ieee"  # how its arithmetic is done, one of PRECISIONS (vocabulary.py)
    # Device bytes a closed engine may leave allocated: what the engine's library keeps per build
    # that Engine.close() cannot release. The harness measures every build; more is a leak (docs/reliability.md).
    memory_kept_per_build: int = 0
    declarations: Mapping[str, Any] = field(default_factory=dict)  # an engine's own facts by name (DECLARATIONS)
    notes: str = ""  # shown in the report header: what is emulated, what stands in

    def __post_init__(self):
        object.__setattr__(self, "declarations", _Declarations(self.declarations or {}))

    def has(self, name: str) -> bool:
        """Whether a switch is on: an operation, a true fact, or `vllm_rules` (the rules are vLLM's)."""
        if name in OLD_SWITCHES:
            new = OLD_SWITCHES[name]
            warnings.warn(deprecation(f"Capabilities.has({name!r})", new, NAMES_REMOVED_IN), DeprecationWarning,
                          stacklevel=2)
            return self.vllm_release is not None if name == "vllm_policy" else self.declares(name)
        if name == "vllm_rules":
            return self.vllm_release is not None
        if name not in self.names():
            raise KeyError(name)
        return bool(getattr(self, name))

    def declares(self, name: str) -> bool:
        """Whether the runtime declares one of its own facts (`declarations`) true."""
        return bool(self.declarations.get(name))

    @property
    def rules_family(self) -> str | None:
        """Whose rules: "vllm", "lmdeploy", ...; None for a runtime that follows its own."""
        return parse_rules(self.rules).family

    @property
    def vllm_release(self) -> str | None:
        """The vLLM release whose rules the runtime follows ("0.33"); None where they are not vLLM's."""
        parsed = parse_rules(self.rules)
        return parsed.release if parsed.family == "vllm" else None

    @property
    def vllm_runners(self) -> tuple[str, ...]:
        """The vLLM model runners whose rules the runtime follows: the one its rules name, else every
        runner the harness models for its release; () where the rules are not vLLM's."""
        release = self.vllm_release
        if release is None:
            return ()
        runner = parse_rules(self.rules).runner
        return (runner,) if runner else VLLM_RELEASES[release].runners if release in VLLM_RELEASES else ()

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in VALUES] + ["vllm_rules"]  # the switches

    def summary(self) -> str:
        on = [name for name in self.names() if name != "vllm_rules" and getattr(self, name) is True]
        on += [name for name in self.declarations if self.declares(name)]
        text = ", ".join(on) or "none"
        if self.rules:
            text += f"; rules: {self.rules}"
        if self.graph_backends:
            text += f"; graph backends: {', '.join(self.graph_backends)}"
        if self.execution:
            text += f"; precision: {self.precision}"
        return text


# Facts that are values, not switches.
VALUES = ("notes", "precision", "memory_kept_per_build", "rules", "declarations")
# 0.3.0's switches that became a rules name or a declaration: has(old) warns and answers.
OLD_SWITCHES = {"vllm_policy": "has('vllm_rules')", "random_padding_ids": "declares('random_padding_ids')"}


def _capabilities_from_old(kwargs: dict) -> dict:
    """0.3.0's keywords (vllm_policy, vllm_version, random_padding_ids) as the new fields, each warning."""
    policy, version = kwargs.pop("vllm_policy", None), kwargs.pop("vllm_version", None)
    for old, value in (("vllm_policy", policy), ("vllm_version", version)):
        if value is not None:
            _warn("Capabilities", old, 'rules (a name such as "vllm-0.33")', stacklevel=4)
    if policy is not None or version is not None:
        kwargs["rules"] = rules_name("vllm", version or SPEC_RELEASE) if policy else kwargs.get("rules")
    if "random_padding_ids" in kwargs:
        _warn("Capabilities", "random_padding_ids", "declarations={'random_padding_ids': True}", stacklevel=4)
        kwargs["declarations"] = {**(kwargs.get("declarations") or {}),
                                  "random_padding_ids": bool(kwargs.pop("random_padding_ids"))}
    return kwargs


def _warn(owner: str, old: str, new: str, stacklevel: int) -> None:
    warnings.warn(name_message(owner, old, new), DeprecationWarning, stacklevel=stacklevel)


def _old_reader(owner: str, old: str, new: str, read):
    def getter(self):
        _warn(owner, old, new, stacklevel=3)
        return read(self)
    return property(getter, doc=f"Deprecated: {new}.")


def _accept_old_keywords(cls, convert):
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **convert(kwargs))

    cls.__init__ = __init__


_accept_old_keywords(Capabilities, _capabilities_from_old)
Capabilities.vllm_policy = _old_reader("Capabilities", "vllm_policy", "has('vllm_rules')",
                                       lambda c: c.vllm_release is not None)
Capabilities.vllm_version = _old_reader("Capabilities", "vllm_version", "vllm_release",
                                        lambda c: c.vllm_release or SPEC_RELEASE)
Capabilities.random_padding_ids = _old_reader("Capabilities", "random_padding_ids", "declares('random_padding_ids')",
                                              lambda c: c.declares("random_padding_ids"))
REPLACED.update({"Capabilities.vllm_policy": "Capabilities.rules", "Capabilities.vllm_version": "Capabilities.rules",
                "Capabilities.random_padding_ids": "Capabilities.declarations"})


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
    # The rules the question is asked under, as Capabilities.rules names them: "vllm-0.33/v1" asks for
    # vLLM 0.33's V1 runner (docs/runners.md). "": the runtime's declared rules; for vLLM's, the spec
    # release's V2 runner (the one vLLM 0.33 runs). The harness asks in the runtime's declared release.
    rules: str = ""

    @property
    def query_len(self) -> int:
        return 1 + self.num_speculative_tokens

    @property
    def vllm_release(self) -> str:
        """The vLLM release the question is asked in: its rules' release, else the spec's."""
        parsed = parse_rules(self.rules)
        return parsed.release if parsed.family == "vllm" and parsed.release else SPEC_RELEASE

    @property
    def vllm_runner(self) -> str:
        """vLLM's model runner whose rules apply: its rules' runner, else "v2"."""
        parsed = parse_rules(self.rules)
        return parsed.runner if parsed.family == "vllm" and parsed.runner else "v2"


def _policy_from_old(kwargs: dict) -> dict:
    """0.3.0's runner and vllm_version keywords as one rules name, each warning."""
    runner, version = kwargs.pop("runner", None), kwargs.pop("vllm_version", None)
    if runner is None and version is None:
        return kwargs
    for old, value in (("runner", runner), ("vllm_version", version)):
        if value is not None:
            _warn("PolicyConfig", old, 'rules (a name such as "vllm-0.33/v2")', stacklevel=4)
    given = parse_rules(kwargs.get("rules") or "")
    kwargs["rules"] = rules_name("vllm", version or given.release or SPEC_RELEASE, runner or given.runner or "v2")
    return kwargs


_accept_old_keywords(PolicyConfig, _policy_from_old)
PolicyConfig.runner = _old_reader("PolicyConfig", "runner", "vllm_runner", lambda c: c.vllm_runner)
PolicyConfig.vllm_version = _old_reader("PolicyConfig", "vllm_version", "vllm_release", lambda c: c.vllm_release)
REPLACED.update({"PolicyConfig.runner": "PolicyConfig.rules", "PolicyConfig.vllm_version": "PolicyConfig.rules"})


@renamed(num_tokens="num_padded_tokens", num_reqs="num_padded_rows")
@dataclass(frozen=True)
class Descriptor:
    """A graph key (vLLM's BatchDescriptor): the padded sizes the step runs at (the real ones on an
    eager step, which pads nothing). num_padded_rows is None on relaxed keys."""

    num_padded_tokens: int
    num_padded_rows: int | None = None
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


@renamed(num_tokens="num_real_tokens", num_reqs="num_real_rows")
@dataclass(frozen=True)
class RankBatch:
    """One data-parallel rank's batch before the ranks agree: its real sizes."""

    num_real_tokens: int
    num_real_rows: int | None = None
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
    # The harness passes the sizes by position: a runtime may name its parameters as it likes.
    def padded_size(self, config: PolicyConfig, num_real_tokens: int) -> int | None: ...  # None: eager
    def dispatch(self, config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None,
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


@renamed(num_tokens="num_real_tokens", padded_num_tokens="num_padded_tokens")
@dataclass
class StepResult:
    logits: Any  # [num_real_tokens, vocab] tensor, one row per real token in request order
    runtime_mode: str  # what actually ran: one of RUNTIME_MODES
    num_real_tokens: int  # tokens the requests brought
    num_padded_tokens: int  # tokens the step ran at
    # The graph key the step ran under (its adapter count included), the runtime's word; None where
    # it does not say. Required of runtimes that declare lora_steps. Since 0.4.0.
    key: Descriptor | None = None


@dataclass
class StepInputs:
    """The static inputs of the last step at its padded size: real rows first, then padded rows.

    Token rows come first; then, since 0.3.0, the request rows a graph reads (one per request in
    request order, then the rows that pad the batch), each None where the runtime does not expose
    it, with the reason in `not_exposed`."""

    token_ids: Any  # [num_padded_tokens] integer tensor
    positions: Any  # [num_padded_tokens]
    slot_mapping: Any  # [num_padded_tokens]; padded rows hold `padding_slot`
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
    order: Sequence[tuple[str, int]] = ()  # (runtime mode, capture size in tokens) in capture order


class Engine(Protocol):
    """A built model with its caches and graphs; `resolution` is what build() resolved."""

    resolution: Resolution

    def capture(self) -> CaptureReport: ...  # once; a second call raises RuntimeError
    # Under data_parallel, step() is collective: every rank calls it each step and the engine agrees
    # on mode and size itself; an idle rank calls step([]), runs a dummy batch and returns logits of
    # shape [0, vocab] with the mode and padded size it ran. eager_step() never communicates.
    def step(self, requests: Sequence[Request], padding_fill: str | None = None) -> StepResult: ...
    def eager_step(self, requests: Sequence[Request], num_padded_tokens: int) -> StepResult: ...  # by position
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
    refuse a step for lack of blocks (never a silent eager run, never another request's block). Since 0.3.0."""


class UnsupportedCheckpoint(RuntimeError):
    """Raised by `Runtime.build()` when the engine cannot load `EngineConfig.checkpoint`: the message
    names what it lacks ("llama3 RoPE", "gelu_pytorch_tanh", "attention biases"). The session then
    gives one verdict: the tests that need the checkpoint are skipped with that reason, the rest run
    (harness/runtime/checkpoint.py). Since 0.2.0."""


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "CONFIG_MODES", "RUNTIME_MODES", "SUPPORT_LEVELS", "VALUES", "OPERATIONS", "FACTS", "DECLARATIONS",
    "CaptureReport", "Capabilities", "Descriptor", "Dispatch", "Engine", "EngineConfig", "KVCacheFull", "PolicyConfig",
    "RankBatch", "Request", "Resolution", "ResolveRequest", "Runtime", "RuntimeUnavailable", "StepInputs",
    "StepResult", "UnsupportedCheckpoint",
]
