"""The engine kit's step-observer base (harness/kit/observer.py) on CPU tensors: a fresh record for
every step, and padded rows filled as asked, the real rows left alone."""
from dataclasses import dataclass

import torch

from harness.kit.observer import ObserverBase


@dataclass
class Record:
    path: str = "NONE"


class Observer(ObserverBase):
    record_type = Record


def test_each_step_starts_a_fresh_record_and_stop_forgets_the_steps_requests():
    observer = Observer(vocab_size=10, max_model_len=20)
    first = observer.start(eager_size=8, fill="zeros")
    first.path = "FULL"
    assert (observer.eager_size, observer.fill) == (8, "zeros")
    observer.stop()
    assert (observer.eager_size, observer.fill) == (None, None)
    assert observer.start() is not first and observer.record.path == "NONE"


def test_zeros_fill_only_the_padded_rows():
    observer = Observer(vocab_size=10, max_model_len=20)
    ids, positions = torch.full((6,), 7, dtype=torch.int32), torch.full((6,), 5)
    observer.start(fill="zeros")
    observer.fill_padded(ids[4:], positions[4:])
    assert ids.tolist() == [7, 7, 7, 7, 0, 0] and positions.tolist() == [5, 5, 5, 5, 0, 0]


def test_random_rows_are_valid_ids_and_positions_and_differ_from_call_to_call():
    observer = Observer(vocab_size=10, max_model_len=20)
    observer.start(fill="random")
    draws = []
    for _ in range(2):
        ids, positions = torch.full((40,), -1, dtype=torch.int32), torch.full((40,), -1)
        observer.fill_padded(ids[8:], positions[8:])
        assert ids[:8].eq(-1).all() and positions[:8].eq(-1).all()
        assert ids[8:].ge(0).all() and ids[8:].lt(10).all() and positions[8:].ge(0).all() and positions[8:].lt(20).all()
        assert ids.dtype == torch.int32
        draws.append(ids[8:].tolist())
    assert draws[0] != draws[1]
    again = Observer(vocab_size=10, max_model_len=20)  # the same call numbers draw the same rows
    ids, positions = torch.zeros(32, dtype=torch.int32), torch.zeros(32, dtype=torch.long)
    again.fill_padded(ids, positions)
    assert ids.tolist() == draws[0]
