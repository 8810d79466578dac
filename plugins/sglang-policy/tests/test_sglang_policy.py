"""The sglang-policy runtime against the installed SGLang. Skipped where SGLang cannot be imported.

Run with `python -m pytest plugins/sglang-policy/tests` after `bash scripts/setup_sglang_policy.sh`.
Expected numbers are written out from SGLang's source (the file and function each test names).
"""
from importlib import metadata

import pytest

pytest.importorskip("sglang.srt.arg_groups.memory_hook", reason="SGLang is not installed (bash scripts/setup_sglang_policy.sh)")

from harness.session.known_failures import load  # noqa: E402
from harness.protocol import Descriptor, Dispatch, PolicyConfig  # noqa: E402

from cudagraph_sglang_policy.runtime import KNOWN_FAILURES, SglangPolicyRuntime  # noqa: E402


@pytest.fixture(scope="module")
def sglang_runtime():
    return SglangPolicyRuntime()


def test_registered_through_the_entry_point():
    entry = {ep.name: ep for ep in metadata.entry_points(group="cudagraph_conformance.runtimes")}["sglang-policy"]
    assert entry.load() is SglangPolicyRuntime


def test_decode_grid_comes_from_sglangs_server_argument_hooks(sglang_runtime):
    # memory_hook.handle_gpu_memory_settings: an H200 (< 160 GiB, tp < 4) gets max_bs 256, a B200 512;
    # cuda_graph_hook.generate_decode_cuda_graph_batch_sizes: 1, 2, 4, 8, 12, then 16..256 step 8, ...
    sizes = sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=256))
    assert sizes[:7] == [1, 2, 4, 8, 12, 16, 24] and (len(sizes), sizes[-1]) == (36, 256)
    assert sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=1024, platform_max=1024))[-1] == 512
    # max_bs is clamped to max_running_requests when it is the default.
    assert sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=64))[-1] == 64
    # Speculative decoding has its own, denser grid, and each decode graph replays bs x q tokens.
    assert sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=64, num_speculative_tokens=1))[:5] == [2, 4, 6, 8, 10]


def test_decode_pads_by_batch_size_and_extend_by_token_bucket(sglang_runtime):
    config = PolicyConfig(max_num_seqs=64)
    assert sglang_runtime.dispatch(config, 9, 9, True) == Dispatch("FULL", Descriptor(12, 12, True))
    assert sglang_runtime.dispatch(config, 9, 3, False) == Dispatch("PIECEWISE", Descriptor(12, None, False))
    # A decode batch above max_bs runs eager; an extend batch up to chunked_prefill_size still replays.
    assert sglang_runtime.dispatch(config, 65, 65, True).runtime_mode == "NONE"
    assert sglang_runtime.dispatch(config, 3000, 10, False) == Dispatch("PIECEWISE", Descriptor(3072, None, False))


def test_prefill_replays_pad_at_most_twice(sglang_runtime):
    # prefill_cuda_graph_runner.py: _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR = 2; the smallest bucket is 4.
    config = PolicyConfig(max_num_seqs=64)
    assert sglang_runtime.dispatch(config, 1, 1, False) == Dispatch("NONE", Descriptor(1))
    assert sglang_runtime.dispatch(config, 2, 1, False) == Dispatch("PIECEWISE", Descriptor(4, None, False))


def test_modes_map_to_sglangs_per_phase_backends(sglang_runtime):
    assert sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, mode="NONE")) == []
    decode_only = PolicyConfig(max_num_seqs=8, mode="FULL_DECODE_ONLY")
    assert sglang_runtime.dispatch(decode_only, 5, 2, False).runtime_mode == "NONE"
    breakable = PolicyConfig(max_num_seqs=8, mode="PIECEWISE")
    assert sglang_runtime.dispatch(breakable, 5, 5, True) == Dispatch("PIECEWISE", Descriptor(8, 8, True))
    # Full prefill graphs bake in max(chunked_prefill_size // 512, 1) request slots (cuda_graph_setup.py).
    full = PolicyConfig(max_num_seqs=64, max_num_batched_tokens=2048, mode="FULL")
    assert sglang_runtime.dispatch(full, 21, 4, False) == Dispatch("FULL", Descriptor(24, 4, False))
    assert sglang_runtime.dispatch(full, 21, 5, False).runtime_mode == "NONE"


def test_the_device_stand_in_ends_with_each_question(sglang_runtime):
    import sglang.srt.utils as utils
    from sglang.srt.arg_groups import memory_hook

    before = (utils.is_cuda, memory_hook.get_device_memory_capacity)
    sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=7, platform_max=1024))
    assert (utils.is_cuda, memory_hook.get_device_memory_capacity) == before


def test_bad_configs_are_value_errors(sglang_runtime):
    with pytest.raises(ValueError, match="SGLang rejects the config"):
        sglang_runtime.capture_sizes(PolicyConfig(max_num_seqs=8, capture_sizes=()))


def test_known_failures_file_is_valid_and_empty():
    assert load(KNOWN_FAILURES) == []
