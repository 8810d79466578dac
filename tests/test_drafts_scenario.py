"""The rejected-draft scenario (harness/scenarios/drafts.py) does what its tests rely on: verify
steps reject every count of drafts from none to all, each next step starts at the last accepted
token (context_len) and says how many were dropped (num_rejected_tokens), decode steps follow,
and the anchor's history holds accepted tokens only. Checked with a recording stand-in engine."""
from __future__ import annotations

import torch

from harness.scenarios.drafts import KINDS, PROMPTS, rejecting_drafts

Q = 3


class Recording:
    def __init__(self):
        self.steps, self.released = [], []

    def step(self, requests):
        self.steps.append(requests)
        return None

    def release(self, request_id):
        self.released.append(request_id)


class Anchor:
    """Greedy token 7 after every row; remembers the histories it was shown."""

    def __init__(self):
        self.histories = []

    def step(self, requests, history):
        self.histories.append({i: list(tokens) for i, tokens in history.items()})
        logits = torch.zeros(sum(len(r.token_ids) for r in requests), 10)
        logits[:, 7] = 1.0
        return logits


def test_verify_steps_reject_every_count_and_the_next_step_rolls_back():
    engine, anchor = Recording(), Anchor()
    list(rejecting_drafts(engine, anchor, 100, Q))
    assert len(engine.steps) == len(KINDS) and sorted(engine.released) == [100, 101, 102]
    seen = set()
    for t, (kind, requests) in enumerate(zip(KINDS, engine.steps)):
        assert all(len(r.token_ids) == {"prefill": n, "verify": Q, "decode": 1}[kind]
                   for r, n in zip(requests, PROMPTS)), (t, requests)
        if t == 0:
            continue
        for before, now in zip(engine.steps[t - 1], requests):
            dropped = now.num_rejected_tokens
            assert dropped == 0 or KINDS[t - 1] == "verify"
            assert now.context_len == before.context_len + len(before.token_ids) - dropped
            assert now.token_ids[0] == 7  # the anchor's token after the last accepted one
            seen.add(dropped)
            # the anchor saw the accepted tokens only
            assert len(anchor.histories[t][now.request_id]) == now.context_len
    assert seen == set(range(Q))


def test_without_an_anchor_two_runs_see_the_same_steps():
    first, second = Recording(), Recording()
    list(rejecting_drafts(first, None, 100, Q))
    list(rejecting_drafts(second, None, 100, Q))
    assert first.steps == second.steps
