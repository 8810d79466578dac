"""The serving loop: continuous batching, greedy sampling, and `generate()`.

Requests join and finish between steps, so the batch size moves across capture buckets.
With q = 1 + k > 1, decode steps are verify steps: each request submits its last token plus
k draft tokens (here a fixed guess: the last token repeated), accepts the drafts the model
agrees with, and gets one more token from the model, as speculative decoding does.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from .buffers import Request
from .runner import ModelRunner


@dataclass
class Sequence:
    request_id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in the cache

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class StepRecord:
    runtime_mode: str
    num_tokens: int
    padded_num_tokens: int
    logits: torch.Tensor | None = None


class LLMEngine:
    def __init__(self, runner: ModelRunner, keep_logits: bool = False):
        self.runner = runner
        self.q = runner.q
        self.max_num_seqs = runner.policy.max_num_seqs
        self.token_budget = runner.policy.batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished: dict[int, Sequence] = {}
        self.history: list[StepRecord] = []
        self.keep_logits = keep_logits
        self._next_id = 0

    def add_request(self, prompt: list[int], max_new_tokens: int) -> int:
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if len(prompt) + max_new_tokens + self.q > self.runner.config.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + q ({self.q}) exceeds "
                f"max_model_len ({self.runner.config.max_model_len})"
            )
        self.waiting.append(Sequence(self._next_id, list(prompt), max_new_tokens))
        self._next_id += 1
        return self._next_id - 1

    def _schedule(self) -> list[tuple[Sequence, list[int]]]:
        """Decode tokens for the running requests, then whole prompts while budget and seats last."""
        batch = [(seq, self._decode_tokens(seq)) for seq in self.running]
        budget = self.token_budget - sum(len(tokens) for _, tokens in batch)
        while self.waiting and len(self.running) < self.max_num_seqs and len(self.waiting[0].prompt) <= budget:
            seq = self.waiting.popleft()
            self.running.append(seq)
            batch.append((seq, list(seq.prompt)))
            budget -= len(seq.prompt)
        return batch

    def _decode_tokens(self, seq: Sequence) -> list[int]:
        last = seq.tokens[-1]
        return [last] * self.q  # last token, then q - 1 fixed draft guesses

    def step(self) -> StepRecord | None:
        batch = self._schedule()
        if not batch:
            return None
        requests = [Request(seq.request_id, tuple(tokens), seq.computed) for seq, tokens in batch]
        out = self.runner.step(requests)
        record = StepRecord(out.runtime_mode, out.num_tokens, out.padded_num_tokens,
                            out.logits if self.keep_logits else None)
        self.history.append(record)
        row = 0
        for seq, tokens in batch:
            logits = out.logits[row:row + len(tokens)]
            row += len(tokens)
            self._accept(seq, tokens, logits)
        for seq in [s for s in self.running if s.done]:
            self.running.remove(seq)
            self.finished[seq.request_id] = seq
            self.runner.release(seq.request_id)
        return record

    def _accept(self, seq: Sequence, tokens: list[int], logits: torch.Tensor) -> None:
        predicted = logits.argmax(dim=-1).tolist()
        if seq.computed == 0:  # prefill: the last prompt position predicts the first token
            seq.computed = len(tokens)
            seq.output.append(predicted[-1])
            return
        # Verify: drafts tokens[1:] are accepted while they match what the model predicted.
        accepted = 0
        while accepted < len(tokens) - 1 and tokens[1 + accepted] == predicted[accepted]:
            accepted += 1
        new = tokens[1:1 + accepted] + [predicted[accepted]]
        seq.computed += 1 + accepted
        seq.output.extend(new[: seq.max_new_tokens - len(seq.output)])

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        ids = [self.add_request(p, m) for p, m in zip(prompts, budgets)]
        while self.waiting or self.running:
            self.step()
        return [self.finished[i].output for i in ids]
