"""Engines for the execution suites: built through the runtime protocol, captured, and cached.

Suites ask `engines.get(mode=..., attention=..., ...)` and get a captured engine; the same
configuration returns the same engine within a session (capture is the costly part), so
every test takes fresh request ids from `engines.new_id()` and releases what it started.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .protocol import EngineConfig, PolicyConfig, Request

# Small enough for the CPU emulator: a grid of [1, 2, 4, 8, 16] with max_num_seqs 8.
DEFAULT_SEQS = 8
DEFAULT_TOKENS = 64


def default_device(graph_backend: str) -> str:
    return "cuda" if graph_backend == "cuda" else "cpu"


class EngineFactory:
    def __init__(self, runtime, graph_backend: str, preset: str = "tiny", dtype: str = "float32",
                 max_num_seqs: int = DEFAULT_SEQS, max_num_batched_tokens: int = DEFAULT_TOKENS,
                 max_model_len: int = 128, kv_tokens: int | None = None):
        self.runtime = runtime
        self.graph_backend = graph_backend
        self.preset = preset
        self.dtype = dtype
        self.defaults = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        self.max_model_len = max_model_len
        self.kv_tokens = kv_tokens
        self._engines: dict = {}
        self._ids = itertools.count(10_000)

    def config(self, mode="FULL_AND_PIECEWISE", attention=(), spec=0, max_num_seqs=None,
               max_num_batched_tokens=None, **options) -> EngineConfig:
        policy = PolicyConfig(max_num_seqs=max_num_seqs or self.defaults["max_num_seqs"],
                              max_num_batched_tokens=max_num_batched_tokens or self.defaults["max_num_batched_tokens"],
                              num_speculative_tokens=spec, mode=mode)
        return EngineConfig(preset=self.preset, dtype=self.dtype, device=default_device(self.graph_backend),
                            graph_backend=self.graph_backend, mode=mode, attention_backends=tuple(attention),
                            policy=policy, max_model_len=self.max_model_len, kv_tokens=self.kv_tokens,
                            options=options)

    def get(self, fresh: bool = False, capture: bool = True, **kw):
        """A built (and captured) engine; `fresh=True` builds a new one nobody else has used."""
        config = self.config(**kw)
        key = (config.mode, config.attention_backends, config.policy, tuple(sorted(config.options.items())), capture)
        if fresh or key not in self._engines:
            engine = TrackedEngine(self.runtime.build(config))
            if capture:
                engine.capture()
            if fresh:
                return engine
            self._engines[key] = engine
        return self._engines[key]

    def release_all(self) -> None:
        """After each test: free what it left running, so a failed test cannot starve the next."""
        for engine in self._engines.values():
            engine.release_all()

    def new_id(self) -> int:
        return next(self._ids)


class TrackedEngine:
    """An engine that remembers which requests it has seen, so they can all be released."""

    def __init__(self, engine):
        self._engine = engine
        self._live: set[int] = set()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, requests, padding_fill=None):
        self._live.update(r.request_id for r in requests)
        if padding_fill is None:
            return self._engine.step(requests)
        return self._engine.step(requests, padding_fill=padding_fill)

    def eager_step(self, requests, padded_num_tokens):
        self._live.update(r.request_id for r in requests)
        return self._engine.eager_step(requests, padded_num_tokens)

    def release(self, request_id: int) -> None:
        self._live.discard(request_id)
        self._engine.release(request_id)

    def release_all(self) -> None:
        for request_id in sorted(self._live):
            self.release(request_id)


@dataclass
class Sequence:
    """A request the suite drives: its id, tokens in the KV cache, and the next token to feed."""

    request_id: int
    context_len: int
    next_tokens: tuple[int, ...] = field(default=())


def capture_sizes(runtime, policy) -> list[int]:
    """The runtime's own sizes where it declares them, else vLLM's grid from the oracle."""
    if runtime.capabilities.capture_sizes:
        return list(runtime.capture_sizes(policy))
    from . import oracle

    return oracle.capture_sizes(policy)


def token(request_id: int, position: int, vocab: int = 200) -> int:
    """Deterministic token ids, so two engines fed the same scenario see the same inputs."""
    return (request_id * 31 + position * 7) % vocab + 1


def prefill(engine, ids: list[int], lengths: list[int]) -> list[Sequence]:
    requests = [Request(i, tuple(token(i, p) for p in range(n)), 0) for i, n in zip(ids, lengths)]
    engine.step(requests)
    return [Sequence(i, n) for i, n in zip(ids, lengths)]


def decode_requests(seqs: list[Sequence], q: int = 1) -> list[Request]:
    return [Request(s.request_id, tuple(token(s.request_id, s.context_len + j) for j in range(q)), s.context_len)
            for s in seqs]


def mixed_requests(seqs: list[Sequence], new_ids: list[int], new_lengths: list[int], q: int = 1) -> list[Request]:
    return decode_requests(seqs, q) + [Request(i, tuple(token(i, p) for p in range(n)), 0)
                                       for i, n in zip(new_ids, new_lengths)]


def advance(seqs: list[Sequence], q: int = 1) -> None:
    for s in seqs:
        s.context_len += q


def describe_batch(requests) -> str:
    decode = sum(1 for r in requests if r.context_len > 0)
    tokens = sum(len(r.token_ids) for r in requests)
    lengths = sorted({len(r.token_ids) for r in requests})
    return f"{len(requests)} requests ({decode} continuing), {tokens} tokens, query lengths {lengths}"
