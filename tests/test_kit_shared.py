"""The kit parts the real engines' runtimes share (vLLM's, and LMDeploy's where they fit), on stand-ins,
no GPU and no engine: the opt-in call trace, the engine's batch rows, the greedy sampling check,
the eager step, capture once, the build held to its policy, the cached memory handed back, the KV
cache's size and the slot a position is written to."""
import gc
from types import SimpleNamespace

import pytest
import torch

from harness.kit import guard
from harness.kit.block_book import DEFAULT_KV_TOKENS, BlockBook, num_blocks_for
from harness.kit.checks import check_built
from harness.kit.events import EventLog
from harness.kit.scheduled import (greedy_misses, greedy_tolerance, not_the_maximum, request_rows, rows_in_order,
                                   sampled_greedily)
from harness.protocol import Request

from tests.test_kit_engine import StandIn  # the scheduled-engine stand-in of the kit's own tests


# -- the opt-in call trace (EventLog.trace_calls) ---------------------------------------------------
class Backend:
    calls = 0

    @staticmethod
    def attention(x, *, size):
        Backend.calls += 1
        return x * 2


def describe(x, *, size):
    if size < 0:
        raise ValueError("no size")
    return f"size={size}"


@pytest.fixture
def backend(monkeypatch, tmp_path):
    monkeypatch.setattr(Backend, "attention", Backend.__dict__["attention"])  # put back after the test
    path = tmp_path / "events.log"
    monkeypatch.setenv("KIT_TRACE_EVENTS", str(path))
    return EventLog("kit_trace", "KIT_TRACE_EVENTS"), path


def test_a_trace_is_off_and_wraps_nothing_unless_its_variable_is_set(backend, monkeypatch):
    log, _ = backend
    monkeypatch.delenv("KIT_TRACE", raising=False)
    original = Backend.attention
    assert log.trace_calls(Backend, "attention", "KIT_TRACE", "attention", describe) is False
    assert Backend.attention is original


def test_a_trace_logs_each_call_of_the_tests_it_names_once_and_calls_through(backend, monkeypatch):
    log, path = backend
    monkeypatch.setenv("KIT_TRACE", "test_wanted")
    assert log.trace_calls(Backend, "attention", "KIT_TRACE", "attention", describe) is True
    traced = Backend.attention
    assert log.trace_calls(Backend, "attention", "KIT_TRACE", "attention", describe) is True
    assert Backend.attention is traced  # wrapped once
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/a.py::test_wanted[x] (call)")
    assert Backend.attention(3, size=4) == 6
    assert Backend.attention(3, size=-1) == 6  # a describe that raises changes nothing of the call
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/a.py::test_other (call)")
    assert Backend.attention(5, size=1) == 10
    lines = [line.split(" ", 1)[1] for line in path.read_text().splitlines()]
    assert lines == ["attention tests/a.py::test_wanted[x] size=4",
                     "attention tests/a.py::test_wanted[x] not traced: ValueError('no size')"]


# -- the engine's batch rows ------------------------------------------------------------------------
class EngineError(RuntimeError):
    pass


def planned(*requests):
    return [SimpleNamespace(engine_id=f"req-{i}", num_new=n) for i, n in requests]


def test_each_request_gets_its_rows_in_the_engines_batch_order():
    rows = request_rows(["req-2", "req-1"], [0, 3, 4], planned((1, 1), (2, 3)), lambda q: q.engine_id)
    assert [(q.engine_id, list(span)) for q, span in rows] == [("req-1", [3]), ("req-2", [0, 1, 2])]


@pytest.mark.parametrize("batch, starts, message", [
    (["req-1"], [0, 1], r"the stand-in's batch has no request req-2; it ran \['req-1'\]"),
    (["req-1", "req-2"], [0, 1, 3], "the stand-in scheduled 2 tokens of req-2; this runtime asked for 3"),
])
def test_a_batch_that_is_not_the_step_asked_for_is_the_engines_error(batch, starts, message):
    with pytest.raises(EngineError, match=message):
        request_rows(batch, starts, planned((1, 1), (2, 3)), lambda q: q.engine_id, "the stand-in", EngineError)


# -- the greedy sampling check ----------------------------------------------------------------------
def test_a_sampled_token_that_is_not_its_rows_maximum_is_found():
    row = torch.tensor([0.0, 2.0, 1.5])
    assert not_the_maximum(row, 1, greedy_tolerance("float32")) is None
    assert not_the_maximum(row, 2, greedy_tolerance("float32")) == (1, 0.5)
    assert not_the_maximum(row.half(), 2, 0.6) is None  # within the tolerance
    assert greedy_tolerance("float32") < greedy_tolerance("float16") < greedy_tolerance("bfloat16")
    assert greedy_tolerance("float8") == greedy_tolerance("bfloat16")


def test_greedy_misses_checks_every_picked_row_at_once_and_names_each_miss():
    logits = torch.tensor([[0.0, 2.0, 1.5], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    picks = [(0, 1), (1, 2), (3, 0), (2, 2)]  # rows in any order; the second picks a token 3.0 below the max
    assert greedy_misses(logits, picks, greedy_tolerance("float32")) == [(1, 0, 3.0)]
    assert greedy_misses(logits, [(0, 2), (1, 2)], 0.6) == [(1, 0, 3.0)]  # 0.5 below: within 0.6
    assert greedy_misses(logits, [], 0.0) == []
    assert greedy_misses(logits.bfloat16(), [(3, 1)], 0.0) == []  # a tie is the maximum


def verify(i, n):
    return SimpleNamespace(engine_id=f"req-{i}", request_id=i, num_new=n)


def test_every_sampled_token_is_checked_and_a_verify_steps_accepted_drafts_counted():
    rows = rows_in_order([verify(1, 1), verify(2, 3)])  # request 1 decodes (row 0), request 2 verifies 2 drafts
    assert [list(span) for _, span in rows] == [[0], [1, 2, 3]]
    logits = torch.zeros(4, 10)
    logits[0, 5] = logits[1, 7] = logits[2, 2] = logits[3, 4] = 1.0  # greedy accepts draft 7, rejects 8
    drafts = {"req-2": [7, 8]}

    def check(sampled, drafts=drafts):
        return sampled_greedily(rows, logits, sampled, drafts, lambda q: q.engine_id, 1e-3, "the stand-in", EngineError)

    assert check({"req-1": [5], "req-2": [7, 2]}) == {2: 1}
    assert check({"req-1": [5], "req-2": [4]}, {}) == {}  # no drafts: the last row only
    with pytest.raises(EngineError, match=r"\('req-2', 1, 3, 2, 1.0\)\]: the rows were misread"):
        check({"req-1": [5], "req-2": [7, 3]})
    with pytest.raises(EngineError, match=r"\('req-1', 0, 4, 5, 1.0\)"):
        check({"req-1": [4], "req-2": [7, 2]})
    with pytest.raises(EngineError, match=r"the stand-in sampled \[7, 2, 4, 4\] for verify request req-2"):
        check({"req-1": [5], "req-2": [7, 2, 4, 4]})
    with pytest.raises(EngineError, match="sampled \\[\\] for verify request"):
        check({"req-1": [5]})


# -- the eager step ---------------------------------------------------------------------------------
def test_an_eager_step_runs_at_the_asked_size_within_the_static_buffers():
    engine = StandIn()
    engine.step = None  # eager_step is a step of its own, not step() with another size
    out = engine.eager_step([Request(1, (3, 4, 5), 0)], 8)
    assert engine.last.eager_size == 8 and out.num_real_tokens == 3
    for size in (2, 65):  # fewer than the step's tokens; more than max_num_batched_tokens (64)
        with pytest.raises(ValueError, match=rf"eager_step at {size} tokens: .*the stand-in's static buffers of "
                                             "max_num_batched_tokens=64"):
            engine.eager_step([Request(2, (3, 4, 5), 0)], size)
    assert 2 not in engine.requests.live  # refused before anything was placed


# -- the build held to its policy -------------------------------------------------------------------
def test_a_built_engine_other_than_its_policy_answers_is_closed_and_refused(tmp_path, monkeypatch):
    path = tmp_path / "events.log"
    monkeypatch.setenv("KIT_BUILT_EVENTS", str(path))
    events, closed = EventLog("kit_built", "KIT_BUILT_EVENTS"), []
    engine = SimpleNamespace(close=lambda: closed.append(True))
    answered = ("FULL", [1, 2, 4], {"FULL": ("d4", "d2", "d1")})
    check_built(engine, answered, answered, "engine #1", "the stand-in", events)
    assert not closed and not path.exists()
    with pytest.raises(RuntimeError, match=r"engine #1: the stand-in's engine resolved PIECEWISE, capture sizes "
                                           r"\[1, 2\].*this runtime's policy answers FULL, \[1, 2, 4\]"):
        check_built(engine, ("PIECEWISE", [1, 2], {}), answered, "engine #1", "the stand-in", events)
    assert closed == [True] and "engine #1: BUILD CHECK FAILED" in path.read_text()


# -- the cached memory handed back ------------------------------------------------------------------
def test_cached_memory_is_collected_then_handed_back(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda: calls.append("gc"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    guard.cached_memory_returned()
    assert calls == ["gc", "empty_cache"]


# -- the KV cache's size ----------------------------------------------------------------------------
def test_the_kv_cache_holds_the_reserved_blocks_the_tokens_and_a_partial_block_a_request():
    assert num_blocks_for(100, 16, 4, reserved=1) == 1 + 7 + 4
    assert num_blocks_for(None, 64, 2, reserved=0) == DEFAULT_KV_TOKENS // 64 + 2


# -- the KV slot a position is written to -----------------------------------------------------------
def test_a_slot_is_the_block_tables_position_expanded_to_kernel_blocks_where_those_are_smaller():
    book = BlockBook(num_blocks=9, block_size=16, vocab=256, max_len=128, max_seqs=4, max_tokens=64)
    book.commit(book.plan([Request(1, tuple(range(20)), 0)]))
    blocks = book.live[1].blocks
    assert book.slot(1, 17) == blocks[1] * 16 + 1  # kernel blocks the size of the engine's
    assert book.slot(1, 9, kernel_block_size=8) == (blocks[0] * 2 + 1) * 8 + 1  # two kernel blocks a block
    with pytest.raises(ValueError, match="positions 0..31, not 32"):
        book.slot(1, 32)


# -- capture once, and the last step's record -------------------------------------------------------
def test_a_second_capture_and_inputs_before_a_step_are_refused():
    engine = StandIn()
    engine.capture_once("at its start")  # nothing captured yet
    with pytest.raises(RuntimeError, match="no step has run yet"):
        engine.last_record()
    engine.captured = "a CaptureReport"
    with pytest.raises(RuntimeError, match="the stand-in captures once, at its start, and the capture phase is over"):
        engine.capture_once("at its start")
    engine.step([Request(1, (3,), 0)])
    assert engine.last_record() is engine.observer.record
