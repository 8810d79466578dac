"""The one serving loop: continuous batching with greedy sampling over the runtime protocol.

Each step decodes every running request (q tokens: its last token plus q - 1 draft guesses, the
shape of a speculative verify step), then admits whole prompts while the token budget and the
seats last; finished requests are released. Two drivers share it:

- `generate(engine, prompts, budgets)`: everything arrives at once; the tokens, for equality
  checks between modes and engines.
- `run(engine, workload, ...)`: a synthetic stream in real time, for the serving benchmark, in
  the shape of vLLM PR #20059's table (spec section 8): Poisson arrivals, log-normal prompt and
  output lengths, vLLM's metrics. No dataset is downloaded.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

from harness.protocol import Request


@dataclass
class Live:
    request_id: int
    prompt: list[int]
    output_len: int
    arrival: float = 0.0
    tokens: list[int] = field(default_factory=list)  # generated
    times: list[float] = field(default_factory=list)
    context: int = 0  # tokens whose KV is in the cache

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.output_len


class Scheduler:
    def __init__(self, engine, max_num_seqs: int, token_budget: int, q: int = 1):
        self.engine, self.max_num_seqs, self.token_budget, self.q = engine, max_num_seqs, token_budget, q
        self.waiting: list[Live] = []
        self.running: list[Live] = []
        self.done: list[Live] = []
        self.steps = 0

    def step(self, clock=None) -> None:
        batch = [(r, [r.tokens[-1]] * self.q) for r in self.running]
        budget = self.token_budget - sum(len(tokens) for _, tokens in batch)
        while self.waiting and len(self.running) < self.max_num_seqs and len(self.waiting[0].prompt) <= budget:
            r = self.waiting.pop(0)
            self.running.append(r)
            batch.append((r, r.prompt))
            budget -= len(r.prompt)
        if not batch:
            raise ValueError(f"a prompt of {len(self.waiting[0].prompt)} tokens does not fit the step budget of "
                             f"{self.token_budget} tokens")
        out = self.engine.step([Request(r.request_id, tuple(tokens), r.context) for r, tokens in batch])
        self.steps += 1
        predicted = out.logits.argmax(-1).tolist()
        stamp = clock() if clock else 0.0
        row = 0
        for r, tokens in batch:
            self._accept(r, tokens, predicted[row: row + len(tokens)])
            row += len(tokens)
            r.times.append(stamp)
        for r in [r for r in self.running if r.done]:
            self.running.remove(r)
            self.engine.release(r.request_id)
            self.done.append(r)

    @staticmethod
    def _accept(r: Live, tokens: list[int], predicted: list[int]) -> None:
        if r.context == 0:  # prefill: the last prompt position predicts the first token
            r.context = len(tokens)
            r.tokens.append(predicted[-1])
            return
        # Verify: the drafts tokens[1:] are accepted while they match what the model predicted.
        accepted = 0
        while accepted < len(tokens) - 1 and tokens[1 + accepted] == predicted[accepted]:
            accepted += 1
        r.context += 1 + accepted
        r.tokens.extend((tokens[1:1 + accepted] + [predicted[accepted]])[: r.output_len - len(r.tokens)])


def generate(engine, prompts: list[list[int]], budgets: list[int], *, max_num_seqs: int, token_budget: int,
             q: int = 1, first_id: int = 20_000_000) -> list[list[int]]:
    """Greedy generation of every prompt at once; the generated tokens of each."""
    scheduler = Scheduler(engine, max_num_seqs, token_budget, q)
    scheduler.waiting = [Live(first_id + i, list(p), n) for i, (p, n) in enumerate(zip(prompts, budgets))]
    while scheduler.waiting or scheduler.running:
        scheduler.step()
    by_id = {r.request_id: r.tokens for r in scheduler.done}
    return [by_id[first_id + i] for i in range(len(prompts))]


@dataclass(frozen=True)
class Workload:
    # 100 requests at 20 per second: the shape of vLLM's benchmark in docs/spec.md section 8.
    num_requests: int = 100
    rate: float = 20.0  # requests per second
    prompt_median: int = 64
    output_median: int = 48
    sigma: float = 0.8  # log-normal spread: a long tail of long prompts and answers
    max_model_len: int = 512
    seed: int = 0

    def draw(self) -> list[Live]:
        rng = random.Random(self.seed)
        now, requests = 0.0, []
        for index in range(self.num_requests):
            now += rng.expovariate(self.rate)
            prompt = self._length(rng, self.prompt_median, self.max_model_len // 2)
            output = self._length(rng, self.output_median, self.max_model_len - prompt - 2)
            requests.append(Live(10_000_000 + index, [(index * 13 + j * 7) % 200 + 1 for j in range(prompt)],
                                 output, arrival=now))
        return requests

    def _length(self, rng, median, most):
        return max(1, min(most, int(math.exp(rng.gauss(math.log(median), self.sigma)))))


def run(engine, workload: Workload, max_num_seqs: int, token_budget: int) -> dict:
    """Serve the workload in real time and return vLLM's serving metrics."""
    pending = workload.draw()
    scheduler = Scheduler(engine, max_num_seqs, token_budget)
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start  # noqa: E731
    while pending or scheduler.waiting or scheduler.running:
        now = clock()
        while pending and pending[0].arrival <= now:
            scheduler.waiting.append(pending.pop(0))
        if not scheduler.waiting and not scheduler.running:
            time.sleep(max(0.0, pending[0].arrival - now))
            continue
        scheduler.step(clock)
    return metrics(scheduler.done, clock(), scheduler.steps)


def metrics(done: list[Live], seconds: float, steps: int) -> dict:
    output = sum(len(r.tokens) for r in done)
    prompt = sum(len(r.prompt) for r in done)
    ttft = [r.times[0] - r.arrival for r in done]
    tpot = [(r.times[-1] - r.times[0]) / (len(r.times) - 1) for r in done if len(r.times) > 1]
    itl = [b - a for r in done for a, b in zip(r.times, r.times[1:])]
    return {
        "requests": len(done), "seconds": seconds, "steps": steps,
        "output_tok_s": output / seconds, "total_tok_s": (output + prompt) / seconds,
        "requests_s": len(done) / seconds,
        "mean_ttft_ms": 1e3 * statistics.mean(ttft),
        "mean_tpot_ms": 1e3 * statistics.mean(tpot) if tpot else None,
        "p99_tpot_ms": 1e3 * _percentile(tpot, 99) if tpot else None,
        "mean_itl_ms": 1e3 * statistics.mean(itl) if itl else None,
    }


def _percentile(values, pct):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]
