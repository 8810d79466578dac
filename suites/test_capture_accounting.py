"""Capture accounting (SPEC 6 and 7, invariant 8): the graphs captured are the keys the policy
asks for (sizes x pieces, plus decode sizes), PIECEWISE before FULL, largest first, and the time
and memory are reported; nothing can be captured after the capture phase."""
import pytest

from harness import oracle
from harness.compare import expect, expect_equal

INVARIANT = "capture accounting"
pytestmark = pytest.mark.requires("execution")
MODES = ["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


@pytest.mark.parametrize("spec", [0, 1], ids=["q1", "q2"])
@pytest.mark.parametrize("mode", MODES)
def test_graphs_match_the_policy_keys(runtime, engines, record_property, mode, spec):
    engine = engines.get(mode=mode, spec=spec, fresh=True, capture=False)
    report = engine.capture()
    record_property("capture", {"mode": f"{mode} q={1 + spec}", "preset": engines.preset, "graphs": dict(report.graphs),
                                "seconds": report.seconds, "memory_bytes": report.memory_bytes})
    policy = engines.config(mode=engine.resolution.resolved, spec=spec).policy
    keys = oracle.graph_keys(policy)
    case = f"mode {mode} (resolved {engine.resolution.resolved}), q={1 + spec}"
    expect_equal(report.graphs.get("FULL", 0), len(keys["FULL"]), invariant=INVARIANT, runtime=runtime,
                 what="FULL graphs captured (one per FULL key)", case=case)
    pieces, sizes = report.graphs.get("PIECEWISE", 0), len(keys["PIECEWISE"])
    expect((pieces == 0) == (sizes == 0) and (sizes == 0 or pieces % sizes == 0), invariant=INVARIANT,
           runtime=runtime, case=case, what="PIECEWISE graphs = sizes x pieces per size",
           piecewise_graphs=pieces, piecewise_sizes=sizes)
    order = list(report.order)
    expected_keys = sorted([("PIECEWISE", k.num_tokens) for k in keys["PIECEWISE"]] +
                           [("FULL", k.num_tokens) for k in keys["FULL"]])
    expect_equal(sorted(order), expected_keys, invariant=INVARIANT, runtime=runtime, case=case,
                 what="captured (mode, size) keys")
    modes = [m for m, _ in order]
    expect(modes == sorted(modes, key=["PIECEWISE", "FULL"].index), invariant=INVARIANT, runtime=runtime,
           case=case, what="PIECEWISE graphs are captured before FULL ones", order=order)
    for m in ("PIECEWISE", "FULL"):
        sizes_in_order = [n for mm, n in order if mm == m]
        expect(sizes_in_order == sorted(sizes_in_order, reverse=True), invariant=INVARIANT, runtime=runtime,
               case=case, what=f"{m} graphs are captured largest first (smaller ones reuse the pool)",
               order=sizes_in_order)
    expect(report.seconds > 0, invariant=INVARIANT, runtime=runtime, case=case, what="capture time is reported")


def test_graph_memory_is_reported_on_a_real_device(runtime, engines, graph_backend):
    report = engines.get(mode="FULL_AND_PIECEWISE").capture_report()
    if graph_backend == "cuda" and sum(report.graphs.values()) > 0:
        expect(report.memory_bytes is not None and report.memory_bytes > 0, invariant=INVARIANT, runtime=runtime,
               what="graph memory (free before minus after) is reported", memory=report.memory_bytes)
    else:
        expect(report.memory_bytes is None or report.memory_bytes >= 0, invariant=INVARIANT, runtime=runtime,
               what="without device graphs the memory figure is absent or non-negative", memory=report.memory_bytes)


def test_nothing_is_captured_after_the_capture_phase(runtime, engines):
    engine = engines.get(mode="FULL_AND_PIECEWISE", fresh=True)
    try:
        engine.capture()
    except Exception:  # noqa: BLE001 - the phase is over: a loud refusal is right
        return
    pytest.fail(f"[{INVARIANT}] runtime {runtime.name!r}: a second capture was accepted after the capture phase")
