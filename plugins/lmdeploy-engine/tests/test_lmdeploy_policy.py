"""The lmdeploy-engine runtime's declared policy (policy.py): its answers on any machine, the
policy suites against it, and, where LMDeploy 0.18.0 imports (the GPU machine after
scripts/lmdeploy/install.sh, or here after `python scripts/lmdeploy/fetch.py --cpu-site`), against
LMDeploy's own functions for every max_batch_size up to 1100 and many user-given size lists."""
from pathlib import Path

import pytest

from harness.protocol import PolicyConfig, ResolveRequest
from harness.vocabulary import CONFIG_MODES, FAP, FDO, SUPPORT_LEVELS

from cudagraph_lmdeploy_engine.policy import LmdeployPolicy, capture_batch_sizes, resolve, user_batch_sizes

ROOT = Path(__file__).resolve().parents[3]
POLICY = LmdeployPolicy()
USER_SIZES = [(8, 4, 4, 1, 9000), (3, 7, 30), (1,), (16,), (5, 2), (300, 2, 256, 7)]


@pytest.mark.parametrize("max_batches,expected", [
    (1, [1]), (8, [1, 2, 4, 8]), (100, [1, 2, 4, 8, 16, 32, 64, 100]),
    (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]), (257, [1, 2, 4, 8, 16, 32, 64, 128, 256, 257]),
    (1000, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1000]),
])
def test_capture_batch_sizes_are_powers_of_two_then_steps_of_256_then_the_max(max_batches, expected):
    assert capture_batch_sizes(max_batches) == expected


def test_user_sizes_keep_those_up_to_the_max_and_add_it():
    assert user_batch_sizes((8, 4, 4, 1, 9000), 8) == [1, 4, 8]
    assert user_batch_sizes((3, 7, 30), 16) == [3, 7, 16]
    for bad, message in (((), "empty"), ((0, 2), "positive"), ((30,), "none is <= max_batch_size")):
        with pytest.raises(ValueError, match=message):
            user_batch_sizes(bad, 16)


def test_only_decode_batches_get_graphs_keyed_by_their_padded_batch():
    config = PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64, mode=FDO)
    assert POLICY.dispatch(config, 3, 3, True).descriptor.num_padded_tokens == 4
    assert POLICY.dispatch(config, 3, 3, True).descriptor.num_padded_rows == 4
    assert POLICY.dispatch(config, 3, 2, False).runtime_mode == "NONE"
    assert POLICY.dispatch(config, 3, 2, False).descriptor.num_padded_tokens == 3
    assert POLICY.dispatch(config, 9, 9, True).runtime_mode == "NONE"  # above max_batch_size: eager (LMDeploy asserts)
    assert POLICY.dispatch(PolicyConfig(max_num_seqs=8, mode="NONE"), 3, 3, True).runtime_mode == "NONE"


@pytest.mark.parametrize("mode", CONFIG_MODES)
@pytest.mark.parametrize("support", SUPPORT_LEVELS)
def test_every_mode_lands_on_eager_mode_or_decode_graphs_and_every_downgrade_warns(mode, support):
    resolved, warnings = resolve(mode, support)
    if support == "NEVER":
        assert resolved == "NONE"
    else:
        assert resolved == {"NONE": "NONE", "PIECEWISE": "NONE", "FULL": FDO, FDO: FDO, FAP: FDO}[mode]
    assert bool(warnings) == (resolved != mode)
    assert POLICY.resolve_mode(ResolveRequest(mode, support)).resolved == resolved


@pytest.mark.parametrize("config,mentions", [
    (PolicyConfig(num_speculative_tokens=1), "one token a request"),
    (PolicyConfig(max_loras=2), "LoRA"),
    (PolicyConfig(max_capture_size=64), "no such option"),
    (PolicyConfig(max_num_seqs=64, max_num_batched_tokens=32), "max_num_batched_tokens=32"),
])
def test_what_lmdeploy_or_this_runtime_does_not_have_is_rejected_with_its_reason(config, mentions):
    with pytest.raises(ValueError, match=mentions):
        POLICY.capture_sizes(config)


def test_the_policy_suites_pass_against_the_policy_runtime(pytester):
    """Every policy suite that applies to a policy of its own, with no failure."""
    suites = [str(ROOT / "suites" / name) for name in ("test_capture_sizes.py", "test_padding.py", "test_dispatch.py",
                                                         "test_mode_resolution.py")]
    # The suites themselves, from the project's root (as tests/catching.py runs them): copies would
    # clash with the suite modules a worker of the whole run has already imported.
    result = pytester.runpytest(*suites, "--runtime", "cudagraph_lmdeploy_engine.runtime:LmdeployPolicyRuntime",
                                "--rootdir", str(ROOT), "-p", "no:xdist", "-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 15 and not outcomes.get("failed") and not outcomes.get("errors"), outcomes


# -- against LMDeploy's own functions -----------------------------------------------------------
@pytest.fixture(scope="module")
def lmdeploy_policy_code(lmdeploy_code):
    from lmdeploy.pytorch.config import normalize_cudagraph_capture_batch_sizes

    return normalize_cudagraph_capture_batch_sizes, lmdeploy_code._get_capture_batch_size_impl


def test_sizes_are_lmdeploys_for_every_max_batch_size(lmdeploy_policy_code):
    _, lmdeploy_sizes = lmdeploy_policy_code
    for max_batches in range(1, 1101):
        assert capture_batch_sizes(max_batches) == lmdeploy_sizes(max_batches), max_batches


@pytest.mark.parametrize("sizes", USER_SIZES + [(), (0, 3), (40, 50)], ids=str)
@pytest.mark.parametrize("max_batches", [1, 8, 16, 256])
def test_user_sizes_are_lmdeploys(lmdeploy_policy_code, sizes, max_batches):
    normalize, _ = lmdeploy_policy_code
    try:
        expected = normalize(list(sizes), max_batches)
    except AssertionError:
        with pytest.raises(ValueError):
            user_batch_sizes(sizes, max_batches)
        return
    assert user_batch_sizes(sizes, max_batches) == expected


def test_the_engine_config_is_lmdeploys_mode_switch(lmdeploy_policy_code):
    from harness.protocol import EngineConfig

    from cudagraph_lmdeploy_engine import settings

    config = EngineConfig(policy=PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64, capture_sizes=(2, 4)),
                          kv_tokens=1024, device="cuda", graph_backend="cuda")
    eager, graphs = settings.engine_config(config, "NONE"), settings.engine_config(config, FDO)
    assert (eager.eager_mode, graphs.eager_mode) == (True, False)
    assert graphs.piecewise_cudagraph_max_tokens is None  # no piecewise prefill graphs asked for
    assert (graphs.max_batch_size, graphs.max_prefill_token_num, graphs.dtype) == (8, 64, "float16")
    assert graphs.cudagraph_capture_batch_sizes == [2, 4] and graphs.num_gpu_blocks == 1 + 16 + 8
