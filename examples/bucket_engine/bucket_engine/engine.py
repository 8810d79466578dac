"""The bucket engine: KV cache, static input buffers, and one FULL graph per bucket.

KV cache. Each live request owns one contiguous row of max_model_len slots (slot = row *
max_model_len + position), handed out when it first arrives and freed by release(). One more
row after the real ones is the sink: padded tokens write the sink's first slot (the padding
slot, a real index, so nothing wraps) and read the sink row. Capacity is in whole rows:
max(max_num_seqs, kv_tokens / max_model_len).

A step. The engine's own dispatch (policy.py) picks a bucket; the step's rows, padded with
token 0 at position 0 in the sink row, are copied into the static buffers (never replaced:
graphs read them by address, and a replay checks the addresses first); the bucket's graph
replays, or the same forward runs eagerly; the real rows of the logits are copied out.

Graphs. The same code captures CUDA graphs on a GPU and emulated ones on the CPU: `self.cg` is
torch.cuda or harness.graphs.emulator, which share an API. Largest bucket first, one memory
pool, an eager warm-up of a batch that is all padding before each capture (it writes only the
sink). Nothing is captured after capture().
"""
from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import replace

import torch

from harness.expectations import presets
from harness.graphs import emulator
from harness.protocol import CaptureReport, EngineConfig, StepInputs, StepResult
from harness.vocabulary import PADDING_FILLS

from . import policy
from .model import Llama

ATTENTION = ("gather", "ALWAYS")  # the one attention backend: every token gathers its own KV row
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INPUTS = ("token_ids", "positions", "slot_mapping", "kv_rows")  # the static inputs, by name


class BucketEngine:
    model_class = Llama  # the model, a part a variant may replace

    def __init__(self, config: EngineConfig):
        if config.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
        if config.graph_backend != ("cuda" if config.device.startswith("cuda") else "emulated"):
            raise ValueError(f"graph backend {config.graph_backend!r} does not run on {config.device}: "
                             "CUDA graphs need a cuda device, the emulator the CPU")
        unknown = set(config.attention_backends) - {ATTENTION[0]}
        if unknown:
            raise ValueError(f"unknown attention backend {sorted(unknown)}; the bucket engine has {ATTENTION[0]!r}")
        self.device = torch.device(config.device)
        self.cg = torch.cuda if self.device.type == "cuda" else emulator  # the one line that differs
        self.resolution = policy.resolve_mode(config.policy.mode, ATTENTION[1], config.policy.num_speculative_tokens)
        for message in self.resolution.warnings:
            warnings.warn(message, stacklevel=2)
        self.policy = replace(config.policy, mode=self.resolution.resolved)
        self.q, self.sizes = self.policy.query_len, policy.capture_sizes(self.policy)
        checkpoint = config.checkpoint or presets.checkpoint(config.preset, config.seed)
        self.model = self.model_class(checkpoint, DTYPES[config.dtype], self.device)
        self.length = config.max_model_len
        if self.length > self.model.max_positions:
            raise ValueError(f"max_model_len {self.length} exceeds the model's {self.model.max_positions} positions")
        self.num_rows = max(config.policy.max_num_seqs, -(-(config.kv_tokens or 0) // self.length))
        self.sink = self.num_rows * self.length  # the sink row's first slot; the sink row is self.num_rows
        self.padding_slot = self.sink  # what padded tokens write
        m = self.model
        self.scale = m.head_dim ** -0.5  # attention's softmax scale
        self.cache = torch.zeros(m.num_layers, 2, self.sink + self.length, m.kv_heads, m.head_dim,
                                 dtype=DTYPES[config.dtype], device=self.device)
        max_tokens = max(self.sizes + [policy.batched_tokens(self.policy)])
        self.inputs = {name: torch.zeros(max_tokens, dtype=torch.long, device=self.device) for name in INPUTS}
        self.window = torch.arange(self.length, device=self.device)
        self.rows: dict[int, int] = {}  # request id -> its KV row
        self.free_rows = list(range(self.num_rows - 1, -1, -1))
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, its logits buffer)
        self.addresses: dict[str, int] = {}  # static input -> address at capture
        self.captured = False
        self.last_size = 0

    # -- the forward, over the static buffers -----------------------------------------------------
    def forward(self, num_padded_tokens: int) -> torch.Tensor:
        ids, positions, slots, rows = (self.inputs[name][:num_padded_tokens] for name in INPUTS)

        def attention(layer, q, k, v):
            return self.attend(layer, q, k, v, slots, rows, positions)

        return self.model.forward(ids, positions, attention)

    def attend(self, layer, q, k, v, slots, rows, positions) -> torch.Tensor:
        """Write the step's keys and values, then let each token attend to its row up to its position."""
        keys, values = self.cache[layer, 0], self.cache[layer, 1]
        keys.index_copy_(0, slots, k)
        values.index_copy_(0, slots, v)
        n, m = q.shape[0], self.model
        context = (rows[:, None] * self.length + self.window[None, :]).flatten()  # [n * length] slots
        k = keys.index_select(0, context).view(n, self.length, m.kv_heads, m.head_dim)
        v = values.index_select(0, context).view(n, self.length, m.kv_heads, m.head_dim)
        visible = self.visible(positions)  # [n, length]
        # A slot no token may see can hold anything (NaN in a poisoned sink): zero it, since 0 * NaN is NaN.
        v = v.masked_fill(~visible[:, :, None, None], 0)
        q = q.view(n, m.kv_heads, m.heads // m.kv_heads, m.head_dim)
        scores = torch.einsum("tkgd,tlkd->tkgl", q, k) * self.scale
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.einsum("tkgl,tlkd->tkgd", probs, v).reshape(n, m.heads * m.head_dim)

    def visible(self, positions: torch.Tensor) -> torch.Tensor:
        """[tokens, max_model_len]: the slots of its row a token attends to, its own position included."""
        return self.window[None, :] <= positions[:, None]

    # -- capture ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        if self.captured:
            raise RuntimeError("capture() was already called; the bucket engine captures its graphs once")
        self.captured = True
        start, free = time.perf_counter(), self._free_memory()
        pool = self.cg.graph_pool_handle()
        for size in self.capture_order():
            self.load([], size)
            self.forward(size)  # warm-up
            graph = self.cg.CUDAGraph()
            with self.cg.graph(graph, pool=pool):
                logits = self.forward(size)
            self.graphs[size] = (graph, logits)
        self.addresses = self.static_buffer_addresses()
        if free is not None:
            memory = free - self._free_memory()
        else:  # the emulator says what its graphs hold
            memory = sum(graph.held_bytes for graph, _ in self.graphs.values())
        return CaptureReport({"FULL": len(self.graphs)}, time.perf_counter() - start, memory,
                             tuple(("FULL", size) for size in self.capture_order()))

    def capture_order(self) -> list[int]:
        """Largest first, into one pool: a capture takes only blocks the earlier ones freed, so the
        smaller graphs reuse the larger's memory and no graph's output sits where a graph captured
        before it keeps its intermediates."""
        return sorted(self.sizes, reverse=True)

    def _free_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.mem_get_info(self.device)[0]

    # -- steps ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, requests, padding_fill: str | None = None) -> StepResult:
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        size = self.bucket(num_real_tokens, len(requests), self.is_uniform(requests))
        graph = self.graphs.get(size)  # None where the batch runs eager, and before capture
        self.load(requests, size if graph else num_real_tokens, padding_fill)
        with self.poisoned_sink(padding_fill):
            if graph is None:
                return StepResult(self.forward(num_real_tokens), "NONE", num_real_tokens, num_real_tokens)  # a fresh tensor, no graph buffer
            self.check_addresses()
            graph[0].replay()
            return StepResult(graph[1][:num_real_tokens].clone(), "FULL", num_real_tokens, size)

    def is_uniform(self, requests) -> bool:
        """A decode (or verify) batch: every request brings q tokens, new requests included."""
        return bool(requests) and all(len(r.token_ids) == self.q for r in requests)

    def bucket(self, num_real_tokens: int, num_real_rows: int, uniform: bool) -> int | None:
        """The graph a batch runs in, by its engine's own dispatch; None: eager."""
        chosen = policy.dispatch(self.policy, num_real_tokens, num_real_rows, uniform)
        return chosen.descriptor.num_padded_tokens if chosen.runtime_mode == "FULL" else None

    @torch.inference_mode()
    def eager_step(self, requests, num_padded_tokens: int) -> StepResult:
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        self.load(requests, num_padded_tokens)
        return StepResult(self.forward(num_padded_tokens)[:num_real_tokens].clone(), "NONE", num_real_tokens, num_padded_tokens)

    def load(self, requests, size: int, padding_fill: str | None = None) -> None:
        """Copy a step's rows into the static buffers, padded to size."""
        if size > len(self.inputs["token_ids"]):
            raise ValueError(f"a step of {size} tokens does not fit the static buffers of "
                             f"{len(self.inputs['token_ids'])} (max_num_batched_tokens)")
        columns = [[] for _ in INPUTS]  # token id, position, slot, KV row of every token
        for r in requests:
            self.check_length(r)
            if not all(0 <= token < self.model.vocab for token in r.token_ids):
                raise ValueError(f"request {r.request_id} has a token id outside 0..{self.model.vocab - 1}")
            row = self.row_of(r)
            for j, token in enumerate(r.token_ids):
                position = r.context_len + j
                for column, value in zip(columns, (token, position, row * self.length + position, row)):
                    column.append(value)
        pad = size - len(columns[0])
        if pad < 0:
            raise ValueError(f"{len(columns[0])} tokens do not fit a step of {size}")
        ids, positions = self.padding(pad, padding_fill)
        columns[0] += ids
        columns[1] += positions
        columns[2] += [self.padding_slot] * pad
        columns[3] += [self.num_rows] * pad
        values = torch.tensor(columns, dtype=torch.long, device=self.device)
        for name, column in zip(INPUTS, values):
            self.inputs[name][:size].copy_(column)
        self.last_size = size

    def check_length(self, request) -> None:
        """A request may hold max_model_len tokens, its last at position max_model_len - 1; one more
        would write past its KV row, so it is refused before anything is written."""
        if request.context_len + len(request.token_ids) > self.length:
            raise ValueError(f"request {request.request_id} would hold {request.context_len + len(request.token_ids)} "
                             f"tokens; max_model_len is {self.length}")

    def padding(self, pad: int, fill: str | None) -> tuple[list[int], list[int]]:
        """Padded rows' token ids and positions. None and "zeros": token 0 at position 0. "random",
        "nan" and "inf": random ids in the vocabulary and random positions (integer inputs cannot
        hold NaN; "nan" and "inf" also poison the sink row's KV, which only padded rows read)."""
        if fill is None or fill == "zeros" or pad == 0:
            return [0] * pad, [0] * pad
        if fill not in PADDING_FILLS:
            raise ValueError(f"padding_fill must be one of {', '.join(PADDING_FILLS)}, got {fill!r}")
        generator = torch.Generator().manual_seed(pad)
        return (torch.randint(0, self.model.vocab, (pad,), generator=generator).tolist(),
                torch.randint(0, self.length, (pad,), generator=generator).tolist())

    @contextmanager
    def poisoned_sink(self, fill: str | None):
        """For "nan" and "inf" fills: the sink row holds NaN or inf for the step, then zeros again."""
        if fill not in ("nan", "inf"):
            yield
            return
        self.cache[:, :, self.sink:].fill_(float(fill))
        try:
            yield
        finally:
            self.cache[:, :, self.sink:].zero_()

    def row_of(self, request) -> int:
        row = self.rows.get(request.request_id)
        if row is not None:
            return row
        if request.context_len:
            raise ValueError(f"request {request.request_id} says {request.context_len} tokens are cached, "
                             "but the engine has never seen it")
        if not self.free_rows:
            raise RuntimeError(f"KV cache full: all {self.num_rows} rows are taken; release a request first")
        self.rows[request.request_id] = row = self.free_rows.pop()
        return row

    def check_addresses(self) -> None:
        for name, address in self.addresses.items():
            if self.inputs[name].data_ptr() != address:
                raise RuntimeError(f"static input {name!r} moved from address {address:#x} to "
                                   f"{self.inputs[name].data_ptr():#x} after capture; a graph reads the old "
                                   "address: copy into the buffer, never replace it")

    def release(self, request_id: int) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            self.free_rows.append(row)

    # -- what the harness may inspect -------------------------------------------------------------
    def static_buffer_addresses(self) -> dict[str, int]:
        return {name: tensor.data_ptr() for name, tensor in self.inputs.items()}

    def swap_static_buffer(self, name: str) -> None:
        if name not in self.inputs:
            raise ValueError(f"no static buffer {name!r}; the buffers are {', '.join(INPUTS)}")
        self.inputs[name] = self.inputs[name].clone()  # same values, another address

    def kv_snapshot(self) -> torch.Tensor:
        """Every slot of every request row (not the sink): [slots, layers, k/v, kv_heads, head_dim]."""
        return self.cache[:, :, : self.sink].permute(2, 0, 1, 3, 4).clone()

    def slot_of(self, request_id: int, position: int) -> int:
        return self.rows[request_id] * self.length + position

    def last_step_inputs(self) -> StepInputs:
        ids, positions, slots, _ = (self.inputs[name][: self.last_size].clone() for name in INPUTS)
        return StepInputs(ids, positions, slots, padding_slot=self.padding_slot)
