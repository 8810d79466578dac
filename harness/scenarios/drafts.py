"""Verify steps that reject drafts, followed by decode and verify steps: the scenario of the
rejected-draft tests (docs/spec.md section 6.7).

A verify step brings, for each request, the token sampled last and q - 1 drafts. The sampler then
accepts the first drafts up to its first disagreement and rejects the rest: the request's sequence
grows by the sampled token and the accepted drafts only, and the next step starts right after
them. vLLM rolls back so: its scheduler takes the rejected count off `num_computed_tokens`, and the
next step's positions and slots start after the last accepted token, overwriting the rejected
tokens' KV, which no query reads meanwhile. The next step's Request says it twice: `context_len`
counts only accepted tokens, and `num_rejected_tokens` how many of the last step's were dropped.

With an anchor, a request's next token is the anchor's greedy token after its last accepted one,
so the engine and the anchor see the same sequences; without one it is the scenario's own
deterministic token, so two engines driven alike see the same inputs whatever they compute.
"""
from __future__ import annotations

from typing import Callable, Iterator

from harness.protocol import Request
from harness.scenarios.batches import prompt, token

PROMPTS = (5, 11, 3)  # the requests' prompt lengths
KINDS = ("prefill", "verify", "verify", "decode", "verify", "verify", "verify")  # what each step brings


def num_rejected(row: int, step: int, q: int) -> int:
    """Drafts a verify step rejects for the request in `row`: every count from none to all q - 1,
    spread over rows and steps."""
    return (row + step) % q


def rejecting_drafts(engine, anchor, first_id: int, q: int, step: Callable | None = None,
                     kinds: tuple[str, ...] = KINDS) -> Iterator[tuple[list[Request], object, object]]:
    """Drive `engine` (q = 1 + its speculative tokens) through the steps `kinds` names; yields
    (requests, what `step(requests)` returned, the anchor's expected logits or None). `step`
    defaults to engine.step; the requests are released at the end."""
    run = step or engine.step
    ids = [first_id + j for j in range(len(PROMPTS))]
    history: dict[int, list[int]] = {i: [] for i in ids}
    requests = [Request(i, prompt(i, n), 0) for i, n in zip(ids, PROMPTS)]
    for t, kind in enumerate(kinds):
        out = run(requests)
        expected = anchor.step(requests, history) if anchor is not None else None
        yield requests, out, expected
        if t + 1 == len(kinds):
            break
        following, row = [], 0
        for j, request in enumerate(requests):
            brought = len(request.token_ids)
            dropped = num_rejected(j, t, brought) if kind == "verify" else 0
            history[request.request_id] += request.token_ids[: brought - dropped]
            last = row + brought - dropped - 1  # the row of the last accepted token
            row += brought
            following.append(_next(request.request_id, history[request.request_id], expected, last,
                                   q if kinds[t + 1] == "verify" else 1, dropped))
        requests = following
    for i in ids:
        engine.release(i)


def _next(request_id: int, history: list[int], expected, last_row: int, num_real_tokens: int, dropped: int) -> Request:
    """The request's next step: the token after its last accepted one, then drafts."""
    first = int(expected[last_row].argmax()) if expected is not None else token(request_id, len(history))
    drafts = tuple(1 + (first + j) % 200 for j in range(1, num_real_tokens))
    return Request(request_id, (first,) + drafts, len(history), num_rejected_tokens=dropped)
