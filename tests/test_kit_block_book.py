"""The engine kit's block book (harness/kit/block_book.py) on a stand-in runtime's books: what a
step the engine's scheduler could never produce gets, a full KV cache, and a failed step that
takes nothing back; harness.block_book still imports, with a DeprecationWarning naming the new path."""
import importlib
import sys
from dataclasses import dataclass

import pytest

from harness.kit.block_book import BlockBook, Live
from harness.protocol import Request


@dataclass
class Placed:
    request_id: int
    context_len: int
    new_tokens: tuple
    blocks: tuple


class Book(BlockBook):
    def placed(self, request, live, tokens):
        return Placed(request.request_id, request.context_len, tokens, tuple(live.blocks))


def make_book(num_blocks=9, block_size=16, max_seqs=4, max_tokens=64, first_block=1):
    return Book(num_blocks, block_size, vocab=256, max_len=128, max_seqs=max_seqs, max_tokens=max_tokens,
                first_block=first_block)


@pytest.mark.parametrize("requests,message", [
    ([Request(1, (1,), 2)], "says 2 tokens are cached"),
    ([Request(1, (300,), 0)], "outside the vocabulary"),
    ([Request(1, (1,), 0), Request(1, (2,), 0)], "appears twice"),
    ([Request(1, tuple([1] * 65), 0)], "max_num_batched_tokens"),
    ([Request(i, (1,), 0) for i in range(5)], "max_num_seqs"),
    ([Request(1, (), 0)], "no tokens"),
    ([], "at least one request"),
    ([Request(1, tuple([1] * 60), 0), Request(1, (1,) * 4, 60)], "appears twice"),
])
def test_a_step_the_engines_scheduler_could_not_produce_is_refused(requests, message):
    with pytest.raises(ValueError, match=message):
        make_book().plan(requests)


def test_a_request_past_max_model_len_is_refused():
    book = make_book(num_blocks=20)
    book.commit(book.plan([Request(1, tuple([1] * 64), 0)]))
    book.commit(book.plan([Request(1, tuple([1] * 64), 64)]))
    with pytest.raises(ValueError, match="max_model_len is 128"):
        book.plan([Request(1, (1,), 128)])


def test_a_full_kv_cache_is_a_runtime_error_and_the_failed_step_takes_nothing():
    book = make_book(num_blocks=4)  # 3 usable blocks
    book.commit(book.plan([Request(1, tuple(range(1, 17)), 0)]))
    free = list(book.free)
    with pytest.raises(RuntimeError, match="KV cache is full"):
        book.plan([Request(2, tuple(range(1, 17)), 0), Request(3, tuple(range(1, 33)), 0)])
    assert book.free == free and set(book.live) == {1}


def test_blocks_below_the_first_are_never_handed_out_and_come_lowest_first():
    book = make_book(num_blocks=6, first_block=2)
    planned = book.plan([Request(1, tuple(range(1, 18)), 0), Request(2, (5,), 0)])
    assert [q.blocks for q in planned] == [(2, 3), (4,)]


def test_commit_rewinds_to_the_context_and_release_gives_the_blocks_back():
    book = make_book()
    book.commit(book.plan([Request(1, (3, 4, 5), 0)]))
    book.commit(book.plan([Request(1, (7,), 2)]))  # position 2 again: an eager step after a graph step
    assert book.live[1].tokens == [3, 4, 7]
    free = len(book.free)
    assert isinstance(book.release(1), Live) and len(book.free) == free + 1
    assert book.release(1) is None
    with pytest.raises(ValueError, match="not live"):
        book.held(1, 0)


def test_held_refuses_a_position_outside_the_requests_blocks():
    book = make_book()
    book.commit(book.plan([Request(1, (3, 4, 5), 0)]))
    assert book.held(1, 15) is book.live[1]
    with pytest.raises(ValueError, match="positions 0..15"):
        book.held(1, 16)


def test_misplaced_names_each_request_whose_slots_differ_from_the_books():
    book = BlockBook(9, 16, vocab=256, max_len=128, max_seqs=4, max_tokens=64)
    planned = book.plan([Request(1, (3, 4, 5), 0), Request(2, (6,), 0)])  # blocks 1 and 2
    rows = [(planned[1], range(0, 1)), (planned[0], range(1, 4))]  # the engine ran request 2 first
    assert book.misplaced([32, 16, 17, 18, -1], rows) == []  # a padded row's slot is nobody's
    assert book.misplaced([32, 16, 17, 18], rows, kernel_block_size=8) == []  # block 1 = kernel blocks 2, 3
    assert book.misplaced([16, 32, 17, 18], rows) == [
        "request 2's tokens in KV slots [16]; the block bookkeeping says [32]",
        "request 1's tokens in KV slots [32, 17, 18]; the block bookkeeping says [16, 17, 18]"]


def test_the_old_module_still_imports_and_names_the_new_one():
    sys.modules.pop("harness.block_book", None)
    with pytest.warns(DeprecationWarning, match="harness.kit.block_book"):
        old = importlib.import_module("harness.block_book")
    assert old.BlockBook is BlockBook and old.Live is Live


def test_a_book_that_names_nothing_differently_places_requests_as_the_kits_placed():
    from harness.kit.block_book import Placed

    book = BlockBook(9, 16, vocab=256, max_len=128, max_seqs=4, max_tokens=64)
    (first,) = book.plan([Request(1, (5, 6, 7), 0)])
    assert first == Placed(1, (5, 6, 7), 0, (1,)) and first.num_new == 3
    book.commit([first])
    (second,) = book.plan([Request(1, (8,), 3)])
    assert second == Placed(1, (8,), 3, (1,))
