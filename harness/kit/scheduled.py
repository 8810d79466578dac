"""A base for an engine that its runtime schedules: each step is one exact batch the harness asks
for, placed on the runtime's books (block_book), run by the engine, read back by an observer and
checked against what was asked. The subclass supplies what is its engine's own:

- `prepare(planned)`: what the step needs before the observer starts (e.g. the scheduler's output);
- `forward(planned, prepared)`: the engine's forward, inside `guarded()`; returns what `check_step`
  reads, with the logits of every real token at `.logits` or as its first item;
- `check_step(record, planned, prepared, ran)`: fail loudly where the engine ran something else;
  returns the padded token count the step ran at;
- `guarded()`: the context every call into the engine runs in (kit.guard);
- `key_of(record)`: the graph key the step ran under, as a protocol Descriptor (StepResult.key), or
  None (the default) where the engine does not say;
- `padding_fill_reason`, `engine_name`, `events` and `own_errors`.

It holds `requests` (a BlockBook), `observer` (start(eager_size, fill) -> record, stop()),
`label`, `steps` and `last` (the last step's record).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from harness import protocol as p

PADDING_FILLS = (None, "zeros", "random")


class ScheduledEngine:
    engine_name = "the engine"
    padding_fill_reason = "its padded inputs are integers"
    own_errors: tuple[type[BaseException], ...] = ()
    events = None  # a kit.events.EventLog

    def guarded(self):
        return nullcontext()

    def prepare(self, planned):
        return None

    def forward(self, planned, prepared):
        raise NotImplementedError

    def check_step(self, record, planned, prepared, ran) -> int:
        raise NotImplementedError

    def key_of(self, record):
        return None

    def release(self, request_id: int) -> None:
        self.requests.release(request_id)

    def step(self, requests, padding_fill: str | None = None) -> p.StepResult:
        if padding_fill not in PADDING_FILLS:
            raise ValueError(f"this runtime fills padded rows with 'zeros' or 'random' (valid token ids and "
                             f"positions), not {padding_fill!r}: {self.padding_fill_reason}")
        return self._forward_step(list(requests), padding_fill=padding_fill)

    def _forward_step(self, requests, eager_size: int | None = None, padding_fill: str | None = None) -> p.StepResult:
        planned = self.requests.plan(requests)
        num_real_tokens = sum(q.num_new for q in planned)
        prepared = self.prepare(planned)
        record = self.observer.start(eager_size=eager_size, fill=padding_fill)
        first, start = self.steps == 0, time.perf_counter()
        try:
            with self.guarded():
                ran = self.forward(planned, prepared)
        except self.own_errors:
            raise
        except Exception as exc:
            raise RuntimeError(f"{self.engine_name} failed on a step of {len(planned)} requests ({num_real_tokens} "
                               f"tokens): {type(exc).__name__}: {exc}") from exc
        finally:
            self.observer.stop()
        self.requests.commit(planned)
        self.steps += 1
        num_padded_tokens = self.check_step(record, planned, prepared, ran)
        self.last = record
        if first and self.events is not None:
            self.events.event(f"first step {self.label}: {time.perf_counter() - start:.2f}s ({record.path} at "
                              f"{num_padded_tokens})")
        logits = ran.logits if hasattr(ran, "logits") else ran[0]
        return p.StepResult(logits, record.path, num_real_tokens, num_padded_tokens, self.key_of(record))


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "ScheduledEngine",
]
