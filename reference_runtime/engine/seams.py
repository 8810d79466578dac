"""The engine's seams: the narrow protocols of the parts a plugin or a test replaces.

A step goes plan -> stage -> run, each stage handing the next a value: the planner turns requests
into a `StepPlan`; the stager writes a plan into the static buffers; the run strategy stages and
runs a plan and returns a `StepResult`. A replacement part implements one protocol below, or wraps
the default part (`Wrapped`) and edits the value it hands on (a plan, a result, a capture report).
Nothing else of the engine is a seam: the parts' other methods are theirs to change.
The graph backend's protocol is harness.graphs' (`capture`, `close_capture_phase`, `pool_stats`);
an attention backend's is `attention.Backend` (`name`, `support`, `__call__`, `forward`).
"""
from __future__ import annotations

from typing import Protocol

from harness.protocol import CaptureReport, StepResult

from .attention import Metadata
from .plan import StepPlan


class PlannerProtocol(Protocol):
    """Requests -> StepPlan. Built as `planner(dispatcher, allocator, max_rows, consensus)`."""

    allocator: object  # kv_cache.BlockAllocator: the KV blocks the plans' slots come from

    def plan(self, requests, captured: bool) -> StepPlan: ...  # a step as served

    def plan_eager(self, requests, num_padded_tokens: int) -> StepPlan: ...  # the eager reference at a size

    def dummy(self, mode, key) -> StepPlan: ...  # padding rows only: what warm-up and capture run

    def release(self, request_id: int) -> None: ...


class StagerProtocol(Protocol):
    """A plan into the static buffers. Built as `stager(max_tokens, max_rows, max_blocks, max_model_len, device)`."""

    def stage(self, plan: StepPlan) -> int: ...  # the plan into the host buffer; the values transfer moves

    def transfer(self, num_values: int) -> None: ...  # host buffer -> static buffers (recorded by a FULL graph)

    def metadata(self, plan: StepPlan) -> Metadata: ...  # the static buffers' views for the plan's step

    def tensors(self) -> dict: ...  # the static inputs graphs read, by name

    def inputs(self, num_padded_tokens: int) -> dict: ...  # copies of the staged token ids, positions, slots

    def swap(self, name: str) -> None: ...  # one input to another address (the address check's probe)


class RunStrategy(Protocol):
    """How steps run and what the capture phase records. Built as `strategy(runner)`."""

    def capture(self) -> CaptureReport: ...

    def run(self, plan: StepPlan, eager: bool = False) -> StepResult: ...


class Wrapped:
    """A part around another: what it does not define is the inner part's. A broken part in the
    self-tests defines one protocol method, calls the inner one and edits the value."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name == "inner":  # not set yet (a copy, a pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @classmethod
    def around(cls, default):
        """A seam argument for ModelRunner: builds `default` as the runner would, wrapped in this class."""
        return lambda *args, **kwargs: cls(default(*args, **kwargs))
