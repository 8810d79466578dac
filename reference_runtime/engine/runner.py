"""The model runner: a step goes plan -> stage -> run -> output, each stage handing the next a value.

- plan (plan.py): the requests become a StepPlan: what runs (the dispatcher's answer), the real
  and padded sizes, and the layout in host arrays.
- stage (buffers.py): the plan goes into the static buffers; a FULL graph copies it in itself.
- run and output (strategy.py): the eager forward, the PIECEWISE pieces with attention eager
  between them, or the FULL graph's replay; then a copy of the real rows' logits, the mode that
  ran and the sizes.

Capture (strategy.py) follows vLLM: an eager warm-up per size, PIECEWISE graphs before FULL ones,
the largest size first, every graph in one memory pool, the garbage collector off meanwhile
(`capture_phase`). After the capture phase no graph can be added.

The runner is the protocol's Engine (harness/protocol.py) itself. The parts a plugin or a test
replaces are constructor arguments, each with a narrow protocol (seams.py): `model` (a checkpoint
folder -> Decoder), `backends` (attention backend classes by name), `dispatcher` (the policy's
Dispatcher class), `planner`, `stager` (the static buffers' class), `strategy` (the run
strategy's class), `graphs` (a harness.graphs backend) and `consensus` (the data-parallel
agreement's class); `memory.py` sizes the KV cache to a budget.
"""
from __future__ import annotations

import gc
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import torch

from harness.graphs import make_backend
from harness.protocol import CaptureReport, Resolution, StepInputs, StepResult

from ..policy import Dispatcher, PolicyConfig, resolve_mode, weakest_support
from .attention import BACKENDS, make_backends
from .buffers import NAMES, StaticBuffers
from .data_parallel import DataParallel
from .inspection import POISONS, fill_padding
from .kv_cache import NULL_BLOCK, BlockAllocator, KVCache
from .lora import Adapters
from .model import Decoder
from .plan import Planner, StepPlan
from .strategy import CapturedGraphs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RunnerConfig:
    checkpoint: str  # a Hugging Face Llama folder
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(max_num_seqs=16, max_num_batched_tokens=64))
    dtype: str = "float32"
    device: str = "cpu"
    graph_backend: str = "emulated"  # "cuda" or "emulated"
    attention_backends: tuple[str, ...] = ("static",)  # one name, or one per layer
    block_size: int = 16
    num_blocks: int = 256
    max_model_len: int = 128
    data_parallel: tuple[int, int] | None = None  # (rank, world): steps agree across ranks (data_parallel.py)
    lora_adapters: tuple[str, ...] = ()  # PEFT folders: adapter id i is the i-th (lora.py)


class ModelRunner:
    def __init__(self, config: RunnerConfig, *, model=Decoder.from_checkpoint, backends=BACKENDS,
                 dispatcher=Dispatcher, planner=Planner, stager=StaticBuffers, strategy=CapturedGraphs, graphs=None,
                 consensus=DataParallel):
        if config.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
        self.config = config
        self.device, self.dtype = torch.device(config.device), DTYPES[config.dtype]
        self.model = model(config.checkpoint).to(self.device, self.dtype).eval()
        if config.max_model_len > self.model.max_positions:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {self.model.max_positions} positions")
        m = self.model
        if config.lora_adapters and not config.policy.max_loras:
            raise ValueError(f"{len(config.lora_adapters)} LoRA adapters given, but the policy has max_loras=0 "
                             "(LoRA off): set max_loras to the most adapters one batch may use")
        if config.lora_adapters and config.data_parallel is not None:
            raise ValueError("LoRA adapters under data parallel are not implemented: the ranks agree on a key "
                             "without the adapter count (data_parallel.py)")
        self.adapters = (Adapters.load(config.lora_adapters, m).to(self.device, self.dtype)
                         if config.lora_adapters else None)
        self.cache = KVCache(m.num_layers, config.num_blocks, config.block_size, m.kv_heads, m.head_dim, self.dtype,
                             self.device)
        self.backends = make_backends(config.attention_backends, m.num_layers, self.cache, m.head_dim ** -0.5, backends)
        resolved = resolve_mode(config.policy.mode, weakest_support(b.support for b in self.backends),
                                num_speculative_tokens=config.policy.num_speculative_tokens)
        for message in resolved.warnings:
            warnings.warn(message, stacklevel=2)
        self.resolution = Resolution(resolved.requested.name, resolved.resolved.name, resolved.warnings)
        self.policy = replace(config.policy, mode=resolved.resolved)
        self.dispatcher = dispatcher(self.policy)
        self.dispatcher.initialize_keys()
        max_tokens = max(self.dispatcher.table.max_size if self.dispatcher.table else 0, self.policy.batched_tokens)
        max_rows = max_tokens + 1  # a dummy row for padding beyond the real requests
        self.stager = stager(max_tokens, max_rows, -(-config.max_model_len // config.block_size),
                             config.max_model_len, self.device)
        agreement = consensus(*config.data_parallel, self.device) if config.data_parallel is not None else None
        self.planner = planner(self.dispatcher, BlockAllocator(config.num_blocks, config.block_size), max_rows,
                               agreement)
        self.graphs = graphs if graphs is not None else make_backend(config.graph_backend, self.device)
        self.attn_buffer = torch.zeros(max_tokens, m.heads * m.head_dim, dtype=self.dtype, device=self.device)
        self.strategy = strategy(self)
        self.capture_report: CaptureReport | None = None
        self.graph_memory_estimate: int | None = None  # what fit_kv_cache set aside for graphs
        self.last_plan: StepPlan | None = None

    # -- a step -----------------------------------------------------------------------------
    def step(self, requests, padding_fill: str | None = None) -> StepResult:
        """One step as in service: planned, staged, run, its real rows copied out."""
        plan = self.planner.plan(list(requests), captured=self.capture_report is not None)
        if padding_fill is None or plan.num_padded_tokens == plan.num_real_tokens:
            return self._run(plan)
        filled = fill_padding(plan, padding_fill, self.model.vocab, self.config.max_model_len)
        with self.cache.poisoned(POISONS[padding_fill]) if padding_fill in POISONS else nullcontext():
            return self._run(filled)

    def eager_step(self, requests, num_padded_tokens: int) -> StepResult:
        """The same step run eagerly at a given padded size, laid out as a graph there would be."""
        return self._run(self.planner.plan_eager(list(requests), num_padded_tokens), eager=True)

    def _run(self, plan: StepPlan, eager: bool = False) -> StepResult:
        self.last_plan = plan
        return self.strategy.run(plan, eager)

    def release(self, request_id: int) -> None:
        self.planner.release(request_id)

    # -- what a run strategy reads ----------------------------------------------------------------
    def lora(self, num_active_loras: int):
        """The LoRA op of a step with this many adapters, `(layer, x) -> the fused QKV's delta`
        reading each token row's adapter from the static buffer; None: a step without adapters
        (and every step of an engine without them) runs no LoRA op."""
        if not num_active_loras or self.adapters is None:
            return None
        return lambda layer, x: self.adapters.delta(layer, x, self.stager.lora_ids[: x.shape[0]])

    def attention(self, meta):
        """Every layer's attention for a step: (layer, q, k, v) -> its backend's output."""
        return lambda layer, q, k, v: self.backends[layer](layer, q, k, v, meta)

    def graph_inputs(self, with_attention: bool = False) -> dict[str, torch.Tensor]:
        """The static inputs graphs read, by name (pieces also read the attention buffer)."""
        inputs = self.stager.tensors()
        return inputs | {"attn": self.attn_buffer} if with_attention else inputs

    @property
    def full_graphs(self) -> dict:
        return getattr(self.strategy, "full_graphs", {})

    @property
    def piece_graphs(self) -> dict:
        return getattr(self.strategy, "piece_graphs", {})

    # -- capture ----------------------------------------------------------------------------
    def capture(self) -> CaptureReport:
        if self.capture_report is not None:
            raise RuntimeError("graphs are already captured; the capture phase is over")
        self.capture_report = self.strategy.capture()
        return self.capture_report

    @contextmanager
    def capture_phase(self):
        # No collection during capture: a finalizer run mid-capture could free or allocate device
        # memory inside a graph's recording. Disabling the collector is enough for that. Not
        # gc.freeze()/gc.unfreeze() around it (vLLM's way): unfreeze thaws every frozen object of
        # the process, also those its host froze (a test session, a server after start-up).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.inference_mode():
                yield
        finally:
            if was_enabled:
                gc.enable()

    # -- the memory budget --------------------------------------------------------------------
    def fit_kv_cache(self, utilization: float) -> None:
        """Size the KV cache to `utilization` of the device minus what is in use and what the
        graphs will take (vLLM's budget, memory.py); before capture."""
        from . import memory

        if self.capture_report is not None:
            raise RuntimeError("fit_kv_cache sizes the cache before capture; graphs are already captured")
        self.graph_memory_estimate = memory.estimate_graph_memory(self)
        blocks = memory.kv_blocks(self.cache, utilization, self.graph_memory_estimate)
        self.cache.resize(blocks)
        self.planner.allocator.reset(blocks)

    # -- what the harness may look at ---------------------------------------------------------
    def static_buffer_addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.graph_inputs(with_attention=True).items()}

    def kv_snapshot(self) -> torch.Tensor:
        return self.cache.snapshot()

    def slot_of(self, request_id: int, position: int) -> int:
        return self.planner.allocator.slot(request_id, position)

    def last_step_inputs(self) -> StepInputs:
        """The last step's token ids, positions and slots at its padded size, and the request rows
        it staged (padded rows: the null block)."""
        plan = self.last_plan
        tokens, rows = (plan.num_padded_tokens, plan.staged_rows) if plan else (0, 0)
        return StepInputs(**self.stager.inputs(tokens), padding_slot=-1, **self.stager.request_rows(rows),
                          block_size=self.config.block_size, padding_block=NULL_BLOCK)

    def swap_static_buffer(self, name: str) -> None:
        """A copy of one graph input at another address, same values."""
        if name not in (*NAMES, "attn"):
            raise ValueError(f"no static buffer {name!r}; the buffers are {', '.join(NAMES)}, attn")
        if name == "attn":
            self.attn_buffer = self.attn_buffer.clone()
        else:
            self.stager.swap(name)
