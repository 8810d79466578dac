"""Batch invariance, measured (docs/spec.md section 7, last paragraph): a graph step at the padded
size against an eager step at the unpadded size. This is only bit-equal with batch-invariant
kernels, so the largest difference per bucket goes into the report and equality is required only
where the runtime declares `batch_invariant`."""
import math

import pytest

from harness.scenarios.batches import decode_requests, prefill
from harness.reports.records import BatchInvariance

INVARIANT = "batch invariance"
pytestmark = pytest.mark.requires("execution")
BATCHES = range(1, 9)


def measure(engines, engine):
    seqs = prefill(engine, [engines.new_id() for _ in BATCHES], [3, 5, 2, 9, 4, 7, 1, 6])
    rows = []
    for n in BATCHES:
        requests = decode_requests(seqs[:n])
        graph = engine.step(requests)
        eager = engine.eager_step(requests, graph.num_real_tokens)
        difference = float((graph.logits.double() - eager.logits.double()).abs().max())
        rows.append(BatchInvariance(batch=n, padded=graph.num_padded_tokens, mode=graph.runtime_mode,
                                    difference=difference))
    return rows


def test_difference_from_unpadded_eager_is_measured(check, engines, record):
    for row in measure(engines, engines.for_mode("FULL_AND_PIECEWISE")):
        record(row)
        check.that(math.isfinite(row.difference), what="padded graph vs unpadded eager produced non-finite logits",
                   batch=row.batch, padded=row.padded)


@pytest.mark.requires("batch_invariant")
def test_declared_batch_invariance_holds(check, engines):
    for row in measure(engines, engines.for_mode("FULL_AND_PIECEWISE")):
        check.that(row.difference == 0.0, source="an eager step at the unpadded size",
                   what="the runtime declares batch-invariant kernels, but a padded graph differs from the "
                        "unpadded eager step", batch=row.batch, padded=row.padded, mode=row.mode,
                   largest_difference=row.difference)
