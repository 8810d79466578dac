"""Data-parallel execution (docs/spec.md section 4; invariant 9 of section 7): ranks in processes
of their own agree through torch.distributed, inside the engine's step().

Each rank is a process with its own engine (harness.runtime.ranks); every step each rank gets its
own batch, or none (idle), and the harness observes what each ran. Checked at every step:
- each rank's reported mode matches the graph launches the harness counted in its process;
- every rank runs the same mode: the lowest that the busy ranks' own dispatch() gives their
  batches alone, so no rank ever runs above what its batch alone allows;
- under a graph mode every rank runs at the largest size a busy rank's own dispatch chose; under
  NONE each busy rank runs at its own size (no padding across ranks);
- each busy rank's real rows equal its own eager step at the same padded shape, bit for bit;
- an idle rank runs a dummy batch: it joins the agreed mode and size, its graph launches are
  counted like any rank's (under NONE its eager forward is not observable), and it writes no KV;
- no rank writes a KV slot outside its real tokens' slots (an idle rank: none at all);
- under `vllm_rules`, each rank runs what harness.expectations.oracle.dp_dispatch says (an idle rank taking
  part as vLLM's dummy decode of one request);
- a rank that hangs (it waits on a collective another rank skipped) fails the step within a
  bounded time, naming the step and every rank's batch.
Expected values: the runtime's own dispatch(), the oracle, each rank's own eager step, and what
the harness observed in each rank's process.
"""
from dataclasses import replace

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from harness.runtime import ranks as distributed
from harness.expectations import expected
from harness.expectations import oracle
from harness.scenarios.batches import Sequence, advance, decode_requests, is_uniform, prompt
from harness.protocol import RankBatch, Request
from harness.reports.records import DataParallelStep
from harness.vocabulary import EAGER, OBSERVED, ORACLE, OWN_POLICY, RUNTIME_MODES, lowest

INVARIANT = "data-parallel execution"
pytestmark = pytest.mark.requires("execution", "data_parallel_execution")
MODES = ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"]
# Small limits keep capture cheap: vLLM's grid gives sizes 1, 2, 4, 8; batches up to 32 tokens.
MAX_NUM_SEQS, BATCHED_TOKENS = 4, 32
ABOVE = 12  # tokens: above the largest size of vLLM's grid here, inside the token budget

# A step gives each rank ("idle", 0), ("uniform", n): n requests of one token each, or ("mixed", n):
# decodes and one prompt, n tokens in all. The order matters to the self-tests: each broken runtime
# in tests/broken_dp_runtimes.py first fails at the step written for it.
SCRIPT = [
    ("mixed batches pad to the larger", [("mixed", 5), ("mixed", 3)]),
    ("decodes agree on FULL at the larger size", [("uniform", 2), ("uniform", 3)]),
    ("decode and mixed agree on the lower mode", [("uniform", 1), ("mixed", 3)]),
    ("an idle rank joins a decode", [("idle", 0), ("uniform", 3)]),
    ("above the largest size: eager, each at its own size", [("mixed", ABOVE), ("uniform", 3)]),
    ("an idle rank joins an eager step", [("idle", 0), ("mixed", ABOVE)]),
    ("every rank idle", [("idle", 0), ("idle", 0)]),
    ("exactly at a size: no padding", [("uniform", 4), ("mixed", 8)]),
]


class RankBatches:
    """One rank's requests through a sequence: decodes continue its sequences, prompts start new ones."""

    def __init__(self, new_id):
        self.new_id = new_id
        self.seqs: list[Sequence] = []
        self.started: set[int] = set()

    def batch(self, kind: str, tokens: int) -> list[Request]:
        if kind == "idle":
            return []
        if kind == "uniform":  # one token a request: decodes first, then one-token prompts
            decode = decode_requests(self.seqs[:tokens])
            return decode + [self._prompt(1) for _ in range(tokens - len(decode))]
        decode = decode_requests(self.seqs[: min(len(self.seqs), tokens - 2, MAX_NUM_SEQS - 1)])
        return decode + [self._prompt(tokens - len(decode))]

    def _prompt(self, length: int) -> Request:
        request_id = self.new_id()
        self.started.add(request_id)
        return Request(request_id, prompt(request_id, length), 0)

    def advance(self, requests: list[Request]) -> None:
        advance(self.seqs, requests)

    def make_room(self, requests: list[Request]) -> set[int]:
        """The oldest live requests this batch leaves out, to release before it runs so that at
        most MAX_NUM_SEQS are live (a real scheduler never seats more)."""
        live = [s.request_id for s in self.seqs]
        stepped = {r.request_id for r in requests}
        over = len(set(live) | stepped) - MAX_NUM_SEQS
        retired = {i for i in live if i not in stepped}
        retired = set(sorted(retired, key=live.index)[:max(0, over)])
        self.seqs = [s for s in self.seqs if s.request_id not in retired]
        self.started -= retired
        return retired


class DataParallelRun:
    """The ranks' engines for this module's tests, and the checks of one step."""

    def __init__(self, runtime, graph_backend):
        from harness.runtime.factory import EngineFactory  # imports torch: not at collection, for policy-only runs

        self.runtime, self.graph_backend = runtime, graph_backend
        self.factory = EngineFactory(runtime, graph_backend, max_num_seqs=MAX_NUM_SEQS,
                                     max_num_batched_tokens=BATCHED_TOKENS)
        self.world = distributed.world_size(graph_backend)
        self.kv = runtime.capabilities.kv_inspection
        self.failure: distributed.RankFailure | None = None  # the last run's, if ranks hung, raised or died

    def policy(self, mode: str):
        """(the engine config, the policy its engine should run, where that mode came from)."""
        config, want = self.factory.expect_resolution(mode)
        return config, replace(config.policy, mode=want.value or mode), want

    def engine(self, check, mode: str):
        """(pool, engine, the policy it runs); its build-time resolution checked as for_mode() does."""
        config, _, want = self.policy(mode)
        try:
            pool = distributed.pool(self.world, self.graph_backend)
            built = pool.build(self.runtime.wrapped, config)
        except distributed.RankFailure as failure:
            self.failure = failure
        if self.failure is not None:
            check.fail(self.failure.what, source=OBSERVED, case=self.failure.describe(f"building {mode} engines"))
        resolved = self.factory.check_resolved(check, mode, config, want, built.resolved)
        return pool, built, replace(config.policy, mode=resolved)

    def run(self, check, mode: str, steps: list[list[tuple[str, int]]], record=None) -> None:
        self.failure = None
        pool, built, policy = self.engine(check, mode)
        ranks = [RankBatches(self.factory.new_id) for _ in range(self.world)]
        try:
            for index, specs in enumerate(steps):
                batches = [rank.batch(*specs[r % len(specs)]) for r, rank in enumerate(ranks)]
                case = f"step {index} of {len(steps)} under {mode}"
                retired = [rank.make_room(batch) for rank, batch in zip(ranks, batches)]
                if any(retired):
                    pool.release(built, retired)
                try:
                    ran = pool.step(built, index, batches, self.kv)
                except distributed.RankFailure as failure:
                    self.failure = failure
                if self.failure is not None:  # failed outside the except block: no chained traceback
                    check.fail(self.failure.what, source=OBSERVED, case=self.failure.describe(case))
                waste = self.check_step(check, case, policy, built, ran)
                if record is not None:
                    record(DataParallelStep(
                        step=index, batches=[distributed.describe_rank_batch(b) for b in batches],
                        modes=[r.runtime_mode for r in ran], padded=[r.num_padded_tokens for r in ran],
                        agreed_mode=ran[0].runtime_mode if len({r.runtime_mode for r in ran}) == 1 else "disagreed",
                        waste_tokens=waste))
                for rank, batch in zip(ranks, batches):
                    rank.advance(batch)
        finally:
            if pool.alive:
                pool.release(built, [rank.started for rank in ranks])

    # -- the checks of one step ----------------------------------------------------------------
    def check_step(self, check, case: str, policy, built, ran) -> int:
        """Every check of one step; returns the padding the consensus cost (tokens beyond what
        each rank would have run alone; all of an idle rank's)."""
        runtime, q = self.runtime, policy.query_len
        case += "".join(f"\n    rank {r.rank}: {distributed.describe_rank_batch(r.requests)} -> ran {r.runtime_mode} "
                        f"at {r.num_padded_tokens}" for r in ran)
        for r in ran:
            check.that(r.problem is None, what=f"rank {r.rank}: {r.problem}", case=case,
                       source="the protocol (harness/protocol.py)")
        for r in ran:
            problem = expected.launches_problem(r.runtime_mode, built.pieces_per_size, r.graph_launches)
            check.that(problem is None, what=f"rank {r.rank}: {problem}", source=OBSERVED, case=case,
                       graph_launches_seen=r.graph_launches)
        busy = [r for r in ran if r.requests]
        own = {}  # what each busy rank's own dispatch() gives its batch alone
        if runtime.capabilities.dispatch:
            for r in busy:
                uniform = is_uniform(r.requests, q)
                own[r.rank] = runtime.dispatch(policy, r.num_real_tokens, len(r.requests), uniform)
        alone = {"alone": {rank: f"{d.runtime_mode} at {d.descriptor.num_padded_tokens}" for rank, d in own.items()}}
        alone = alone if own else {}  # shown with each failure below
        # The mode: the same on every rank, the lowest the busy ranks' own dispatch() gives.
        if own:
            agreed, source = lowest(d.runtime_mode for d in own.values()), OWN_POLICY
            rule = f"{agreed}, the lowest mode the busy ranks' own dispatch() gives their batches alone"
        else:
            agreed = ran[0].runtime_mode
            source, rule = OBSERVED, f"the same mode as rank 0 ({agreed})"
        for r in ran:
            above = RUNTIME_MODES.index(r.runtime_mode) > RUNTIME_MODES.index(agreed)
            check.that(r.runtime_mode == agreed, source=source, case=case, **alone,
                       what=f"rank {r.rank} ran {r.runtime_mode}; every rank must run {rule}"
                            + (" (never a higher one)" if above else ""))
        # The size: under a graph mode the largest a busy rank's own dispatch chose, on every rank;
        # under NONE each busy rank its own (its real tokens, or the size its own dispatch chose).
        if agreed != "NONE":
            if own:
                size, source = max(d.descriptor.num_padded_tokens for d in own.values()), OWN_POLICY
                rule = f"the largest size any busy rank's own dispatch() chose ({size})"
            else:
                size = ran[0].num_padded_tokens
                source, rule = OBSERVED, f"the same size as rank 0 ({size})"
            for r in ran:
                check.that(r.num_padded_tokens == size, source=source, case=case, **alone,
                           what=f"rank {r.rank} ran {agreed} at {r.num_padded_tokens}; under a graph mode every "
                                f"rank pads to {rule}")
        else:
            for r in busy:
                allowed = sorted({r.num_real_tokens, own[r.rank].descriptor.num_padded_tokens}) if r.rank in own else None
                check.that(allowed is None or r.num_padded_tokens in allowed, source=OWN_POLICY, case=case, **alone,
                           what=f"rank {r.rank} ran NONE at {r.num_padded_tokens}; agreed on eager, a rank runs at "
                                f"its own size {allowed} (no padding across ranks under NONE)")
        for r in ran:
            if r.requests:
                check.same_bits(r.logits, r.eager_logits, source=EAGER, case=case,
                                what=f"rank {r.rank}'s step vs its own eager step at the same padded shape")
            if r.stray_kv_slots is not None:
                check.that(not r.stray_kv_slots, source=OBSERVED, case=case, stray_slots=r.stray_kv_slots[:10],
                           what=f"rank {r.rank} wrote KV slots outside its real tokens' slots" +
                                         ("" if r.requests else " (an idle rank's dummy batch must write none)"))
        if runtime.capabilities.has("vllm_rules"):
            batches = [RankBatch(r.num_real_tokens, len(r.requests), is_uniform(r.requests, q))
                       if r.requests else RankBatch(q, 1, True) for r in ran]  # idle: vLLM's dummy decode
            want = [(d.runtime_mode, d.descriptor.num_padded_tokens) for d in oracle.dp_dispatch(policy, batches)]
            check.equal([(r.runtime_mode, r.num_padded_tokens) for r in ran], want, source=ORACLE, case=case,
                        what="what each rank ran (mode, padded size)")
        return sum(r.num_padded_tokens - (own[r.rank].descriptor.num_padded_tokens if r.rank in own else r.num_real_tokens)
                   for r in ran)


@pytest.fixture(scope="module")
def dp(runtime, graph_backend):
    if graph_backend == "cuda":
        import torch

        if torch.cuda.device_count() < 2:
            pytest.skip(f"NCCL ranks need one GPU each, and this machine has {torch.cuda.device_count()}: "
                        "run on two GPUs (scripts/data_parallel_gpu.sh), or on the CPU with gloo")
    return DataParallelRun(runtime, graph_backend)


@pytest.mark.parametrize("mode", MODES)
def test_scripted_sequence(check, record, dp, mode):
    dp.run(check, mode, [specs for _, specs in SCRIPT], record=record)


@st.composite
def rank_batches(draw, sizes: list[int]):
    """A rank's batch at a bucket edge of the runtime's own sizes: idle, uniform, mixed, or above the largest."""
    edges = sorted({n for s in sizes for n in (s - 1, s, s + 1) if 1 <= n <= BATCHED_TOKENS})
    kinds = ["idle", "uniform", "mixed"] + (["above"] if max(sizes) < BATCHED_TOKENS else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "idle":
        return ("idle", 0)
    if kind == "uniform":  # one token a request, so at most max_num_seqs of them
        return ("uniform", draw(st.sampled_from([n for n in edges if n <= MAX_NUM_SEQS] or [1, MAX_NUM_SEQS])))
    if kind == "mixed":  # a prompt of two tokens at least
        return ("mixed", draw(st.sampled_from([n for n in edges if n >= 2] or [2, BATCHED_TOKENS])))
    return ("mixed", draw(st.integers(max(sizes) + 1, BATCHED_TOKENS)))


@pytest.fixture
def seen():
    """Across one test's examples: the failures of drawn sequences, and whether ranks failed."""
    return {"failures": {}, "ranks_failed": False}


@given(data=st.data())
def test_drawn_sequences(check, dp, seen, data):
    mode = data.draw(st.sampled_from(MODES), label="mode")
    _, policy, _ = dp.policy(mode)
    sizes = (dp.runtime.capture_sizes(policy) if dp.runtime.capabilities.capture_sizes else []) or list(range(1, 17))
    steps = data.draw(st.lists(st.lists(rank_batches(sizes), min_size=dp.world, max_size=dp.world), min_size=1,
                               max_size=4), label="steps")
    drawn = (mode, repr(steps))
    # Ranks that hung cost a step timeout and a new pool, and shrinking would pay that for every
    # candidate. So failures replay from memory, and after ranks failed new candidates are rejected.
    if drawn in seen["failures"]:
        pytest.fail(seen["failures"][drawn], pytrace=False)
    if seen["ranks_failed"]:
        reject()
    try:
        dp.run(check, mode, steps)
    except pytest.fail.Exception as failure:
        seen["failures"][drawn] = str(failure)
        seen["ranks_failed"] |= dp.failure is not None
        raise
