"""The shared generation scenario: requests join and leave over several steps while the running
ones decode. One home for it: the numerical-anchor suite, the replay suite and the smoke driver
(`python -m harness.smoke`) all drive an engine through `generation`.

With an anchor, decode steps feed the anchor's greedy token (plus q - 1 drafts), so the engine and
the anchor always see the same sequences; without one, each request continues with the
scenario's own deterministic tokens (batches.token), so two engines driven alike see the same
inputs whatever they compute.
"""
from __future__ import annotations

from typing import Callable, Iterator

from harness.protocol import Request
from harness.scenarios.batches import prompt, token

Joins = dict[int, list[tuple[int, int]]]  # step -> [(request_id, prompt length)]


def numbered(lengths: dict[int, list[int]], first_id: int) -> Joins:
    """Request ids for prompt lengths by step: first_id + 10 * step + position in the step."""
    return {t: [(first_id + 10 * t + j, n) for j, n in enumerate(ns)] for t, ns in lengths.items()}


def _continuation(request_id: int, history: list[int], next_token: dict[int, int], q: int) -> tuple[int, ...]:
    if request_id in next_token:
        first = next_token[request_id]
        return (first,) + tuple(1 + (first + j) % 200 for j in range(1, q))
    return tuple(token(request_id, len(history) + j) for j in range(q))


def generation(engine, anchor, joins: Joins, leaves: dict[int, int] | None = None, steps: int | None = None,
               q: int = 1, step: Callable | None = None) -> Iterator[tuple[list[Request], object, object]]:
    """Drive `engine` through the scenario; yields (requests, what `step(requests)` returned,
    the anchor's expected logits or None). `step` defaults to engine.step; `leaves[t]` requests
    leave after step t, the longest running first; every request still live is released at the end."""
    leaves = leaves or {}
    steps = steps if steps is not None else max(joins) + 1
    run = step or engine.step
    history: dict[int, list[int]] = {}
    next_token: dict[int, int] = {}
    live: list[int] = []
    for t in range(steps):
        new = joins.get(t, [])
        requests = [Request(i, _continuation(i, history[i], next_token, q), len(history[i])) for i in live]
        requests += [Request(i, prompt(i, n), 0) for i, n in new]
        out = run(requests)
        expected = anchor.step(requests, history) if anchor is not None else None
        yield requests, out, expected
        row = 0
        for r in requests:
            history[r.request_id] = history.get(r.request_id, []) + list(r.token_ids)
            row += len(r.token_ids)
            if expected is not None:
                next_token[r.request_id] = int(expected[row - 1].argmax())
        live += [i for i, _ in new]
        for _ in range(leaves.get(t, 0)):
            engine.release(live.pop(0))
    for i in live:
        engine.release(i)
