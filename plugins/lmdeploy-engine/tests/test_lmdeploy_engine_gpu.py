"""The lmdeploy-engine runtime on real LMDeploy: skipped without LMDeploy 0.18.0 and a GPU. On the
GPU machine, after `bash scripts/lmdeploy/install.sh` (plugins/lmdeploy-engine/README.md):

    PYTHONPATH=/tmp/site_l:.:plugins/lmdeploy-engine python -m pytest plugins/lmdeploy-engine/tests -p no:xdist

Two engines are built (a graph engine and an eager one). The suites are the real test of the
engine; these check the runtime's own promises: what it reports is what LMDeploy ran, the
harness's graph counter sees LMDeploy's graphs, its eager reference is the graph's shape without
a graph, and the KV slots it names are the ones LMDeploy wrote.
"""
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("lmdeploy", reason="LMDeploy is not installed (bash scripts/lmdeploy/install.sh)")

from harness.expectations.anchor import TOLERANCE, Anchor  # noqa: E402
from harness.graphs.log import watch_cuda_graphs  # noqa: E402
from harness.smoke import capture_counted, step_counted  # noqa: E402
from harness.scenarios.batches import advance, decode_requests, prefill  # noqa: E402

from cudagraph_lmdeploy_engine.runtime import LmdeployEngineRuntime  # noqa: E402
from cudagraph_lmdeploy_engine.smoke import engine_config  # noqa: E402

PRESET = "small"


@pytest.fixture(scope="module")
def runtime():
    watch_cuda_graphs()  # the harness's graph counter, on before LMDeploy's first capture
    return LmdeployEngineRuntime()


@pytest.fixture(scope="module")
def engine(runtime):
    config = engine_config(runtime, "FULL_DECODE_ONLY", PRESET)  # the suites' config for the smoke preset
    engine = runtime.build(config)
    engine.report, engine.captures_seen = capture_counted(engine)  # the harness's counter beside the engine's
    return engine


@pytest.fixture(scope="module")
def eager_engine(runtime):
    return runtime.build(engine_config(runtime, "NONE", PRESET))


def test_one_graph_per_capture_size_counted_by_lmdeploy_and_by_the_harness(runtime, engine):
    sizes = runtime.capture_sizes(engine.config.policy)
    assert engine.report.graphs == {"FULL": len(sizes)} == {"FULL": engine.captures_seen}
    assert [n for _, n in engine.report.order] == sorted(sizes, reverse=True)  # LMDeploy's warm-up: largest first
    assert engine.report.memory_bytes > 0 and engine.report.seconds > 0


def test_steps_report_what_lmdeploy_ran_and_match_transformers(runtime, engine, eager_engine):
    anchor = Anchor(engine.config.checkpoint, device="cuda")
    seqs = prefill(engine, [1, 2, 3], [5, 11, 3])
    prefill(eager_engine, [1, 2, 3], [5, 11, 3])
    policy = replace(engine.config.policy, mode=engine.resolution.resolved)
    for n in (1, 2, 3):
        history = {s.request_id: list(s.tokens) for s in seqs}  # before this step's tokens
        expected = runtime.dispatch(policy, n, n, True)  # the runtime's own policy for n decode requests
        requests = decode_requests(seqs[:n])
        out, launches = step_counted(engine, requests)
        assert (out.runtime_mode, out.num_padded_tokens, launches) == ("FULL", expected.descriptor.num_padded_tokens, 1)
        assert float((out.logits.float().cpu() - anchor.step(requests, history)).abs().max()) <= TOLERANCE["float16"]
        same_engine = engine.eager_step(requests, out.num_padded_tokens)
        other_engine = eager_engine.eager_step(requests, out.num_padded_tokens)
        assert (same_engine.runtime_mode, same_engine.num_padded_tokens) == ("NONE", out.num_padded_tokens)
        assert torch.equal(out.logits, same_engine.logits) and torch.equal(out.logits, other_engine.logits)
        advance(seqs, requests)
    for s in seqs:
        engine.release(s.request_id)
        eager_engine.release(s.request_id)


def test_kv_slots_are_the_ones_lmdeploy_wrote_and_padded_rows_write_its_sink(engine):
    seqs = prefill(engine, [11, 12, 13], [7, 3, 9])
    snapshot = engine.kv_snapshot()
    written = [engine.slot_of(11, p) for p in range(7)]
    assert bool(snapshot[written].abs().sum(dim=1).gt(0).all())
    out = engine.step(decode_requests(seqs))  # 3 requests, padded to 4
    inputs = engine.last_step_inputs()
    assert out.num_padded_tokens == 4 and inputs.slot_mapping[3].item() == inputs.padding_slot
    assert inputs.slot_mapping[:3].tolist() == [engine.slot_of(s.request_id, s.context_len) for s in seqs]
    for s in seqs:
        engine.release(s.request_id)
