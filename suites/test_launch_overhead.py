"""Launch overhead (docs/spec.md sections 1 and 7, invariant 7), counted by the harness, never
taken from the runtime: on CUDA the profiler sees kernel and graph launches; on the CPU an op
counter sees what runs outside graphs and the emulator's log counts graph launches and the ops
inside them.

A FULL step is one graph launch and submits far fewer operations than an eager step; a PIECEWISE
step launches one graph per piece (as many as capture reported per size, and no more than the
attention layers + 1) and submits fewer operations than eager, more than FULL. (Every step of
every suite is also checked for the graph launches its reported mode implies: harness.runtime.observe.)
"""
import pytest

from harness.scenarios.batches import decode_requests, describe_batch, prefill
from harness.graphs import counting, device_for
from harness.reports.records import Launches
from harness.vocabulary import OBSERVED

INVARIANT = "launch overhead"
pytestmark = pytest.mark.requires("execution")


def measure(engines, engine, batch):
    seqs = prefill(engine, [engines.new_id() for _ in range(batch)], [3 + i for i in range(batch)])
    requests = decode_requests(seqs)
    engine.step(requests)  # warm: first replays check addresses, lazy work happens once
    box = {}
    # The same step counted twice, the larger count kept: a CUDA profile can miss launches (counting.most).
    counted = counting.most(lambda: box.__setitem__("out", engine.step(requests)), device_for(engines.graph_backend))
    for s in seqs:
        engine.release(s.request_id)
    return box["out"], counted, describe_batch(requests)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE"])
def test_a_graph_step_submits_far_less_than_eager(check, engines, record, mode, batch):
    engine = engines.for_mode(mode)
    out, graph, case = measure(engines, engine, batch)
    _, eager, _ = measure(engines, engines.get(mode="NONE", capture=False), batch)
    if out.runtime_mode == "NONE":
        check.skip(f"its policy runs a {batch}-request decode batch eager under {mode}")
    record(Launches(batch=batch, counts={"NONE": eager.as_dict(), out.runtime_mode: graph.as_dict()},
                    graph_backend=engines.graph_backend))
    counts = {"eager": eager.describe(), out.runtime_mode: graph.describe()}
    # Graph launches are checked on every step already (harness.runtime.observe); they are checked again here
    # because on CUDA these counts come from the profiler, a second witness beside the graph log.
    check.equal(eager.graphs, 0, what="an eager step launches no graph", source=OBSERVED, case=case)
    if out.runtime_mode == "FULL":
        check.equal(graph.graphs, 1, what="a FULL step is one graph launch", source=OBSERVED, case=case)
        check.that(graph.kernels * 4 <= eager.kernels, source=OBSERVED, case=case, counts=counts,
                   what="a FULL step submitted more than a quarter of an eager step's launches outside its graph")
    else:
        pieces = engine.pieces_per_size()
        check.that(graph.graphs == pieces and 2 <= graph.graphs <= engines.num_layers + 1, source=OBSERVED,
                   case=case, counts=counts, pieces_per_size_captured=pieces,
                   what=f"a PIECEWISE step launches one graph per piece (2..{engines.num_layers + 1})")
        check.that(graph.kernels < eager.kernels, source=OBSERVED, case=case, counts=counts,
                   what="a PIECEWISE step (attention eager) submits fewer launches than an eager step")


def test_full_submits_less_than_piecewise(check, engines):
    full_engine, piecewise_engine = engines.for_mode("FULL"), engines.for_mode("PIECEWISE")
    full, full_n, case = measure(engines, full_engine, 3)
    piecewise, piecewise_n, _ = measure(engines, piecewise_engine, 3)
    if (full.runtime_mode, piecewise.runtime_mode) != ("FULL", "PIECEWISE"):
        check.skip(f"a 3-request decode batch ran {full.runtime_mode} and {piecewise.runtime_mode}")
    check.that(full_n.kernels < piecewise_n.kernels, source=OBSERVED, case=case,
               what="FULL submits fewer launches outside graphs than PIECEWISE (attention eager)",
               counts={"FULL": full_n.describe(), "PIECEWISE": piecewise_n.describe()})
