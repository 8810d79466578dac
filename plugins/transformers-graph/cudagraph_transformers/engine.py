"""A decode engine over transformers' LlamaForCausalLM and its StaticCache.

StaticCache stores keys as [batch rows, heads, columns, dim] and keeps one write offset for all
rows (on the device, `cumulative_length`, in recent versions). So this engine is time-aligned:
each request owns a row, every step writes the next columns of every row, and a per-row map of
column -> position (on the device) builds the attention mask, so a request sees exactly its
own tokens at or before each query position. Rewriting a position (the suites re-run steps)
retires the old column; when the columns run out they are compacted in place.

Modes: NONE runs the model eagerly. `graph="manual"` captures one CUDA graph of the decode step
(every row, one token each): static input buffers, the write offset restored after warm-up.
`graph="compile"` runs decode steps through torch.compile(mode="reduce-overhead") instead, whose
CUDA graph trees warm up, record and replay on their own; a step reports the path they took
(harness.graphs.trees), and its eager reference runs the same compiled kernels without graphs.
"""
from __future__ import annotations

import inspect
import time

import torch
from transformers import LlamaForCausalLM, StaticCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(engine_config, dtype: torch.dtype, device: str):
    """The harness's checkpoint of the preset (the weights the numerical anchor uses); without one,
    the preset's seeded weights from the harness."""
    if engine_config.checkpoint:
        model = LlamaForCausalLM.from_pretrained(engine_config.checkpoint, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    else:
        from harness.expectations.presets import seeded_model

        model = seeded_model(engine_config.preset, engine_config.seed)
        model.config._attn_implementation = "sdpa"
    return model.to(device=device, dtype=dtype).eval(), model.config


def make_static_cache(config, rows: int, columns: int, device, dtype):
    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = dict(config=config, max_cache_len=columns)
    for name, value in (("max_batch_size", rows), ("batch_size", rows), ("device", device), ("dtype", dtype)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


class StaticCacheEngine:
    def __init__(self, engine_config, graph: str | None, resolution):
        self.config = engine_config
        self.graph = graph
        self.resolution = resolution
        self.device = torch.device(engine_config.device)
        self.dtype = DTYPES[engine_config.dtype]
        self.rows = engine_config.policy.max_num_seqs
        self.columns = max(4 * engine_config.max_model_len,
                           (engine_config.kv_tokens or 0) // self.rows, 512)
        self.model, self.hf_config = build_model(engine_config, self.dtype, engine_config.device)
        self.cache = make_static_cache(self.hf_config, self.rows, self.columns, self.device, self.dtype)
        self.position_of_column = torch.full((self.rows, self.columns), -1, dtype=torch.long, device=self.device)
        self.row_of: dict[int, int] = {}
        self.column_of: dict[int, dict[int, int]] = {}  # row -> position -> column
        self.next_column = 0
        long = dict(dtype=torch.long, device=self.device)
        self.buffers = {"input_ids": torch.zeros(self.rows, 1, **long), "position_ids": torch.zeros(self.rows, 1, **long),
                        "cache_position": torch.zeros(1, **long)}
        self.decode_graph = None
        self.graph_output = None
        self.capture_summary = None
        self.compiled = None
        self.compiled_eager = None
        self.graphs_on = resolution.resolved != "NONE"  # a mode resolved to NONE captures nothing

    # -- layout ------------------------------------------------------------------------------
    def _layout(self, requests):
        width = max(len(r.token_ids) for r in requests)
        rows = [self._row(request) for request in requests]
        # Positions this step writes again (a re-run step) retire their old columns; compacting
        # then puts every row's live tokens back in position order, so a re-run sees the same
        # layout as the first run and computes the same bits.
        for row, request in zip(rows, requests):
            seen = self.column_of[row]
            for position in [p for p in seen if p >= request.context_len]:
                self.position_of_column[row, seen.pop(position)] = -1
        # Compacting every step keeps each row's layout canonical (position order from column 0),
        # so a step computes the same bits however the cache was filled before it.
        self._compact()
        if self.next_column + width > self.columns:
            raise RuntimeError(f"StaticCache is full: {self.columns} columns; raise max_model_len or kv_tokens")
        start = self.next_column
        ids = torch.zeros(self.rows, width, dtype=torch.long)
        positions = torch.zeros(self.rows, width, dtype=torch.long)
        updates, picks = [], []
        for row, request in zip(rows, requests):
            seen = self.column_of[row]
            for j, token in enumerate(request.token_ids):
                position = request.context_len + j
                seen[position] = start + j
                ids[row, j], positions[row, j] = token, position
                updates.append((row, start + j, position))
                picks.append((row, j))
        if updates:
            r, c, p = (torch.tensor(x, device=self.device) for x in zip(*updates))
            self.position_of_column[r, c] = p
        self.next_column += width
        return ids.to(self.device), positions.to(self.device), start, width, picks

    def _row(self, request) -> int:
        if request.request_id not in self.row_of:
            free = sorted(set(range(self.rows)) - set(self.row_of.values()))
            if not free:
                raise RuntimeError(f"all {self.rows} StaticCache rows are taken; release a request first")
            self.row_of[request.request_id] = free[0]
            self.column_of[free[0]] = {}
        row = self.row_of[request.request_id]
        known = len([p for p in self.column_of[row] if p < request.context_len])
        if request.context_len > known:
            raise ValueError(f"request {request.request_id} claims {request.context_len} cached tokens; "
                             f"its row holds {known}")
        return row

    def _mask(self, positions, start, width):
        """Row b, query j sees the columns that hold its own positions <= its position."""
        cols = self.position_of_column[:, None, None, :]
        mask = (cols >= 0) & (cols <= positions[:, None, :, None])
        # A padding query with nothing to see would give NaN; let it see its own column.
        own = torch.zeros_like(mask)
        own[:, 0, torch.arange(width, device=self.device), start + torch.arange(width, device=self.device)] = True
        return mask | own

    def _forward(self, ids, positions, start, width):
        for layer in getattr(self.cache, "layers", []):
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor) and layer.is_initialized:
                layer.cumulative_length.fill_(start)  # the single write offset of every row
        return self.model(input_ids=ids, position_ids=positions, attention_mask=self._mask(positions, start, width),
                          past_key_values=self.cache, cache_position=start + torch.arange(width, device=self.device),
                          use_cache=True).logits

    def _compact(self):
        """Move every row's live columns to the front, in place (graphs keep their addresses)."""
        live = [(row, sorted(cols.items())) for row, cols in self.column_of.items()]
        if all(c == i for _, cols in live for i, (_, c) in enumerate(cols)):
            self.next_column = max((len(cols) for _, cols in live), default=0)
            return  # already canonical
        if not all(getattr(layer, "is_initialized", True) and layer.keys is not None for layer in self.cache.layers):
            return  # nothing written yet
        width = max((len(cols) for _, cols in live), default=0)
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values):
                moved = tensor.clone()
                for row, cols in live:
                    if cols:
                        old = torch.tensor([c for _, c in cols], device=self.device)
                        tensor[row, :, : len(cols)] = moved[row, :, old]
        self.position_of_column.fill_(-1)
        for row, cols in live:
            self.column_of[row] = {p: i for i, (p, _) in enumerate(cols)}
            if cols:
                self.position_of_column[row, : len(cols)] = torch.tensor([p for p, _ in cols], device=self.device)
        self.next_column = width

    # -- protocol ----------------------------------------------------------------------------
    def capture(self):
        if self.capture_summary is not None:
            raise RuntimeError("the decode graph is already captured; the capture phase is over")
        start_time = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0] if self.device.type == "cuda" else None
        graphs = 0
        if self.graph == "manual" and self.graphs_on:
            graphs = self._capture_decode_graph()
        seconds = time.perf_counter() - start_time
        memory = None if free_before is None else free_before - torch.cuda.mem_get_info()[0]
        self.capture_summary = (graphs, seconds, memory)
        return self.capture_report()

    def _capture_decode_graph(self) -> int:
        ids, positions = self.buffers["input_ids"], self.buffers["position_ids"]
        start = self.buffers["cache_position"]
        self._forward(ids, positions, 0, 1)  # lazy cache allocation and warm-up
        saved = [layer.cumulative_length.clone() for layer in self.cache.layers
                 if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward_static(ids, positions, start)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            self.graph_output = self._forward_static(ids, positions, start)
        for layer, value in zip([l for l in self.cache.layers if isinstance(getattr(l, "cumulative_length", None), torch.Tensor)], saved):
            layer.cumulative_length.copy_(value)  # warm-up and capture must not consume cache columns
        self.decode_graph = graph
        return 1

    def _forward_static(self, ids, positions, start):
        """The decode step as the graph records it: the write offset comes from a device buffer."""
        for layer in getattr(self.cache, "layers", []):
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.copy_(start[0])
        cols = self.position_of_column[:, None, None, :]
        mask = (cols >= 0) & (cols <= positions[:, None, :, None])
        own = torch.arange(self.columns, device=self.device)[None, None, None, :] == start
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask | own,
                          past_key_values=self.cache, cache_position=start, use_cache=True).logits

    def capture_report(self):
        from harness.protocol import CaptureReport

        if self.capture_summary is None:
            return CaptureReport({}, 0.0, None, ())
        graphs, seconds, memory = self.capture_summary
        return CaptureReport({"FULL": graphs} if graphs else {}, seconds, memory,
                             (("FULL", self.rows),) if graphs else ())

    @torch.inference_mode()
    def step(self, requests, padding_fill=None):
        from harness.protocol import StepResult

        if padding_fill is not None:
            raise ValueError("this runtime cannot choose what padded rows hold (no padding_fills)")
        decode = all(len(r.token_ids) == 1 for r in requests)
        ids, positions, start, width, picks = self._layout(requests)
        mode = "NONE"
        if decode and self.decode_graph is not None:
            self.buffers["input_ids"].copy_(ids)
            self.buffers["position_ids"].copy_(positions)
            self.buffers["cache_position"].fill_(start)
            self.decode_graph.replay()
            logits, mode = self.graph_output, "FULL"
        elif decode and self.graph == "compile" and self.graphs_on:
            logits, mode = self._compiled_decode(ids, positions, start)
        else:
            logits = self._forward(ids, positions, start, width)
        rows, cols = zip(*picks)
        out = logits[list(rows), list(cols)]
        return StepResult(out, mode, len(picks), self.rows * width)

    def _compiled_decode(self, ids, positions, start):
        """The decode step through the graph trees, with the mode they took (harness.graphs.trees)."""
        from harness.graphs import trees

        with trees.observed() as paths:
            logits = self._compilations()[0](ids, positions, torch.tensor([start], device=self.device))
        mode = trees.runtime_mode(paths)
        if mode is None:
            raise RuntimeError("this torch's CUDA graph trees cannot be observed (harness.graphs.trees): "
                               "the step's mode is unknown")
        return logits, mode

    def _static_forward_without_graphs(self):
        """The decode step an eager reference runs: under graph="compile" the same Inductor kernels
        the graph trees replay, without graphs (so the two can agree bit for bit); else the model."""
        if self.graph != "compile":
            return self._forward_static
        return self._compilations()[1]

    def _compilations(self):
        """The static decode step through graph trees, and the same kernels without graphs."""
        from harness.graphs import trees

        if self.compiled is None:
            self.compiled, self.compiled_eager = trees.compile_pair(self._forward_static)
        return self.compiled, self.compiled_eager

    def eager_step(self, requests, num_padded_tokens):
        from harness.protocol import StepResult

        with torch.inference_mode():
            ids, positions, start, width, picks = self._layout(requests)
            if all(len(r.token_ids) == 1 for r in requests) and self.graph is not None:
                forward = self._static_forward_without_graphs()
                logits = forward(ids, positions, torch.tensor([start], device=self.device))
            else:
                logits = self._forward(ids, positions, start, width)
            rows, cols = zip(*picks)
            return StepResult(logits[list(rows), list(cols)], "NONE", len(picks), self.rows * width)

    def static_buffer_addresses(self):
        return {name: t.data_ptr() for name, t in self.buffers.items()}

    def swap_static_buffer(self, name):
        if name not in self.buffers:
            raise ValueError(f"no static buffer {name!r}; the buffers are {', '.join(self.buffers)}")
        self.buffers[name] = self.buffers[name].clone()

    def release(self, request_id):
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.column_of.pop(row, None)
            self.position_of_column[row].fill_(-1)
