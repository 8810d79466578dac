"""The batches the execution suites drive: deterministic token ids, prefills, decode and verify
steps, mixed batches, and one-line descriptions for failure messages.

Token ids are in TOKENS (1..200), inside every preset's vocabulary (the smallest, `tiny`, has
256), so any engine built from a preset can embed them; id 0 is left for padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.protocol import Request

TOKENS = range(1, 201)


def token(request_id: int, position: int) -> int:
    """The token a request holds at a position: two engines fed one scenario see the same inputs."""
    return (request_id * 31 + position * 7) % len(TOKENS) + TOKENS.start


@dataclass
class Sequence:
    """A request the suite drives: its id and the tokens in its KV cache."""

    request_id: int
    tokens: list[int] = field(default_factory=list)  # every token it has brought so far

    @property
    def context_len(self) -> int:
        return len(self.tokens)

    def add(self, token_ids) -> None:
        self.tokens += list(token_ids)


def prompt(request_id: int, length: int) -> tuple[int, ...]:
    return tuple(token(request_id, p) for p in range(length))


def prefill(engine, ids: list[int], lengths: list[int]) -> list[Sequence]:
    """Admit requests with prompts of the given lengths in one step."""
    requests = [Request(i, prompt(i, n), 0) for i, n in zip(ids, lengths)]
    engine.step(requests)
    return [Sequence(r.request_id, list(r.token_ids)) for r in requests]


def prefill_within(engine, ids: list[int], lengths: list[int], budget: int) -> list[Sequence]:
    """Admit requests as prefill() does, in as many steps as the token budget needs."""
    seqs, start = [], 0
    while start < len(ids):
        stop, tokens = start, 0
        while stop < len(ids) and tokens + lengths[stop] <= budget:
            tokens, stop = tokens + lengths[stop], stop + 1
        seqs += prefill(engine, ids[start:max(stop, start + 1)], lengths[start:max(stop, start + 1)])
        start = max(stop, start + 1)
    return seqs


def _continue(s: Sequence, n: int) -> Request:
    """The next n tokens of a running sequence."""
    return Request(s.request_id, tuple(token(s.request_id, s.context_len + j) for j in range(n)), s.context_len)


def decode_requests(seqs: list[Sequence], q: int = 1) -> list[Request]:
    """One decode (q = 1) or verify (q > 1) step of q tokens for each sequence."""
    return [_continue(s, q) for s in seqs]


def mixed_requests(seqs: list[Sequence], new_ids: list[int], new_lengths: list[int], q: int = 1) -> list[Request]:
    """Decode steps for the running sequences, then whole prompts for new ones."""
    return decode_requests(seqs, q) + [Request(i, prompt(i, n), 0) for i, n in zip(new_ids, new_lengths)]


def uneven_requests(seqs: list[Sequence], q: int) -> list[Request]:
    """q x len(seqs) tokens in requests of unequal lengths: the token count of a uniform batch
    without being one (a dispatcher that decides `uniform` from the count alone is wrong here)."""
    lengths = [q - 1, q + 1] + [q] * (len(seqs) - 2)
    return [_continue(s, n) for s, n in zip(seqs, lengths)]


def is_uniform(requests, q: int) -> bool:
    """The harness's own answer to `uniform`: every request of a non-empty batch brings q tokens."""
    return bool(requests) and all(len(r.token_ids) == q for r in requests)


def advance(seqs: list[Sequence], requests: list[Request]) -> None:
    """After a step: each sequence keeps the tokens its request brought, and a request new to
    `seqs` joins it as a sequence (in request order)."""
    known = {s.request_id: s for s in seqs}
    for r in requests:
        if r.request_id not in known:
            known[r.request_id] = Sequence(r.request_id)
            seqs.append(known[r.request_id])
        known[r.request_id].add(r.token_ids)


# Decode batches of one size over six live requests (indices into the pool), step after step: the
# same requests again, reversed, rotated, one swapped for a request that sat out, all swapped, then
# the same again; contexts of 20-26 tokens cross a 32-token boundary on the way. An engine that
# keeps request rows from step to step (vLLM's persistent batch) must follow each request.
OWNER_POOL = (20, 23, 21, 26, 22, 24)
OWNER_ROWS = ((0, 1, 2), (0, 1, 2), (2, 1, 0), (1, 2, 0), (3, 2, 0), (3, 4, 5), (5, 4, 3), (5, 4, 3), (0, 4, 3),
              (0, 4, 3), (4, 0, 3), (1, 2, 5))


OWNER_FIRST_ID = 60_000  # the first request id of the rows-changing-owner pool: its prompts follow from it


def rows_changing_owner(engine, first_id: int = OWNER_FIRST_ID, q: int = 1):
    """Prefill the OWNER_POOL requests (ids from first_id) on `engine`, then yield the OWNER_ROWS
    decode (q = 1) or verify (q > 1) batches one at a time, each with its requests' tokens before
    the step ({id: tokens}). The caller runs each step before asking for the next; the requests
    are released at the end."""
    pool = [prefill(engine, [first_id + i], [n])[0] for i, n in enumerate(OWNER_POOL)]
    for rows in OWNER_ROWS:
        seqs = [pool[i] for i in rows]
        requests = decode_requests(seqs, q)
        yield requests, {s.request_id: list(s.tokens) for s in seqs}
        advance(pool, requests)
    for s in pool:
        engine.release(s.request_id)


def describe_batch(requests) -> str:
    decode = sum(1 for r in requests if r.context_len > 0)
    tokens = sum(len(r.token_ids) for r in requests)
    lengths = sorted({len(r.token_ids) for r in requests})
    return f"{len(requests)} requests ({decode} continuing), {tokens} tokens, query lengths {lengths}"


def reaching_the_end(engine, first_id: int, length: int, budget: int, q: int = 1):
    """Steps whose last tokens reach the last position an engine holds (length - 1), on each path:
    a prompt of `length` tokens prefilled in chunks of at most `budget` tokens (its last chunk ends
    at the last position); a prompt of length - 2 q prefilled, then decode (q = 1) or verify (q > 1)
    steps of q tokens until it reaches the last position, beside a short request, and, in the first
    of them, a new request whose prompt is q tokens (the batch stays uniform). Yields (requests,
    {id: tokens before the step}); the caller runs each step before asking for the next. The
    requests are released at the end."""
    short, full, decoding, joining = first_id, first_id + 1, first_id + 2, first_id + 3
    seqs = {i: Sequence(i) for i in (short, full, decoding, joining)}
    plan = [[Request(short, prompt(short, 2), 0)]]
    for i, n in ((full, length), (decoding, length - 2 * q)):
        plan += [[Request(i, prompt(i, n)[start:start + budget], start)] for start in range(0, n, budget)]
    for requests in plan:
        yield requests, {r.request_id: list(seqs[r.request_id].tokens) for r in requests}
        advance(list(seqs.values()), requests)
    engine.release(full)
    while seqs[decoding].context_len < length:
        running = [seqs[decoding], seqs[short]] + ([seqs[joining]] if seqs[joining].context_len else [])
        requests = decode_requests(running, q) + ([] if seqs[joining].context_len else
                                                  [Request(joining, prompt(joining, q), 0)])
        yield requests, {r.request_id: list(seqs[r.request_id].tokens) for r in requests}
        advance(list(seqs.values()), requests)
    for i in (short, decoding, joining):
        engine.release(i)


def padded_counts(runtime, policy, most: int, limit: int = 4) -> list[int]:
    """Token counts up to `most` that the runtime's own policy (`padded_size()`) pads, up to `limit`
    of them spread from the smallest to the largest; every count where it declares no sizes."""
    if runtime.capabilities.capture_sizes:
        counts = [n for n in range(1, most + 1) if (runtime.padded_size(policy, n) or n) > n]
    else:
        counts = list(range(1, most + 1))
    if len(counts) <= limit:
        return counts
    return [counts[round(i * (len(counts) - 1) / (limit - 1))] for i in range(limit)]
