"""Launch overhead (SPEC 7, invariant 7): a graph mode submits far fewer launches than eager, and
a step runs what it says it ran. Counted by the harness (the CUDA profiler, or an op counter
around the emulator), never taken from the runtime's own report."""
import pytest

from harness import launches
from harness.compare import expect
from harness.execution import decode_requests, describe_batch, prefill

INVARIANT = "launch overhead"
pytestmark = pytest.mark.requires("execution")


def measure(engines, graph_backend, mode, batch):
    engine = engines.get(mode=mode, capture=mode != "NONE")
    seqs = prefill(engine, [engines.new_id() for _ in range(batch)], [3 + i for i in range(batch)])
    requests = decode_requests(seqs)
    engine.step(requests)  # warm: first replays check addresses, lazy work happens once
    box = {}
    counted = launches.count(lambda: box.setdefault("out", engine.step(requests)), graph_backend_device(graph_backend))
    for s in seqs:
        engine.release(s.request_id)
    return box["out"], counted, describe_batch(requests)


def graph_backend_device(graph_backend):
    return "cuda" if graph_backend == "cuda" else "cpu"


@pytest.mark.parametrize("batch", [1, 3])
def test_each_mode_submits_what_it_claims(runtime, engines, graph_backend, record_property, batch):
    resolved = {m: engines.get(mode=m, capture=m != "NONE").resolution.resolved for m in ("PIECEWISE", "FULL_AND_PIECEWISE")}
    if resolved != {"PIECEWISE": "PIECEWISE", "FULL_AND_PIECEWISE": "FULL_AND_PIECEWISE"}:
        pytest.skip(f"runtime {runtime.name!r} resolves the graph modes to {resolved}: no PIECEWISE and FULL to compare")
    eager, eager_n, case = measure(engines, graph_backend, "NONE", batch)
    piecewise, piecewise_n, _ = measure(engines, graph_backend, "PIECEWISE", batch)
    full, full_n, _ = measure(engines, graph_backend, "FULL_AND_PIECEWISE", batch)
    counts = {"NONE": eager_n.describe(), "PIECEWISE": piecewise_n.describe(), "FULL": full_n.describe()}
    record_property("launches", {"batch": batch, **{mode: {"kernels": n.kernels, "graphs": n.graphs, "copies": n.copies}
                                                    for mode, n in (("NONE", eager_n), ("PIECEWISE", piecewise_n),
                                                                    ("FULL", full_n))}})
    expect((eager.runtime_mode, piecewise.runtime_mode, full.runtime_mode) == ("NONE", "PIECEWISE", "FULL"),
           invariant=INVARIANT, runtime=runtime, case=case, what="a uniform decode batch ran these modes",
           modes=(eager.runtime_mode, piecewise.runtime_mode, full.runtime_mode))
    expect(full_n.kernels * 4 <= eager_n.kernels, invariant=INVARIANT, runtime=runtime, case=case,
           what="a step reported as FULL submitted more than a quarter of an eager step's launches: "
                "it did not replay one graph", counts=counts)
    expect(full_n.kernels < piecewise_n.kernels < eager_n.kernels, invariant=INVARIANT, runtime=runtime,
           case=case, what="launches must order FULL < PIECEWISE (attention eager) < eager", counts=counts)
    if full_n.graphs is not None:
        expect(full_n.graphs == 1 and eager_n.graphs == 0 and piecewise_n.graphs >= 2, invariant=INVARIANT,
               runtime=runtime, case=case,
               what="graph launches: FULL one per step, PIECEWISE one per piece, eager none", counts=counts)
