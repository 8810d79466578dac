"""A serving benchmark over the runtime protocol: a synthetic request stream through continuous
batching, in the shape of vLLM PR #20059's table (SPEC 8).

Requests arrive by a Poisson process; prompt and output lengths are drawn from long-tailed
(log-normal) distributions like chat traffic. No dataset is downloaded. The scheduler here is
the harness's own (decode every running request, then admit whole prompts while the token
budget and seats last) so any runtime can be measured the same way.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

from .protocol import Request


@dataclass(frozen=True)
class Workload:
    num_requests: int = 200
    rate: float = 20.0  # requests per second
    prompt_median: int = 64
    output_median: int = 48
    sigma: float = 0.8  # log-normal spread: a long tail of long prompts and answers
    max_model_len: int = 512
    seed: int = 0

    def draw(self) -> list[tuple[float, list[int], int]]:
        """(arrival second, prompt tokens, output length) per request."""
        rng = random.Random(self.seed)
        now, requests = 0.0, []
        for index in range(self.num_requests):
            now += rng.expovariate(self.rate)
            prompt = self._length(rng, self.prompt_median, self.max_model_len // 2)
            output = self._length(rng, self.output_median, self.max_model_len - prompt - 2)
            requests.append((now, [(index * 13 + j * 7) % 200 + 1 for j in range(prompt)], output))
        return requests

    def _length(self, rng, median, most):
        return max(1, min(most, int(math.exp(rng.gauss(math.log(median), self.sigma)))))


@dataclass
class _Live:
    request_id: int
    arrival: float
    prompt: list[int]
    output_len: int
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    context: int = 0


def run(engine, workload: Workload, max_num_seqs: int, token_budget: int) -> dict:
    """Serve the workload in real time and return vLLM's serving metrics."""
    pending = [_Live(10_000_000 + i, t, p, n) for i, (t, p, n) in enumerate(workload.draw())]
    waiting, running, done = [], [], []
    start = time.perf_counter()
    steps = 0
    while pending or waiting or running:
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            waiting.append(pending.pop(0))
        if not waiting and not running:
            time.sleep(max(0.0, pending[0].arrival - now))
            continue
        batch = [(r, [r.tokens[-1]]) for r in running]
        budget = token_budget - len(batch)
        while waiting and len(running) < max_num_seqs and len(waiting[0].prompt) <= budget:
            r = waiting.pop(0)
            running.append(r)
            batch.append((r, r.prompt))
            budget -= len(r.prompt)
        out = engine.step([Request(r.request_id, tuple(tokens), r.context) for r, tokens in batch])
        steps += 1
        # Greedy sampling from the last row of each request.
        ends, row = [], 0
        for _, tokens in batch:
            row += len(tokens)
            ends.append(row - 1)
        picks = out.logits[ends].argmax(-1).tolist()
        stamp = time.perf_counter() - start
        for (r, tokens), token in zip(batch, picks):
            r.context += len(tokens)
            r.tokens.append(token)
            r.times.append(stamp)
        for r in [r for r in running if len(r.tokens) >= r.output_len]:
            running.remove(r)
            engine.release(r.request_id)
            done.append(r)
    return metrics(done, time.perf_counter() - start, steps)


def metrics(done: list[_Live], seconds: float, steps: int) -> dict:
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
