"""An SGLang-shaped decode engine, written from docs/authoring.md alone by an author who had not
read the reference runtime or the bucket engine: a second independent engine that must pass every
suite it declares (tests/test_independent_engines.py), so that no suite holds an honest engine
with decode-only graphs to vLLM's habits.

Policy (its own, not vLLM's):
  * capture batch sizes: [1, 2, 4, 8, 12, 16, 24, 32] filtered to <= max_num_seqs, plus max_num_seqs
    itself when it is not in the list; a size whose bs * q tokens exceed the token budget is dropped;
  * q = 1 + num_speculative_tokens tokens per request; the graph of batch size bs runs bs * q tokens,
    and graphs are keyed by the padded batch size (bisect: the smallest bs >= the batch's requests);
  * only decode/verify batches (every request brings exactly q tokens) run in a FULL graph; every other
    batch runs eager, unpadded. No PIECEWISE graphs: PIECEWISE resolves to NONE, FULL and
    FULL_AND_PIECEWISE to FULL_DECODE_ONLY, each with a warning.

Execution: a Llama read from the harness's checkpoint, static input buffers, a paged KV cache (blocks
of 16 slots) with two extra rows: slot -1, the sink padded rows write, and slot -2, the row padded rows
read (which the nan / inf padding fills poison); FULL graphs through harness.graphs.emulator on the CPU
or torch.cuda on a GPU.

    python -m pytest suites/ --runtime tests.sglang_like_engine:SGLangLikeRuntime
"""
from __future__ import annotations

import bisect
import json
import math
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from harness.expectations import presets
from harness.graphs import emulator
from harness.protocol import (Capabilities, CaptureReport, Descriptor, Dispatch, EngineConfig, PolicyConfig,
                              Resolution, ResolveRequest, StepInputs, StepResult)
from harness.vocabulary import FAP, FDO, ROUTINES, SUPPORT_LEVELS, padded, weakest

GRID = (1, 2, 4, 8, 12, 16, 24, 32)
DEFAULT_TOKEN_BUDGET = 8192
BLOCK = 16
# "gather": every token reads max_model_len gathered slots, masked (static shapes, capturable for uniform
# batches); "varlen": reads only up to the batch's longest context, a length it learns on the host from
# the positions (a host sync), so it can never be captured.
ATTENTION_BACKENDS = (("gather", "UNIFORM_BATCH"), ("varlen", "NEVER"))


class SGLangLikeRuntime:
    name = "sglang-like"
    version = "0.1"
    capabilities = Capabilities(
        capture_sizes=True, dispatch=True, mode_resolution=True, speculative=True, speculative_steps=True,
        execution=True, graph_backends=("emulated", "cuda"), attention_backends=ATTENTION_BACKENDS,
        padding_fills=("zeros", "random", "nan", "inf"), loads_checkpoint=True, kv_inspection=True,
        input_inspection=True, address_checks=True,
        notes="SGLang-shaped: batch-size grid 1,2,4,8,12,16,24,32 (+max_num_seqs), graphs keyed by padded "
              "batch size, FULL decode/verify graphs only, mixed batches eager")

    # -- policy ---------------------------------------------------------------------------------
    @staticmethod
    def _check(config: PolicyConfig) -> None:
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if config.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {config.num_speculative_tokens}")
        if config.max_num_batched_tokens is not None and config.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {config.max_num_batched_tokens}")

    def batch_sizes(self, config: PolicyConfig) -> list[int]:
        """The captured batch sizes (requests per graph)."""
        self._check(config)
        if "FULL" not in ROUTINES[config.mode]:
            return []  # no FULL graphs in this mode, and there are no PIECEWISE graphs at all
        sizes = [bs for bs in GRID if bs <= config.max_num_seqs]
        if config.max_num_seqs not in sizes:
            sizes.append(config.max_num_seqs)
        budget = config.max_num_batched_tokens or DEFAULT_TOKEN_BUDGET
        return sorted(bs for bs in sizes if bs * config.query_len <= budget)

    def capture_sizes(self, config: PolicyConfig) -> list[int]:
        return [bs * config.query_len for bs in self.batch_sizes(config)]

    def padded_size(self, config: PolicyConfig, num_real_tokens: int) -> int | None:
        return padded(self.capture_sizes(config), num_real_tokens)

    def dispatch(self, config: PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None,
                 uniform: bool = False, num_active_loras: int = 0) -> Dispatch:
        if num_active_loras:
            raise ValueError("this engine has no LoRA support")
        q = config.query_len
        if uniform and ROUTINES[config.mode][0] == "FULL" and num_real_tokens % q == 0:
            bs_sizes = self.batch_sizes(config)
            reqs = num_real_tokens // q
            index = bisect.bisect_left(bs_sizes, reqs)
            if index < len(bs_sizes):
                bs = bs_sizes[index]
                return Dispatch("FULL", Descriptor(bs * q, bs, True))
        return Dispatch("NONE", Descriptor(num_real_tokens, num_real_rows, uniform))

    def resolve_mode(self, request: ResolveRequest) -> Resolution:
        mode, support, q = request.mode, request.support, 1 + request.num_speculative_tokens
        if support not in SUPPORT_LEVELS:
            raise ValueError(f"unknown support level {support!r}")
        graph_ok = support in ("ALWAYS", "UNIFORM_BATCH") or (support == "UNIFORM_SINGLE_TOKEN_DECODE" and q == 1)
        why = []
        if mode == "NONE":
            resolved = "NONE"
        elif mode == "PIECEWISE":
            resolved = "NONE"
            why.append("PIECEWISE resolved to NONE: this engine has no PIECEWISE graphs, every batch runs eager")
        elif mode == "FULL" and support == "NEVER":
            raise ValueError("FULL cannot be honoured: attention with support NEVER cannot be captured; "
                             "request NONE (or FULL_DECODE_ONLY / FULL_AND_PIECEWISE, which fall back to NONE)")
        elif mode in ("FULL", FDO, FAP):
            if graph_ok:
                resolved = FDO
                if mode == "FULL":
                    why.append("FULL resolved to FULL_DECODE_ONLY: only decode/verify batches run in a FULL graph, "
                               "mixed batches run eager")
                elif mode == FAP:
                    why.append("FULL_AND_PIECEWISE resolved to FULL_DECODE_ONLY: no PIECEWISE graphs, mixed batches "
                               "run eager")
            else:
                resolved = "NONE"
                why.append(f"{mode} resolved to NONE: attention support {support} cannot run a FULL graph of "
                           f"{q}-token requests, and there are no PIECEWISE graphs")
        else:
            raise ValueError(f"unknown config mode {mode!r}")
        return Resolution(mode, resolved, tuple(why))

    def build(self, config: EngineConfig) -> "SGLangLikeEngine":
        return SGLangLikeEngine(self, config)


# -- the model --------------------------------------------------------------------------------------
ACTIVATIONS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.nn.functional.relu,
               "gelu_pytorch_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}


def rope_inv_freq(hf: dict, head_dim: int) -> torch.Tensor:
    """Inverse RoPE frequencies from config.json: default, or "llama3" (Llama 3.1 long-context scaling)."""
    rope = dict(hf.get("rope_scaling") or {}, **(hf.get("rope_parameters") or {}))
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"only default and llama3 RoPE are supported, got {kind!r}")
    old_len, factor = rope["original_max_position_embeddings"], rope["factor"]
    lo, hi = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old_len / hi:
            out.append(f)
        elif wavelen > old_len / lo:
            out.append(f / factor)
        else:
            smooth = (old_len / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


def rms_norm(x, w, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SGLangLikeEngine:
    def __init__(self, runtime: SGLangLikeRuntime, config: EngineConfig):
        self.runtime, self.config = runtime, config
        self.device, self.dtype = torch.device(config.device), getattr(torch, config.dtype)
        if config.graph_backend not in ("emulated", "cuda"):
            raise ValueError(f"graph_backend must be 'emulated' or 'cuda', got {config.graph_backend!r}")
        if config.data_parallel is not None:
            raise ValueError("this engine does not run data parallel")
        self.cg = torch.cuda if config.graph_backend == "cuda" else emulator
        # resolution against the weakest attention backend
        known = dict(ATTENTION_BACKENDS)
        names = config.attention_backends or ("gather",)
        for n in names:
            if n not in known:
                raise ValueError(f"unknown attention backend {n!r}; this engine has {', '.join(known)}")
        support = weakest(known[n] for n in names)
        self.layer_backends = None  # set after the model is loaded
        self.resolution = runtime.resolve_mode(
            ResolveRequest(config.policy.mode, support, config.policy.num_speculative_tokens))
        for message in self.resolution.warnings:
            warnings.warn(message, stacklevel=2)
        self.policy = replace(config.policy, mode=self.resolution.resolved)
        self.q = self.policy.query_len
        self.batch_sizes = runtime.batch_sizes(self.policy)
        self.max_len = config.max_model_len
        self._load_model(config)
        if len(names) not in (1, self.layers):
            raise ValueError(f"attention_backends: one name, or one per layer ({self.layers}); got {len(names)}")
        self.layer_backends = list(names) * (self.layers if len(names) == 1 else 1)
        # KV cache: paged, BLOCK slots a block; row -1 is the sink padded rows write, row -2 the row they read.
        kv_tokens = config.kv_tokens if config.kv_tokens is not None else 4096
        self.num_blocks = max(1, math.ceil(kv_tokens / BLOCK))
        self.num_slots = self.num_blocks * BLOCK
        shape = (self.num_slots + 2, self.kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        self.free_blocks = list(range(self.num_blocks))
        self.blocks: dict[int, list[int]] = {}
        # static inputs sized for the largest step
        budget = self.policy.max_num_batched_tokens or DEFAULT_TOKEN_BUDGET
        self.max_tokens = max([budget] + [bs * self.q for bs in self.batch_sizes])
        T, L = self.max_tokens, self.max_len
        self.bufs = {
            "token_ids": torch.zeros(T, dtype=torch.long, device=self.device),
            "positions": torch.zeros(T, dtype=torch.long, device=self.device),
            "slot_mapping": torch.full((T,), -1, dtype=torch.long, device=self.device),
            "slot_table": torch.full((T, L), -2, dtype=torch.long, device=self.device),
        }
        self.arange = torch.arange(L, device=self.device)
        self.graphs: dict[int, tuple] = {}  # padded batch size -> (graph, output, {buffer: address})
        self.captured = False
        self.last_size = 0

    def _load_model(self, config: EngineConfig) -> None:
        from safetensors.torch import load_file

        folder = Path(config.checkpoint) if config.checkpoint else presets.checkpoint(config.preset, config.seed)
        hf = json.loads((folder / "config.json").read_text())
        shape = presets.preset(config.preset)
        if hf["hidden_size"] != shape.hidden or hf["num_hidden_layers"] != shape.layers:
            raise ValueError(f"checkpoint {folder} does not have the shape of preset {config.preset!r}")
        self.layers, self.hidden = hf["num_hidden_layers"], hf["hidden_size"]
        self.heads, self.kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
        self.head_dim = hf.get("head_dim") or self.hidden // self.heads
        self.vocab, self.eps = hf["vocab_size"], hf.get("rms_norm_eps", 1e-6)
        if hf.get("hidden_act", "silu") not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; have {', '.join(ACTIVATIONS)}")
        self.act = ACTIVATIONS[hf.get("hidden_act", "silu")]
        sd = load_file(str(folder / "model.safetensors"))
        w = {k: v.to(self.device, self.dtype) for k, v in sd.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.head = self.embed if hf.get("tie_word_embeddings", False) else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.lw = []
        for i in range(self.layers):
            p = f"model.layers.{i}."
            self.lw.append({k: w[p + n + ".weight"] for k, n in (
                ("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"), ("q", "self_attn.q_proj"),
                ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"),
                ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))})
            # biases: zero where the config says the projections have none
            for k, n, on in (("q", "self_attn.q_proj", "attention_bias"), ("k", "self_attn.k_proj", "attention_bias"),
                             ("v", "self_attn.v_proj", "attention_bias"), ("o", "self_attn.o_proj", "attention_bias"),
                             ("gate", "mlp.gate_proj", "mlp_bias"), ("up", "mlp.up_proj", "mlp_bias"),
                             ("down", "mlp.down_proj", "mlp_bias")):
                b = w[p + n + ".bias"] if hf.get(on, False) else None
                self.lw[-1][k + "_b"] = b if b is not None else torch.zeros(
                    self.lw[-1][k].shape[0], dtype=self.dtype, device=self.device)
        self.inv_freq = rope_inv_freq(hf, self.head_dim).to(self.device)

    # -- forward over the static buffers, first n rows (graph-safe: no host syncs) ----------------
    def forward(self, n: int) -> torch.Tensor:
        ids, pos = self.bufs["token_ids"][:n], self.bufs["positions"][:n]
        slots, table = self.bufs["slot_mapping"][:n], self.bufs["slot_table"][:n]
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]
        mask = (self.arange[None, :] <= pos[:, None])[:, :, None, None]  # [n, L, 1, 1]
        group = self.heads // self.kv_heads
        h = self.embed[ids]
        for i, lw in enumerate(self.lw):
            x = rms_norm(h, lw["ln1"], self.eps)
            q = (x @ lw["q"].T + lw["q_b"]).view(n, self.heads, self.head_dim)
            k = (x @ lw["k"].T + lw["k_b"]).view(n, self.kv_heads, self.head_dim)
            v = (x @ lw["v"].T + lw["v_b"]).view(n, self.kv_heads, self.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k_cache[i].index_put_((slots,), k)
            self.v_cache[i].index_put_((slots,), v)
            tab, msk = table, mask
            if self.layer_backends[i] == "varlen":  # the longest context, read on the host: never capturable
                longest = int(pos.max()) + 1
                tab, msk = table[:, :longest], mask[:, :longest]
            keys = self.k_cache[i][tab]  # [n, L, kvh, d]
            vals = self.v_cache[i][tab]
            zero = torch.zeros((), dtype=self.dtype, device=self.device)
            keys = torch.where(msk, keys, zero).repeat_interleave(group, dim=2)  # [n, L, H, d]
            vals = torch.where(msk, vals, zero).repeat_interleave(group, dim=2)
            scores = torch.einsum("nhd,nlhd->nhl", q, keys) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(~msk[:, :, :, 0].permute(0, 2, 1), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attn = torch.einsum("nhl,nlhd->nhd", probs, vals).reshape(n, self.heads * self.head_dim)
            h = h + attn @ lw["o"].T + lw["o_b"]
            x = rms_norm(h, lw["ln2"], self.eps)
            h = h + (self.act(x @ lw["gate"].T + lw["gate_b"]) * (x @ lw["up"].T + lw["up_b"])) @ lw["down"].T + lw["down_b"]
        return rms_norm(h, self.final_norm, self.eps) @ self.head.T

    # -- host side: KV blocks and loading the static buffers ---------------------------------------
    def _slot(self, request_id: int, position: int, allocate: bool) -> int:
        blocks = self.blocks.setdefault(request_id, [])
        while allocate and len(blocks) <= position // BLOCK:
            if not self.free_blocks:
                raise RuntimeError(f"KV cache full ({self.num_slots} slots)")
            blocks.append(self.free_blocks.pop(0))
        if position // BLOCK >= len(blocks):
            raise KeyError(f"request {request_id} has no KV at position {position}")
        return blocks[position // BLOCK] * BLOCK + position % BLOCK

    def _validate(self, requests) -> None:
        seen = set()
        for r in requests:
            if r.request_id in seen:
                raise ValueError(f"request {r.request_id} appears twice in one step")
            seen.add(r.request_id)
            if not r.token_ids:
                raise ValueError(f"request {r.request_id} brings no tokens")
            if r.context_len < 0 or r.context_len + len(r.token_ids) > self.max_len:
                raise ValueError(f"request {r.request_id} is longer than max_model_len {self.max_len}")
            if any(t < 0 or t >= self.vocab for t in r.token_ids):
                raise ValueError(f"request {r.request_id} has a token id outside the vocabulary {self.vocab}")

    def _load(self, requests, size: int, padding_fill: str | None = None) -> None:
        ids, positions, slots = [], [], []
        for r in requests:
            for j, t in enumerate(r.token_ids):
                p = r.context_len + j
                ids.append(t)
                positions.append(p)
                slots.append(self._slot(r.request_id, p, allocate=True))
        pad, L = size - len(ids), self.max_len
        if size > self.max_tokens:
            raise ValueError(f"a step of {size} tokens exceeds this engine's {self.max_tokens}")
        if padding_fill in (None, "zeros"):
            pad_ids, pad_pos = [0] * pad, [0] * pad
        elif padding_fill in ("random", "nan", "inf"):
            g = torch.Generator().manual_seed(1234 + pad)
            pad_ids = torch.randint(0, self.vocab, (pad,), generator=g).tolist()
            pad_pos = torch.randint(0, L, (pad,), generator=g).tolist()
        else:
            raise ValueError(f"padding_fill must be one of zeros, random, nan, inf; got {padding_fill!r}")
        poison = {"nan": float("nan"), "inf": float("inf")}.get(padding_fill, 0.0)
        for cache in self.k_cache + self.v_cache:
            cache[-2].fill_(poison)  # the row only padded rows read
        table = torch.full((size, L), -2, dtype=torch.long)
        # a real token reads its request's slots 0..position (the rest is masked; point it at slot 0)
        index = 0
        for r in requests:
            req_slots = [self._slot(r.request_id, p, allocate=True) for p in range(r.context_len + len(r.token_ids))]
            row = torch.tensor(req_slots + [req_slots[0]] * (L - len(req_slots)), dtype=torch.long)
            for _ in r.token_ids:
                table[index] = row
                index += 1
        b = self.bufs
        b["token_ids"][:size].copy_(torch.tensor(ids + pad_ids, dtype=torch.long))
        b["positions"][:size].copy_(torch.tensor(positions + pad_pos, dtype=torch.long))
        b["slot_mapping"][:size].copy_(torch.tensor(slots + [-1] * pad, dtype=torch.long))
        b["slot_table"][:size].copy_(table)
        self.last_size = size

    # -- engine operations -------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        if self.captured:
            raise RuntimeError("graphs are captured once; the capture phase is over")
        self.captured, start = True, time.perf_counter()
        free = self._free_memory()
        pool = self.cg.graph_pool_handle() if self.batch_sizes else None
        order = []
        for bs in reversed(self.batch_sizes):  # largest first, one pool
            size = bs * self.q
            self._load([], size)  # every row a padded row: writes only the sink slot
            self.forward(size)  # warm up eagerly
            graph = self.cg.CUDAGraph()
            with self.cg.graph(graph, pool=pool):
                output = self.forward(size)
            addresses = {name: t.data_ptr() for name, t in self.bufs.items()}
            self.graphs[bs] = (graph, output, addresses)
            order.append(("FULL", size))
        if free is not None:
            memory = free - self._free_memory()
        else:
            memory = sum(getattr(g, "held_bytes", 0) for g, _, _ in self.graphs.values())
        return CaptureReport({"FULL": len(self.graphs), "PIECEWISE": 0}, time.perf_counter() - start, memory,
                             tuple(order))

    def _free_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]

    @torch.inference_mode()
    def step(self, requests, padding_fill: str | None = None) -> StepResult:
        requests = list(requests)
        self._validate(requests)
        n = sum(len(r.token_ids) for r in requests)
        if n == 0:
            return StepResult(torch.zeros(0, self.vocab, dtype=self.dtype, device=self.device), "NONE", 0, 0)
        uniform = all(len(r.token_ids) == self.q for r in requests)
        chosen = self.runtime.dispatch(self.policy, n, len(requests), uniform)
        entry = None
        if chosen.runtime_mode == "FULL" and self.captured:
            entry = self.graphs.get(chosen.descriptor.num_padded_rows)
        if entry is None:  # eager, unpadded
            self._load(requests, n, padding_fill)
            return StepResult(self.forward(n).clone(), "NONE", n, n)
        graph, output, addresses = entry
        size = chosen.descriptor.num_padded_tokens
        self._load(requests, size, padding_fill)
        for name, address in addresses.items():
            if self.bufs[name].data_ptr() != address:
                raise RuntimeError(f"static buffer {name!r} moved from {address:#x} to "
                                   f"{self.bufs[name].data_ptr():#x} since capture; the graph would read stale memory")
        graph.replay()
        return StepResult(output[:n].clone(), "FULL", n, size)

    @torch.inference_mode()
    def eager_step(self, requests, num_padded_tokens: int) -> StepResult:
        requests = list(requests)
        self._validate(requests)
        n = sum(len(r.token_ids) for r in requests)
        if num_padded_tokens < n:
            raise ValueError(f"num_padded_tokens {num_padded_tokens} is below the batch's {n} tokens")
        self._load(requests, num_padded_tokens)
        return StepResult(self.forward(num_padded_tokens)[:n].clone(), "NONE", n, num_padded_tokens)

    def release(self, request_id: int) -> None:
        self.free_blocks.extend(self.blocks.pop(request_id, []))

    def static_buffer_addresses(self) -> dict[str, int]:
        return {name: t.data_ptr() for name, t in self.bufs.items()}

    def swap_static_buffer(self, name: str) -> None:
        if name not in self.bufs:
            raise KeyError(f"no static buffer {name!r}; have {', '.join(self.bufs)}")
        self.bufs[name] = self.bufs[name].clone()

    def kv_snapshot(self) -> torch.Tensor:
        # [slots, layers, 2, kv_heads, head_dim]; the two padding rows are not slots
        k = torch.stack([c[: self.num_slots] for c in self.k_cache], dim=1)
        v = torch.stack([c[: self.num_slots] for c in self.v_cache], dim=1)
        return torch.stack([k, v], dim=2).clone()

    def slot_of(self, request_id: int, position: int) -> int:
        return self._slot(request_id, position, allocate=False)

    def last_step_inputs(self) -> StepInputs:
        s = self.last_size
        return StepInputs(self.bufs["token_ids"][:s].clone(), self.bufs["positions"][:s].clone(),
                          self.bufs["slot_mapping"][:s].clone(), padding_slot=-1)
