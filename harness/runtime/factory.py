"""Engines for the execution suites, built through the protocol and watched by the harness.

`EngineFactory` builds engines (with the harness's checkpoint for runtimes that load one) and
caches them: capture is the costly part. Beside the default size it builds larger engines, whose
grid reaches past its power-of-two prefix to a maximum off it. It holds each engine to where its
mode should resolve (the spec, or the runtime's own resolve_mode()) and skips a test where there
are no graphs to test. Each engine it hands out is an `ObservedEngine` (harness.runtime.observe).
"""
from __future__ import annotations

import gc
import itertools
import sys

from harness.checks import Check
from harness.expectations import expected, lora_adapters, presets
from harness.expectations.anchor import Anchor
from harness.graphs import device_for
from harness.protocol import EngineConfig, PolicyConfig
from harness.reliability import isolation
from harness.reliability.safe import describe_exception
from harness.runtime import checkpoint as checkpoint_verdict
from harness.runtime.observe import ObservedEngine
from harness.vocabulary import engine_dtype


LARGER_FROM = 17  # the larger engines' max_num_seqs starts past 16, the top of most default grids


def _own_grid(runtime) -> list[int]:
    """The runtime's own sizes for a wide config, in the first graph mode that has any."""
    for mode in ("FULL_AND_PIECEWISE", "FULL", "FULL_DECODE_ONLY", "PIECEWISE"):
        try:
            sizes = runtime.capture_sizes(PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, mode=mode))
        except ValueError:
            continue
        if sizes:
            return list(sizes)
    return []


# The benchmark lane's engines (plugin.bench_engines, scripts/step_breakdown.py): a model in
# bf16, vLLM's default grid (max_num_seqs 256 gives sizes up to 512), a KV cache for every batch.
BENCHMARK_ENGINE = dict(dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=512,
                        kv_tokens=300_000)


def benchmark_engine(runtime) -> dict:
    """BENCHMARK_ENGINE for this runtime: in the dtype its declared precision names where it names one
    (an engine that computes in float16 whatever it is asked is built in float16), else bf16."""
    named = engine_dtype(runtime.capabilities.precision)
    return {**BENCHMARK_ENGINE, "dtype": named if named != "float32" else BENCHMARK_ENGINE["dtype"]}


class EngineFactory:
    """Builds engines for the execution suites: `get(mode=..., attention=..., spec=...)`.

    The same configuration returns the same captured engine within a session (capture is the
    costly part), so every test takes fresh request ids from `new_id()` and releases what it
    started; `fresh=True` builds one nobody else has used.
    """

    def __init__(self, runtime, graph_backend: str, preset: str = "tiny", dtype: str | None = None,
                 max_num_seqs: int = 8, max_num_batched_tokens: int = 64, max_model_len: int = 128,
                 kv_tokens: int | None = 1024, anchor=None):
        self.runtime = runtime
        self.graph_backend = graph_backend
        # A runtime that computes in a dtype whatever it is asked (Capabilities.precision) is built in it.
        self.preset, self.dtype = preset, dtype or engine_dtype(runtime.capabilities.precision)
        self.vocab, self.num_layers = presets.preset(preset).vocab, presets.preset(preset).layers
        self.defaults = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        self.max_model_len, self.kv_tokens = max_model_len, kv_tokens
        self._engines: dict = {}
        self._cached = 0
        self._fresh: list[ObservedEngine] = []  # built for the running test alone: closed after it
        self._allocated_before_fresh: int | None = None  # device memory before the test's first fresh build
        self._ids = itertools.count(10_000)
        self._check: Check | None = None
        self._larger: dict | None = None
        self._anchor = None
        self._started_anchor = anchor  # the session's anchor in a helper process, where one was started

    def bind(self, check: Check | None) -> None:
        self._check = check

    @property
    def engines_cached(self) -> int:
        """Engines cached for later tests so far this session (their memory is the factory's, not a
        leak of the test that built them). It never goes down: the last test's teardown closes
        them, and the engine it cached is still not its leak."""
        return self._cached

    @property
    def check(self) -> Check:
        return self._check or Check("execution", self.runtime, "pytest <the test that was running>")

    def checkpoint(self) -> str | None:
        if not self.runtime.capabilities.loads_checkpoint:
            return None
        return str(presets.checkpoint(self.preset))

    def anchor(self):
        """transformers' forward over this factory's checkpoint (harness.expectations.anchor), made
        once a session: pytest may leave the anchor suite and come back to it (it orders tests by
        the session's parameters), and a module's fixture would load the model again each time. Its
        device memory is the harness's, not a leak of the test that first asked for it. Where the
        session started one in a helper process (harness.session.anchor_helper), that one: it holds no
        memory here."""
        if self._started_anchor is not None:
            return self._started_anchor
        if self._anchor is None:
            before = _allocated()
            self._anchor = Anchor(self.checkpoint(), device=self.config().device)
            if before is not None:
                isolation.harness_holds(_allocated() - before)
        return self._anchor

    def config(self, mode="FULL_AND_PIECEWISE", attention=(), spec=0, max_num_seqs=None,
               max_num_batched_tokens=None, max_model_len=None, kv_tokens=None, max_loras=0,
               specialize_active_loras=False, dtype=None) -> EngineConfig:
        """The engine the suites ask for; with no attention named, the strongest one declared. With
        max_loras, as many of the harness's LoRA adapters (lora_adapters.py), ids 1 to max_loras."""
        attention = tuple(attention) or expected.default_attention(self.runtime)
        policy = PolicyConfig(max_num_seqs=max_num_seqs or self.defaults["max_num_seqs"],
                              max_num_batched_tokens=max_num_batched_tokens or self.defaults["max_num_batched_tokens"],
                              num_speculative_tokens=spec, mode=mode, max_loras=max_loras,
                              specialize_active_loras=specialize_active_loras)
        if self.runtime.capabilities.has("vllm_rules"):  # held to the rules of the release it declares
            policy = expected.vllm_rules(self.runtime, policy)
        return EngineConfig(preset=self.preset, dtype=dtype or self.dtype, device=device_for(self.graph_backend),
                            graph_backend=self.graph_backend, policy=policy, attention_backends=attention,
                            max_model_len=max_model_len or self.max_model_len, kv_tokens=kv_tokens or self.kv_tokens,
                            checkpoint=self.checkpoint(),
                            lora_adapters=lora_adapters.adapters(self.preset, max_loras) if max_loras else ())

    def get(self, fresh: bool = False, capture: bool = True, **kw) -> ObservedEngine:
        """A built (and captured) engine."""
        return self._get(self.config(**kw), fresh, capture)

    def _get(self, config: EngineConfig, fresh: bool, capture: bool) -> ObservedEngine:
        key = (config, capture)
        if fresh or key not in self._engines:
            if fresh and not self._fresh:
                self._allocated_before_fresh = _allocated()
            engine = ObservedEngine(checkpoint_verdict.build(self.runtime, config), self, config)
            if fresh:
                self._fresh.append(engine)
            if capture:
                engine.capture()
            if fresh:
                return engine
            self._engines[key] = engine
            self._cached += 1
        return self._engines[key]

    def larger_policy(self) -> dict:
        """max_num_seqs and max_num_batched_tokens of the suites' larger engines, beside the default
        ones (8 and 64, whose grids are powers of two under most policies): the smallest max_num_seqs
        past 16 that is not one of the runtime's own sizes, so its grid reaches the steps of its
        policy and ends at a maximum off them, where padding, dispatch at the top and the largest
        graph behave as they do in service; a budget that holds twice its widest decode batch."""
        if self._larger is None:
            own = set(_own_grid(self.runtime)) if self.runtime.capabilities.capture_sizes else set()
            # A grid with every size from 17 to 64 has no size off it: 17 then.
            seqs = next((n for n in range(LARGER_FROM, 4 * LARGER_FROM) if n not in own), LARGER_FROM)
            self._larger = dict(max_num_seqs=seqs,
                                max_num_batched_tokens=max(self.defaults["max_num_batched_tokens"], 2 * seqs))
        return self._larger

    def larger(self, mode: str = "FULL_AND_PIECEWISE", **kw) -> ObservedEngine:
        """The larger engine for a graph mode (larger_policy()), shared like any other."""
        return self.for_mode(mode, **self.larger_policy(), **kw)

    def for_mode(self, mode: str, attention=(), spec: int = 0, fresh: bool = False, capture: bool = True,
                 **kw) -> ObservedEngine:
        """An engine for a graph mode, its build-time resolution checked against where it should
        land (the spec, or the runtime's own resolve_mode()); the test is skipped, with that
        source, where the mode resolves to NONE: there are no graphs to test."""
        config, want = self.expect_resolution(mode, attention, spec, **kw)
        try:
            engine = self._get(config, fresh, capture)
        except ValueError as exc:
            if want.value is not None or mode not in str(exc):
                raise
            import pytest

            # With no attention backends declared there is no resolve_mode() answer to hold the
            # build to: a rejection that names the mode is taken on the runtime's word.
            pytest.skip(f"runtime {self.runtime.name!r} rejects {mode} at build ({want.source}): "
                        f"{describe_exception(exc)}")
        self.check_resolved(self.check, mode, config, want, engine.resolution.resolved)
        return engine

    def expect_resolution(self, mode: str, attention=(), spec: int = 0, **kw):
        """(the config of an engine for `mode`, where it should resolve); skipped where the mode
        is rejected for those attention backends."""
        import pytest

        config = self.config(mode=mode, attention=attention, spec=spec, **kw)
        want = expected.resolution(self.runtime, mode, config.attention_backends, spec)
        if want.value == "error":
            pytest.skip(f"{mode} with attention {config.attention_backends} is rejected ({want.source})")
        return config, want

    def check_resolved(self, check: Check, mode: str, config: EngineConfig, want, resolved: str) -> str:
        """The mode an engine resolved at build time, checked against `want`; skipped where it is
        NONE: there are no graphs to test."""
        import pytest

        if want.value is not None:
            check.equal(resolved, want.value, source=want.source,
                        what=f"mode {mode} resolved at build time (attention {config.attention_backends})")
        resolved = want.value or resolved
        if resolved == "NONE":
            pytest.skip(f"runtime {self.runtime.name!r} resolves {mode} to NONE ({want.source}): no graphs to test")
        return resolved

    def release_all(self) -> None:
        """After each test: free what it left running, so a failed test cannot starve the next, and close
        the engines it built for itself alone."""
        for engine in self._engines.values():
            engine.release_all()
        self._close_fresh()

    def _close_fresh(self) -> None:
        """Close the test's own engines, newest first, and measure what they left allocated: within what
        the runtime declares per build (memory_kept_per_build) it is not the test's leak; the rest is
        (harness.reliability.isolation counts it)."""
        builds, before = len(self._fresh), self._allocated_before_fresh
        self._allocated_before_fresh, failure = None, None
        while self._fresh:
            try:
                self._fresh.pop().close_after_test()
            except Exception as exc:  # noqa: BLE001 - the others are closed all the same; the first is raised
                failure = failure or exc
        if failure is not None:
            raise failure
        torch = sys.modules.get("torch")
        if not builds or before is None or torch is None or not torch.cuda.is_initialized():
            return
        gc.collect()
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a broken CUDA context (AcceleratorError): the test that broke it was told
            return
        kept = max(_allocated() - before, 0)  # measured: what the closed engines still hold
        isolation.runtime_kept(min(kept, builds * self.runtime.capabilities.memory_kept_per_build))

    def close(self) -> None:
        """Close the cached engines and free their memory now: left to a later garbage collection, it
        would be freed during a later test and hide a leak of that test's (docs/reliability.md)."""
        self._close_fresh()
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            self._close_cached()  # no device memory is measured: two full collections (~0.3 s each) buy nothing
            return
        gc.collect()  # the running test's own garbage first: freeing that is not the harness's doing
        held = isolation.cuda_allocated(torch)
        self._close_cached()
        gc.collect()
        isolation.harness_released(held - isolation.cuda_allocated(torch))
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a broken CUDA context (AcceleratorError): the test that broke it was told
            pass

    def _close_cached(self) -> None:
        self._anchor = None
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()

    def new_id(self) -> int:
        return next(self._ids)


def _allocated() -> int | None:
    """CUDA memory allocated on every device; None where CUDA is not in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return isolation.cuda_allocated(torch)

