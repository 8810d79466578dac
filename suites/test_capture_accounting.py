"""Capture accounting (docs/spec.md sections 6 and 7, invariant 8).

- The graphs captured are the keys the policy implies for the resolved mode: under `vllm_rules`
  the oracle's keys (sizes x pieces, plus uniform decode sizes); for any runtime with `dispatch`
  and `capture_sizes`, every distinct key its own dispatch() returns. PIECEWISE graphs are at
  least two pieces per size, the same for every size, and no more than the attention layers + 1.
- The graphs the capture report counts are the graphs the harness saw captured.
- Graph memory is reported and agrees with what the harness measured (free memory on the GPU,
  what emulated graphs hold on the CPU); time is reported.
- Under `vllm_rules`: PIECEWISE before FULL, largest first (smaller graphs reuse the pool).
- Nothing is captured after the capture phase: a second capture() raises a RuntimeError and
  captures nothing, and steps of every size capture nothing. A runtime that declares
  `lazy_capture` records its graphs while serving instead (torch.compile's graph trees do): each
  batch shape once, so the same sizes served again, at longer contexts, record nothing.
"""
import pytest

from harness.expectations import expected
from harness.scenarios.batches import advance, decode_requests, mixed_requests, prefill
from harness.graphs.log import LOG
from harness.reports.records import Capture
from harness.reliability.safe import describe_exception
from harness.vocabulary import GRAPH_MODES, OBSERVED, RUNTIME_WORD, SPEC

INVARIANT = "capture accounting"
pytestmark = pytest.mark.requires("execution")
MODES = GRAPH_MODES


def captured(check, engines, mode, spec):
    engine = engines.for_mode(mode, spec=spec, fresh=True, capture=False)
    report = engine.capture()
    case = f"mode {mode} (resolved {engine.resolution.resolved}), q={1 + spec}"
    return engine, report, case


@pytest.mark.parametrize("spec", [0, 1], ids=["q1", "q2"])
@pytest.mark.parametrize("mode", MODES)
def test_graphs_match_the_policy_keys(check, engines, record, mode, spec):
    if spec and not engines.runtime.capabilities.speculative_steps:
        check.skip("it does not declare speculative_steps")
    engine, report, case = captured(check, engines, mode, spec)
    record(Capture(mode=f"{mode} q={1 + spec}", preset=engines.preset, graphs=dict(report.graphs),
                   seconds=report.seconds, memory_bytes=report.memory_bytes, graph_backend=engines.graph_backend,
                   observed_captures=engine.seen_at_capture.captures))
    _graphs_match_the_keys(check, engines, engine, report, case)


def test_a_larger_engines_graphs_match_the_policy_keys(check, engines):
    """The same for the suites' larger engine (its grid past its power-of-two prefix, its maximum off
    it), as it was captured for the tests that share it."""
    engine = engines.larger()
    case = f"the larger engine {engines.larger_policy()}, mode {engine.resolution.resolved}"
    _graphs_match_the_keys(check, engines, engine, engine.captured, case)


def _graphs_match_the_keys(check, engines, engine, report, case):
    check.equal(sum(report.graphs.values()), engine.seen_at_capture.captures, source=OBSERVED, case=case,
                what="graphs the capture report counts vs graphs the harness saw captured")
    pieces = engine.pieces_per_size()
    if report.graphs.get("PIECEWISE", 0):
        check.that(pieces is not None and 2 <= pieces <= engines.num_layers + 1, source=OBSERVED, case=case,
                   what=f"PIECEWISE graphs are 2..{engines.num_layers + 1} pieces (split at the attention of "
                        f"{engines.num_layers} layers) for every size alike", graphs=report.graphs, order=report.order)
    if engines.runtime.capabilities.lazy_capture:
        check.skip("it declares lazy_capture: its graphs are recorded while serving, not counted at capture "
                   "(test_nothing_is_captured_after_the_capture_phase holds it to one recording per shape)")
    keys = expected.graph_keys(engines.runtime, engine.policy)
    if keys is None:
        check.skip("without dispatch() and capture_sizes() the harness cannot tell which keys its policy implies")
    want = keys.value
    check.equal(report.graphs.get("FULL", 0), len(want["FULL"]), source=keys.source, case=case,
                what="FULL graphs captured (one per distinct FULL key)")
    check.equal(sorted(n for m, n in report.order if m == "PIECEWISE"),
                sorted(k.num_padded_tokens for k in want["PIECEWISE"]), source=keys.source, case=case,
                what="sizes with PIECEWISE graphs")
    check.equal(sorted(n for m, n in report.order if m == "FULL"), sorted(k.num_padded_tokens for k in want["FULL"]),
                source=keys.source, case=case, what="sizes of the FULL graphs")
    check.that(report.seconds > 0, what="capture time is reported", source=RUNTIME_WORD, case=case)


@pytest.mark.requires("vllm_rules")
@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "FULL"])
def test_capture_order_is_piecewise_first_and_largest_first(check, engines, mode):
    engine, report, case = captured(check, engines, mode, 0)
    order = list(report.order)
    modes = [m for m, _ in order]
    check.that(modes == sorted(modes, key=["PIECEWISE", "FULL"].index), source=SPEC, case=case,
               what="PIECEWISE graphs are captured before FULL ones", order=order)
    for m in ("PIECEWISE", "FULL"):
        sizes = [n for mm, n in order if mm == m]
        check.that(sizes == sorted(sizes, reverse=True), source=SPEC, case=case, order=sizes,
                   what=f"{m} graphs are captured largest first (smaller ones reuse the pool)")


@pytest.mark.alone_on_device
def test_graph_memory_is_reported_and_agrees_with_what_the_harness_measured(check, engines):
    engine, report, case = captured(check, engines, "FULL_AND_PIECEWISE", 0)
    if not sum(report.graphs.values()):
        check.skip("it captured no graph")
    seen = engine.memory_seen
    if engines.graph_backend == "cuda":
        # One 2 MiB segment either way: free device memory moves in such granules, or not at all
        # when the driver hands back a block it kept.
        where, slack = "the larger of free device memory's drop and torch's reserved bytes' growth", 2**21
    else:
        where, slack = "bytes held by the emulated graphs it captured", 0
    check.that(report.memory_bytes is not None and report.memory_bytes >= 0, source=OBSERVED, case=case,
               what="graph memory must be reported, in bytes, and not be negative", reported=report.memory_bytes,
               measured=seen)
    if seen and report.memory_bytes is not None:
        check.that(seen / 4 - slack <= report.memory_bytes <= 4 * seen + slack + 2**20, source=OBSERVED, case=case,
                   what=f"reported graph memory vs {where} (within a factor of 4)", reported=report.memory_bytes,
                   measured=seen)


def test_nothing_is_captured_after_the_capture_phase(check, engines):
    engine, report, case = captured(check, engines, "FULL_AND_PIECEWISE", 0)
    before = LOG.snapshot()
    try:
        engine.engine.capture()
    except RuntimeError:
        pass
    except Exception as exc:  # a TypeError or AttributeError is a bug, not the refusal the protocol asks for
        check.fail("a second capture() must be refused with a RuntimeError", case=case, raised=describe_exception(exc))
    else:
        check.fail("a second capture() was accepted after the capture phase", case=case)
    check.equal(LOG.since(before).captures, 0, source=OBSERVED, case=case,
                what="graphs captured by the refused second capture()")
    sizes = engines.runtime.capture_sizes(engine.policy) if engines.runtime.capabilities.capture_sizes else []
    seqs = prefill(engine, [engines.new_id() for _ in range(2)], [3, 4])
    if not engines.runtime.capabilities.lazy_capture:
        _serve_every_size(engines, engine, seqs, sizes)
        check.equal(engine.captures_in_service, 0, source=OBSERVED, case=case,
                    what="graphs captured while serving, after the capture phase closed")
        return
    # The same batch shapes three times, further into each context each time. A lazy runtime may
    # warm a shape up once before recording it (CUDA graph trees do): the third pass records nothing.
    for _ in range(3):
        recorded = engine.captures_in_service
        _serve_every_size(engines, engine, seqs, sizes)
    check.equal(engine.captures_in_service - recorded, 0, source=OBSERVED, case=case,
                what=f"graphs recorded in a third pass over the same batch shapes, after {recorded} in the first two "
                     "(it declares lazy_capture: each shape is recorded once)")


def _serve_every_size(engines, engine, seqs, sizes):
    """A decode step of the two running requests, then a batch of every size up to one past the
    largest: the two and a new one."""
    requests = decode_requests(seqs)
    engine.step(requests)
    advance(seqs, requests)
    for tokens in sorted({*sizes, max(sizes, default=8) + 1}):
        if 2 < tokens <= engines.defaults["max_num_batched_tokens"]:
            ids = [engines.new_id()]
            engine.step(mixed_requests(seqs, ids, [tokens - 2]))
            engine.release(ids[0])
