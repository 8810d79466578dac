"""Broken engines rebuilt from CUDA-graph bugs that engines shipped in 2025-26 (issue 53): the
reference engine with one bug each, replacing one named part as a third party would (a stager,
a planner, an attention backend, a public method). Each passed every suite before the suites
learnt to look (reports/issue53/slip_past_main.txt); tests/test_broken_shipped.py checks that they
are caught now.
"""
from __future__ import annotations

from dataclasses import replace

from harness.protocol import KVCacheFull
from reference_runtime.engine.buffers import StaticBuffers
from reference_runtime.engine.plan import FULL, NONE, Planner
from reference_runtime.engine.attention import BACKENDS
from reference_runtime.engine.strategy import CapturedGraphs
from tests.broken_engines import _CapturesInService, _WindowFrozenAtCapture, mutant, with_seams


# -- padded request rows --------------------------------------------------------------------------
class StaleRequestRowsStager(StaticBuffers):
    """Padded request rows keep the sequence lengths and block-table rows an earlier step left in the
    static buffers (SGLang: FlashInfer then read live requests' blocks, or past the cache). Real rows
    are right and padded tokens write nothing, so every output is right."""

    def stage(self, plan):
        real, rows = plan.num_real_rows, plan.num_rows
        left_lengths = self.seq_lens[real:rows].tolist()  # what an earlier step left there
        left_tables = [[block for block in row if block] or [0] for row in self.block_tables[real:rows].tolist()]
        return super().stage(replace(plan, seq_lens=plan.seq_lens[:real] + left_lengths,
                                     block_tables=plan.block_tables[:real] + left_tables))


class StaleRequestLengthsStager(StaticBuffers):
    """Padded request rows point at the null block, but keep the sequence lengths an earlier step
    left in the static buffers: neutral tables, lengths that depend on what ran before (a kernel
    that sizes its work or its split by them does different work each replay)."""

    def stage(self, plan):
        real, rows = plan.num_real_rows, plan.num_rows
        return super().stage(replace(plan, seq_lens=plan.seq_lens[:real] + self.seq_lens[real:rows].tolist()))


class SeqLensBeforeTheStepStager(StaticBuffers):
    """Real request rows carry their context before the step instead of after it (the new tokens
    left out). The reference's default attention masks by positions, not lengths, so its outputs
    stay right; a kernel that masks by length drops each row's newest token."""

    def stage(self, plan):
        real = plan.num_real_rows
        before = [length - (end - start) for length, start, end in
                  zip(plan.seq_lens[:real], plan.query_start_loc[:real], plan.query_start_loc[1:real + 1])]
        return super().stage(replace(plan, seq_lens=before + plan.seq_lens[real:]))


class QueryStartsCountTheContextStager(StaticBuffers):
    """FULL graph steps stage each row's cumulative context length as its query start (the key
    offsets, cu_seqlens_k, where the query offsets belong). Non-decreasing and the same every time;
    no kernel a FULL graph of the reference holds reads them, so every output stays right."""

    def stage(self, plan):
        if plan.mode is not FULL:
            return super().stage(plan)
        starts = [0]
        for length in plan.seq_lens:
            starts.append(starts[-1] + length)
        return super().stage(replace(plan, query_start_loc=starts))


class QueryStartsPaddedWithMinusOneStager(StaticBuffers):
    """Padded request rows' query start offsets are -1 (vLLM: FlashAttention, which needs them
    non-decreasing, then replayed FULL graphs wrong). The reference's kernels read them only in
    eager varlen attention, where a row ending before it starts is skipped: outputs stay right."""

    def stage(self, plan):
        real = plan.num_real_rows
        starts = plan.query_start_loc[: real + 1] + [-1] * (plan.num_rows - real)
        return super().stage(replace(plan, query_start_loc=starts))


# -- a full KV cache ------------------------------------------------------------------------------
DUMMY_REQUEST = -53  # the padding dummy's id in the block allocator


class _LazyPaddingDummyPlanner(Planner):
    """The padding dummy is a request of its own, given a KV block from the pool the first time a
    padded graph step needs it (TensorRT-LLM's CUDA-graph dummy). With every block taken there is
    none to give, and the padded step silently runs eager, unpadded, where the policy says graph."""

    def plan(self, requests, captured):
        plan = super().plan(requests, captured)
        if plan.mode is NONE or plan.num_padded_tokens == plan.num_real_tokens \
                or DUMMY_REQUEST in self.allocator.tables:
            return plan
        if not self.allocator.free:
            return self.lay_out(list(requests), NONE, None, plan.num_real_tokens)
        self.allocator.ensure(DUMMY_REQUEST, 1)
        return plan


class _PerStepDummyPlanner(Planner):
    """The padding dummy gets a KV block from the pool for each padded graph step and gives it back
    at the next plan (TensorRT-LLM's dummy request). With every block taken, it borrows the newest
    live request's last block instead; `borrowed(plan, block)` says what the step does with it."""

    def plan(self, requests, captured):
        if DUMMY_REQUEST in self.allocator.tables:
            self.allocator.release(DUMMY_REQUEST)
        plan = super().plan(requests, captured)
        if plan.mode is NONE or plan.num_padded_tokens == plan.num_real_tokens:
            return plan
        if self.allocator.free:
            self.allocator.ensure(DUMMY_REQUEST, 1)
            return plan
        newest = list(self.allocator.tables)[-1]
        block = self.allocator.tables[newest][-1]
        self.allocator.tables[DUMMY_REQUEST] = [block]
        return self.borrowed(plan, block)

    def borrowed(self, plan, block):
        return plan


class _PadWritesABorrowedBlockPlanner(_PerStepDummyPlanner):
    """The padding dummy gets a KV block from the pool for each padded graph step (TensorRT-LLM's
    dummy request); with every block taken it borrows the newest live request's last block, and
    the padded tokens, the dummy's own, write their KV there, over that request's context."""

    def borrowed(self, plan, block):
        real, size = plan.num_real_tokens, self.allocator.block_size
        pads = [block * size + i % size for i in range(plan.num_padded_tokens - real)]
        return replace(plan, slot_mapping=plan.slot_mapping[:real] + pads)


class _DummyFreesABorrowedBlockPlanner(_PerStepDummyPlanner):
    """The padding dummy gets a KV block from the pool for each padded graph step and gives it back
    at the next plan (TensorRT-LLM's dummy request); with every block taken it borrows the newest
    live request's last block, and gives that back too: a block both live and free, which the pool
    later hands out a second time. Every step's output is right."""


class _RefusesWithAnyErrorPlanner(Planner):
    """Refuses a step that needs more KV blocks than are free with a RuntimeError of its own instead
    of the protocol's KVCacheFull: a caller cannot tell 'wait for blocks' from a crash."""

    def plan(self, requests, captured):
        try:
            return super().plan(requests, captured)
        except KVCacheFull as exc:
            raise RuntimeError(f"scheduler: no free KV block ({exc})") from None


# -- the moved-input test's causes ----------------------------------------------------------------
LAZY_KEY_MISSES_THE_CONTEXT_DOC = """Declares lazy_capture; each graph is recorded the first time a step needs
it and keyed by the step's padded size alone, while its attention sizes the context window from the
longest context of the recorded step (a host value the graph keeps): a later step of that size with
a longer context replays a graph too short for it, moved inputs or not."""
# Declares lazy_capture; each graph is recorded the first time a step needs it (_CapturesInService)
# and keyed by the step's padded size alone, while its attention sizes the context window from the
# longest context of the recorded step (_WindowFrozenAtCapture, a host value the graph keeps): a
# later step of that size with a longer context replays a graph too short for it, moved inputs or not.
_LAZY_KEY_MISSES_THE_CONTEXT = with_seams(backends={**BACKENDS, "static": _WindowFrozenAtCapture},
                                          strategy=_CapturesInService.around(CapturedGraphs))


StaleRequestRows = mutant("stale-request-rows", "StaleRequestRows", with_seams(stager=StaleRequestRowsStager),
                          StaleRequestRowsStager.__doc__)
StaleRequestLengths = mutant("stale-request-lengths", "StaleRequestLengths", with_seams(stager=StaleRequestLengthsStager),
                             StaleRequestLengthsStager.__doc__)
SeqLensBeforeTheStep = mutant("seq-lens-before-the-step", "SeqLensBeforeTheStep",
                              with_seams(stager=SeqLensBeforeTheStepStager), SeqLensBeforeTheStepStager.__doc__)
QueryStartsCountTheContext = mutant("query-starts-count-the-context", "QueryStartsCountTheContext",
                                    with_seams(stager=QueryStartsCountTheContextStager),
                                    QueryStartsCountTheContextStager.__doc__)
QueryStartsPaddedWithMinusOne = mutant("query-starts-padded-with-minus-one", "QueryStartsPaddedWithMinusOne",
                                       with_seams(stager=QueryStartsPaddedWithMinusOneStager),
                                       QueryStartsPaddedWithMinusOneStager.__doc__)
LazyPaddingDummy = mutant("lazy-padding-dummy", "LazyPaddingDummy", with_seams(planner=_LazyPaddingDummyPlanner),
                          _LazyPaddingDummyPlanner.__doc__)
PadWritesABorrowedBlock = mutant("pad-writes-a-borrowed-block", "PadWritesABorrowedBlock",
                                 with_seams(planner=_PadWritesABorrowedBlockPlanner),
                                 _PadWritesABorrowedBlockPlanner.__doc__)
DummyFreesABorrowedBlock = mutant("dummy-frees-a-borrowed-block", "DummyFreesABorrowedBlock",
                                  with_seams(planner=_DummyFreesABorrowedBlockPlanner),
                                  _DummyFreesABorrowedBlockPlanner.__doc__)
RefusesWithAnyError = mutant("refuses-with-any-error", "RefusesWithAnyError",
                             with_seams(planner=_RefusesWithAnyErrorPlanner), _RefusesWithAnyErrorPlanner.__doc__)
LazyKeyMissesTheContext = mutant("lazy-key-misses-the-context", "LazyKeyMissesTheContext", _LAZY_KEY_MISSES_THE_CONTEXT,
                                 LAZY_KEY_MISSES_THE_CONTEXT_DOC, lazy_capture=True)

MUTANTS = [StaleRequestRows, StaleRequestLengths, SeqLensBeforeTheStep, QueryStartsCountTheContext,
           QueryStartsPaddedWithMinusOne, LazyPaddingDummy,
           PadWritesABorrowedBlock, DummyFreesABorrowedBlock, RefusesWithAnyError, LazyKeyMissesTheContext]
for _runtime in MUTANTS:
    _runtime.__module__ = __name__  # found here when a data-parallel rank unpickles it
