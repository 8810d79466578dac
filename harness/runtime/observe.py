"""An engine as the suites see it: every answer validated at the protocol boundary, every step
checked against the runtime's own dispatch, and graph captures, launches and memory counted by the
harness itself rather than taken from the runtime's word.

`ObservedEngine` wraps a built engine. On every step it checks that the reported runtime mode
and padded size are what the runtime's own `dispatch()` (or `padded_size()`) says for that
batch, with `uniform` decided here (every request brings exactly q tokens), and, under
`vllm_rules`, what the oracle says; and that the graph launches the harness saw match the
reported mode (FULL: one; PIECEWISE: the pieces per size that capture reported; NONE: none).
The engines come from `harness.runtime.factory.EngineFactory`.
"""
from __future__ import annotations

from dataclasses import replace

from harness import moved
from harness.expectations import expected
from harness.expectations import oracle
from harness.runtime import validate
from harness.runtime.boundary import answer
from harness.scenarios.batches import describe_batch, is_uniform
from harness.checks import Check
from harness.graphs.log import LOG, GraphLog
from harness.protocol import EngineConfig, PolicyConfig, StepResult
from harness.vocabulary import ORACLE, OWN_POLICY, OBSERVED

# Until 0.4.0 the factory lived here; the old names still read, with a DeprecationWarning.
__getattr__ = moved.names_moved(__name__, "harness.runtime.factory",
                                ("EngineFactory", "BENCHMARK_ENGINE", "benchmark_engine", "LARGER_FROM"), "0.4.0")


class ObservedEngine:
    def __init__(self, engine, factory: "EngineFactory", config: EngineConfig):
        self.engine = engine
        self.factory = factory
        self.config = config
        resolution = getattr(engine, "resolution", None)
        self.resolution = self._answer("resolution", resolution, validate.resolution(resolution))
        self.captured = None  # the CaptureReport capture() returned
        self.seen_at_capture: GraphLog | None = None
        self.memory_seen: int | None = None  # graph memory the harness measured itself
        self.captures_in_service = 0  # graphs the harness saw captured during steps
        self._pieces_per_size: int | None = None  # from the capture report
        self.last_padded = 0  # the padded size of the last step
        self.live: set[int] = set()
        self.first_answer = None  # (method, kind of its logits): every later step's logits have that dtype and device
        self.last_snapshot = None  # the last kv_snapshot()'s kind: the next one has the same

    def __getattr__(self, name):  # the optional operations (kv_snapshot, swap_static_buffer, ...)
        return getattr(self.engine, name)

    @property
    def policy(self) -> PolicyConfig:
        """The policy the engine runs: its config with the mode it resolved at build time."""
        return replace(self.config.policy, mode=self.resolution.resolved)

    # -- capture ----------------------------------------------------------------------------
    def capture(self):
        before, memory = LOG.snapshot(), _device_memory(self.config.device)
        report = self.engine.capture()
        seen = LOG.since(before)
        self._answer("capture()", report, validate.capture_report(report))
        self.captured, self.seen_at_capture = report, seen
        self._pieces_per_size = expected.pieces_per_size(report)
        if memory is None:
            self.memory_seen = seen.held_bytes if seen.captures else None
        else:
            (free, reserved), (free_after, reserved_after) = memory, _device_memory(self.config.device)
            # Either can miss it: the driver may hand back a block it kept without free memory moving,
            # and memory outside torch's caching allocator is not in its reserved count.
            self.memory_seen = max(free - free_after, reserved_after - reserved)
        return report

    def pieces_per_size(self) -> int | None:
        """PIECEWISE graphs per captured size, from the capture report, or for a runtime that
        declares lazy_capture from the PIECEWISE steps that recorded theirs; None if none has."""
        return self._pieces_per_size

    # -- steps ------------------------------------------------------------------------------
    def step(self, requests, padding_fill: str | None = None):
        requests = list(requests)
        self.live.update(r.request_id for r in requests)
        before = LOG.snapshot()
        result = (self.engine.step(requests) if padding_fill is None
                  else self.engine.step(requests, padding_fill=padding_fill))
        seen = LOG.since(before)
        self.captures_in_service += seen.captures
        if seen.captures and self._pieces_per_size is None and self.factory.runtime.capabilities.lazy_capture \
                and getattr(result, "runtime_mode", None) == "PIECEWISE":
            self._pieces_per_size = seen.captures  # the first recording sets the count every later step is held to
        n = sum(len(r.token_ids) for r in requests)
        self._validate(result, requests, n, "step()" if padding_fill is None else f"step(padding_fill={padding_fill!r})")
        self.last_padded = result.num_padded_tokens
        self._check_step(requests, result, seen, n)
        if self.factory.runtime.capabilities.outputs_alias_graph_buffers:
            # The next step overwrites these logits, as declared: the harness is the caller, and a
            # caller of such a runtime copies what it keeps.
            result = StepResult(result.logits.clone(), result.runtime_mode, result.num_real_tokens,
                                result.num_padded_tokens,  # the harness's own type: the runtime's may be any
                                getattr(result, "key", None))
        return result

    def eager_step(self, requests, num_padded_tokens: int):
        requests = list(requests)
        self.live.update(r.request_id for r in requests)
        before = LOG.snapshot()
        result = self.engine.eager_step(requests, num_padded_tokens)
        seen = LOG.since(before)
        self._validate(result, requests, sum(len(r.token_ids) for r in requests), "eager_step()")
        check, batch = self.factory.check, describe_batch(requests)
        problem = expected.eager_step_problem(result.runtime_mode, result.num_padded_tokens, num_padded_tokens,
                                              seen.replays)
        check.that(problem is None, what=problem or "", source=OBSERVED, case=batch,
                   reported=(result.runtime_mode, result.num_padded_tokens), graph_launches_seen=seen.replays)
        return result

    def _validate(self, result, requests, n: int, call: str) -> None:
        """The step's answer at the protocol boundary: its form, its kind (the engine's dtype and
        device), and the same kind as the engine's first answer, whichever method gave it."""
        problem = validate.step_result(result, n, self.factory.vocab, self.config.device, self.config.dtype)
        if problem is None and self.first_answer is not None:
            problem = validate.same_kind(result.logits, self.first_answer[1], self.first_answer[0])
        self._answer(call, result, problem and f"{problem} ({describe_batch(requests)})")
        if self.first_answer is None:
            self.first_answer = (call, validate.kind(result.logits))

    def _check_step(self, requests, result, seen: GraphLog, n: int) -> None:
        check, runtime, batch = self.factory.check, self.factory.runtime, describe_batch(requests)
        reported = (result.runtime_mode, result.num_padded_tokens)
        case = f"{batch}; ran {reported[0]} at {reported[1]}"
        problem = expected.launches_problem(result.runtime_mode, self._pieces_per_size, seen.replays)
        check.that(problem is None, what=problem or "", source=OBSERVED, case=case, graph_launches_seen=seen.replays)
        q = self.config.policy.query_len
        uniform = is_uniform(requests, q)
        num_real_rows = len(requests) or None
        caps = runtime.capabilities
        # Distinct adapters the batch names (vLLM's num_active_loras), asked only where there are some.
        active = len({r.lora for r in requests if getattr(r, "lora", None) is not None})
        loras = {"num_active_loras": active} if active else {}
        if self.captured is None:
            check.equal(result.runtime_mode, "NONE", source=OBSERVED, case=case,
                        what="before capture() there is no graph to replay: a step runs eager")
        elif caps.dispatch:
            own = runtime.dispatch(self.policy, n, num_real_rows, uniform, **loras)
            check.equal(reported, (own.runtime_mode, own.descriptor.num_padded_tokens), source=OWN_POLICY,
                        case=batch, what=f"the step's mode and padded size vs the runtime's own dispatch() "
                                         f"(uniform={uniform}, mode {self.policy.mode})")
        elif caps.capture_sizes and result.runtime_mode != "NONE" and uniform:  # padded_size() speaks for decode steps
            check.equal(result.num_padded_tokens, runtime.padded_size(self.policy, n), source=OWN_POLICY, case=case,
                        what="a graph step of a uniform batch runs at the runtime's own padded_size()")
        elif result.runtime_mode != "NONE":
            check.that(result.num_padded_tokens >= n, source=OBSERVED, case=case,
                       what="a graph step runs at a size that holds the batch (padded up, never down)")
        if caps.has("vllm_rules") and self.captured is not None:
            spec = oracle.dispatch(self.policy, n, num_real_rows, uniform, **loras)
            check.equal(reported, (spec.runtime_mode, spec.descriptor.num_padded_tokens), source=ORACLE,
                        case=batch, what=f"the step's mode and padded size (uniform={uniform})")

    # -- the rest ---------------------------------------------------------------------------
    def last_step_inputs(self):
        inputs = self.engine.last_step_inputs()
        return self._answer("last_step_inputs()", inputs, validate.step_inputs(inputs, self.last_padded))

    def kv_snapshot(self):
        snapshot = self.engine.kv_snapshot()
        self._answer("kv_snapshot()", snapshot, validate.kv_snapshot(snapshot, self.last_snapshot))
        self.last_snapshot = validate.kind(snapshot)
        return snapshot

    def static_buffer_addresses(self):
        addresses = self.engine.static_buffer_addresses()
        return self._answer("static_buffer_addresses()", addresses, validate.addresses(addresses))

    def slot_of(self, request_id: int, position: int):
        slot = self.engine.slot_of(request_id, position)
        return self._answer(f"slot_of({request_id}, {position})", slot, validate.slot(slot))

    def _answer(self, call: str, result, problem: str | None):
        return answer(self.factory.check, "engine", call, result, problem)

    def release(self, request_id: int) -> None:
        self.live.discard(request_id)
        self.engine.release(request_id)

    def release_all(self) -> None:
        for request_id in sorted(self.live):
            self.release(request_id)

    def close(self) -> None:
        """The runtime's close(), where its engine has one: once, when the harness drops the engine."""
        close, self.engine = getattr(self.engine, "close", None), None
        if callable(close):
            close()

    def close_after_test(self) -> None:
        self.release_all()
        self.close()


def _device_memory(device: str) -> tuple[int, int] | None:
    """(free device memory, bytes torch's caching allocator reserves) on CUDA; None elsewhere."""
    if not device.startswith("cuda"):
        return None
    import torch

    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
