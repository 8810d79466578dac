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

`eager_step` is the step at a padded size with the observer's `eager_size` set: the observer makes
the engine run eagerly at that size.

It holds `requests` (a BlockBook), `observer` (start(eager_size, fill) -> record, stop()),
`label`, `steps`, `last` (the last step's record: `last_record()`) and `captured` (the CaptureReport
once capture() ran: `capture_once(when)` refuses another).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from harness import protocol as p

PADDING_FILLS = (None, "zeros", "random")


GREEDY_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.05}  # by dtype: see greedy_tolerance


def greedy_tolerance(dtype: str) -> float:
    """The largest |sampled token's logit - its row's maximum| accepted where a runtime checks that the
    logits it read back are the rows the engine's greedy sampler picked from: the sampler may run the
    lm_head on fewer rows, so bits may differ."""
    return GREEDY_TOLERANCE.get(dtype, 0.25)


def greedy_misses(logits, picks: list[tuple[int, int]], tolerance: float) -> list[tuple[int, int, float]]:
    """(i, argmax, gap) for each `picks[i]` = (row, token) where greedy sampling's token is not the
    maximum of `logits[row]` within `tolerance` (the row read back is not the one sampled from). One
    gather and one reduction over all picked rows: a check per row in Python costs a real engine's
    large batches more than its step (reports/h100/engines/README.md)."""
    if not picks:
        return []
    import torch

    rows = torch.tensor([row for row, _ in picks], device=logits.device)
    tokens = torch.tensor([token for _, token in picks], device=logits.device)
    chosen = logits.index_select(0, rows).float()
    best, argmax = chosen.max(dim=-1)
    gaps = best - chosen.gather(1, tokens[:, None]).squeeze(1)
    missed = (gaps > tolerance).nonzero().flatten().tolist()
    return [(i, int(argmax[i]), round(float(gaps[i]), 4)) for i in missed]


def not_the_maximum(row, token: int, tolerance: float) -> tuple[int, float] | None:
    """(argmax, gap) where greedy sampling's `token` is not the maximum of its logits `row` within
    `tolerance`, else None: `greedy_misses` for one row."""
    missed = greedy_misses(row[None], [(0, token)], tolerance)
    return missed[0][1:] if missed else None


def sampled_greedily(rows, logits, sampled: dict, drafts: dict, id_of, tolerance: float,
                     engine_name: str = "the engine", error: type[Exception] = RuntimeError) -> dict[int, int]:
    """Greedy sampling checked against the logits read back, a row per real token in `rows`' order
    ((request, its token rows), as request_rows gives them). `sampled[id_of(q)]` are the tokens the
    engine's sampler gave a request: with drafts (`drafts[id_of(q)]`, a verify step) the accepted
    drafts and one more, from its rows in order; without, one token, from its last row. Raises
    `error` naming each token that is not its row's maximum within `tolerance` (the rows read back are
    not the ones sampled from); returns the drafts accepted per verify request (by request_id)."""
    row, picked, accepted = 0, [], {}
    for q, span in rows:
        first, row = row, row + len(span)
        tokens, spec = list(sampled.get(id_of(q)) or []), list(drafts.get(id_of(q)) or [])
        if spec:
            if not 1 <= len(tokens) <= len(spec) + 1:
                raise error(f"{engine_name} sampled {tokens} for verify request {id_of(q)} with drafts {spec}")
            accepted[q.request_id] = len(tokens) - 1
            pairs = list(zip(range(first, first + len(tokens)), tokens))
        else:
            pairs = [(row - 1, tokens[-1])] if tokens else []
        picked += [(id_of(q), index - first, index, token) for index, token in pairs]
    misses = greedy_misses(logits, [(index, token) for *_, index, token in picked], tolerance)
    if misses:
        bad = [(picked[i][0], picked[i][1], picked[i][3], argmax, gap) for i, argmax, gap in misses]
        raise error(f"{engine_name}'s sampler picked tokens that are not the maximum of the logits this runtime read "
                    f"(request, row, sampled, argmax, gap): {bad}: the rows were misread")
    return accepted


def rows_in_order(planned) -> list:
    """(request, its token rows) where the engine runs the planned requests' tokens in their order."""
    rows, start = [], 0
    for q in planned:
        rows.append((q, range(start, start + q.num_new)))
        start += q.num_new
    return rows


def request_rows(batch_ids: list, starts, planned, id_of, engine_name: str = "the engine",
                 error: type[Exception] = RuntimeError) -> list:
    """(request, its token rows) for each planned request, from the engine's batch order (`batch_ids`,
    each request's `id_of(request)`) and its query starts; `error` where the engine's batch lacks a
    request or scheduled it another number of tokens."""
    where = {engine_id: i for i, engine_id in enumerate(batch_ids)}
    rows = []
    for q in planned:
        if id_of(q) not in where:
            raise error(f"{engine_name}'s batch has no request {id_of(q)}; it ran {batch_ids}")
        i = where[id_of(q)]
        span = range(int(starts[i]), int(starts[i + 1]))
        if len(span) != q.num_new:
            raise error(f"{engine_name} scheduled {len(span)} tokens of {id_of(q)}; this runtime asked for {q.num_new}")
        rows.append((q, span))
    return rows


class ScheduledEngine:
    engine_name = "the engine"
    padding_fill_reason = "its padded inputs are integers"
    own_errors: tuple[type[BaseException], ...] = ()
    events = None  # a kit.events.EventLog
    captured = None  # the engine's CaptureReport once its capture() ran

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

    def capture_once(self, when: str) -> None:
        """Refuses a second capture(): the engine captures once (`when`) and its capture phase is over.
        The engine's `captured` is None until its capture() ran."""
        if self.captured is not None:
            raise RuntimeError(f"capture() already ran for this engine: {self.engine_name} captures once, {when}, "
                               "and the capture phase is over")

    def last_record(self):
        """The last step's record, for last_step_inputs; RuntimeError before any step ran."""
        if self.last is None:
            raise RuntimeError("no step has run yet")
        return self.last

    def step(self, requests, padding_fill: str | None = None) -> p.StepResult:
        if padding_fill not in PADDING_FILLS:
            raise ValueError(f"this runtime fills padded rows with 'zeros' or 'random' (valid token ids and "
                             f"positions), not {padding_fill!r}: {self.padding_fill_reason}")
        return self._forward_step(list(requests), padding_fill=padding_fill)

    def eager_step(self, requests, num_padded_tokens: int) -> p.StepResult:
        """The step run eagerly at `num_padded_tokens` (the observer's `eager_size`, which it makes the
        engine run at), within the static buffers of the books' token limit."""
        requests = list(requests)
        tokens = sum(len(r.token_ids) for r in requests)
        limit = self.requests.max_tokens
        if not tokens <= num_padded_tokens <= limit:
            raise ValueError(f"eager_step at {num_padded_tokens} tokens: it must hold the step's {tokens} tokens and "
                             f"fit {self.engine_name}'s static buffers of {self.requests.TOKEN_LIMIT}={limit}")
        return self._forward_step(requests, eager_size=num_padded_tokens)

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
    "ScheduledEngine", "request_rows", "rows_in_order", "greedy_tolerance", "greedy_misses", "not_the_maximum",
    "sampled_greedily",
]
