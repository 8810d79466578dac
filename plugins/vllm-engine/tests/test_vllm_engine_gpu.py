"""The vllm-engine runtime on real vLLM: skipped without vLLM and a GPU. On the GPU machine,
after `.vllm_gpu/install.sh` (plugins/vllm-engine/README.md):

    PYTHONPATH=/tmp/site:.:plugins/vllm-engine python -m pytest plugins/vllm-engine/tests -p no:xdist

One engine is built (about 30 s on a fresh machine, a few seconds with warm caches). The suites
are the real test of the engine; these check the runtime's own promises: its policy is vLLM's,
what it reports is what vLLM ran, and the harness's graph counter sees vLLM's graphs.
"""
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="vLLM is not installed (see plugins/vllm-engine/README.md)")

from harness.expectations import oracle  # noqa: E402
from harness.expectations.anchor import Anchor  # noqa: E402
from harness.scenarios.batches import advance, decode_requests, prefill  # noqa: E402
from harness.graphs.log import watch_cuda_graphs  # noqa: E402
from harness.smoke import capture_counted, step_counted  # noqa: E402
from harness.protocol import PolicyConfig  # noqa: E402

from cudagraph_vllm_engine.runtime import VllmEngineRuntime  # noqa: E402
from cudagraph_vllm_engine.smoke import engine_config  # noqa: E402


@pytest.fixture(scope="module")
def runtime():
    watch_cuda_graphs()
    return VllmEngineRuntime()


@pytest.fixture(scope="module")
def engine(runtime):
    engine = runtime.build(engine_config(runtime, "FULL_AND_PIECEWISE"))  # the suites' preset and checkpoint
    engine.report, engine.captures_seen = capture_counted(engine)  # the harness's counter beside the engine's
    yield engine
    engine.close()


@pytest.mark.parametrize("seqs", [1, 8, 64, 100, 256, 264])
def test_policy_is_the_oracles_for_vllm_025(runtime, seqs):
    """The sizes and keys vLLM 0.25's code gives on the GPU are the oracle's for 0.25 (docs/spec.md section 11)."""
    for mode in ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE"):
        config = PolicyConfig(max_num_seqs=seqs, mode=mode, rules="vllm-0.25/v2")
        assert runtime.capture_sizes(config) == oracle.capture_sizes(config)
        for tokens in range(1, max(runtime.capture_sizes(config)) + 2):
            for reqs, uniform in ((min(tokens, seqs), tokens <= seqs), (1, False)):
                assert runtime.dispatch(config, tokens, reqs, uniform) == oracle.dispatch(config, tokens, reqs, uniform)


def test_capture_is_counted_by_vllm_and_by_the_harness(engine):
    report = engine.report
    assert sum(report.graphs.values()) == engine.captures_seen > 0
    assert report.memory_bytes > 0 and report.seconds > 0


def test_steps_report_what_vllm_ran_and_match_transformers(runtime, engine):
    anchor = Anchor(engine.config.checkpoint, device="cuda")
    seqs = prefill(engine, [1, 2, 3], [5, 11, 3])
    policy = replace(engine.config.policy, mode=engine.resolution.resolved)
    for n in (1, 2, 3):
        requests = decode_requests(seqs[:n])
        history = {s.request_id: list(s.tokens) for s in seqs}
        out, launches = step_counted(engine, requests)
        expected = runtime.dispatch(policy, n, n, True)
        assert (out.runtime_mode, out.num_padded_tokens) == (expected.runtime_mode, expected.descriptor.num_padded_tokens)
        if out.runtime_mode == "PIECEWISE":
            assert launches >= 2
        else:
            assert launches == {"FULL": 1, "NONE": 0}[out.runtime_mode]
        tolerance = anchor.tolerance(runtime.capabilities.precision, engine.config.preset).value
        assert float((out.logits.float().cpu() - anchor.step(requests, history)).abs().max()) <= tolerance
        eager = engine.eager_step(requests, out.num_padded_tokens)
        assert eager.runtime_mode == "NONE" and eager.num_padded_tokens == out.num_padded_tokens
        advance(seqs, requests)
    for s in seqs:
        engine.release(s.request_id)


def test_kv_slots_are_the_ones_vllm_wrote(engine):
    seqs = prefill(engine, [11], [7])
    snapshot = engine.kv_snapshot()
    written = [engine.slot_of(11, p) for p in range(7)]
    assert bool(snapshot[written].abs().sum(dim=1).gt(0).all())
    inputs = engine.last_step_inputs()
    assert inputs.slot_mapping[:7].tolist() == written
    engine.release(seqs[0].request_id)


def test_a_closed_engine_gives_back_its_memory_beside_a_live_one(runtime, engine):
    """close() of an engine built beside a live one (the suites' fresh engines beside their shared ones)
    leaves no more allocated than the runtime declares per build (release.py), beside what the harness
    allows any test: allocator rounding and one cuBLAS workspace (vLLM captures on a stream from torch's
    pool, and cuBLAS keeps a workspace for each stream a matmul ran on)."""
    import gc

    from harness.reliability.isolation import CUBLAS_WORKSPACE, MEMORY_TOLERANCE

    for _ in range(2):
        gc.collect()
        before = torch.cuda.memory_allocated()
        fresh = runtime.build(engine_config(runtime, "FULL_AND_PIECEWISE"))
        fresh.capture()
        prefill(fresh, [1], [5])
        fresh.close()
        del fresh
        gc.collect()
        torch.cuda.empty_cache()
        kept = torch.cuda.memory_allocated() - before
        allowed = runtime.capabilities.memory_kept_per_build + MEMORY_TOLERANCE + CUBLAS_WORKSPACE
        assert kept <= allowed, f"{kept / 2**20:.1f} MiB kept"
    engine.step(decode_requests(prefill(engine, [21], [3])))  # the live engine still runs
    engine.release(21)
