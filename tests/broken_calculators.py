"""Calculators that each get one fact of vLLM's graph policy wrong, the way a plausible bug would.

tests/test_peer_tests.py runs vLLM's own unit tests (tests/peer_tests/) against each and names the
vLLM tests that must catch it. Each replaces one answer of the calculator for vLLM 0.33; those named
for SGLang or LMDeploy replace one answer of the plugin's restatement and say which release's tests
catch them (`peer_release`).
"""
from __future__ import annotations

from reference_runtime import policy
from tests.peer_tests.calculators import Calculator, Calculator025, LmdeployCalculator, SglangCalculator


class FoldsPiecewiseCaptureIntoSplitting(Calculator):
    """One flag for two inputs: piecewise graphs exist exactly where attention is split."""

    def resolve(self, request):
        request = {k: v for k, v in request.items() if k != "piecewise_capture"}
        return super().resolve(request)


class DropsDecodeGraphsWithoutPieces(Calculator):
    """vLLM 0.25's resolution under 0.33: a mode that needs pieces becomes NONE where none exist."""

    release = "0.25"


class RefusesMoreRequestsThanMaxNumSeqs(Calculator):
    """Treats max_num_seqs as a precondition of dispatch instead of a batch that runs eager."""

    def dispatch(self, config, num_real_tokens, num_real_rows, uniform, allowed_modes):
        if num_real_rows is not None and num_real_rows > config.get("max_num_seqs", 256):
            raise ValueError(f"num_real_rows must be <= max_num_seqs, got {num_real_rows}")
        return super().dispatch(config, num_real_tokens, num_real_rows, uniform, allowed_modes)


class RefusesMaxZero(Calculator):
    """Rejects a max capture size of 0 even under mode NONE."""

    def capture_sizes(self, config):
        if config.get("max_capture_size") == 0:
            raise ValueError("max_capture_size must be >= 1")
        return super().capture_sizes(config)


class UniformByShapeOnly(Calculator):
    """Decides uniform decode from the batch's shape alone, as vLLM's V1 runner does, under V2."""

    def uniform(self, requests):
        return policy.uniform_token_count([tokens for tokens, _, _ in requests])


class LevelOneCapturesFull(Calculator):
    """-O1 with vLLM's default mode (FULL_AND_PIECEWISE) instead of its own (PIECEWISE)."""

    def defaults(self, inputs):
        found = super().defaults(inputs)
        if inputs.get("optimization_level") == 1:
            found["mode"] = "FULL_AND_PIECEWISE"
        return found


class EnforceEagerStillCompiles(Calculator):
    """enforce_eager turns graphs off but leaves piecewise compilation on."""

    def defaults(self, inputs):
        found = super().defaults({k: v for k, v in inputs.items() if k != "enforce_eager"})
        if inputs.get("enforce_eager"):
            found["mode"], found["max_capture_size"] = "NONE", 0
        return found


class IgnoresAttentionQuantFusion(Calculator):
    """The attention-quant fusion empties the splitting ops, but the mode keeps its pieces."""

    def config_mode(self, inputs):
        return super().config_mode({k: v for k, v in inputs.items() if k != "attention_quant_fusion"})


class AcceptsAnyCompileSizes(Calculator):
    """compile_sizes taken as given: a size that padding moves off its kernel passes."""

    def compile_sizes(self, inputs):
        return policy.check_compile_sizes(inputs["compile_sizes"], inputs["capture_sizes"], "NONE")


class DispatcherAcceptsUnresolvedModes(Calculator):
    """A dispatcher that keys PIECEWISE graphs nobody can capture."""

    def dispatcher_refuses(self, mode, piecewise_capture):
        return False


class SizesForTheWidestSpeculationOnly(Calculator):
    """Under a dynamic speculative schedule, sizes scaled by the largest q alone: narrower tiers
    run out of decode graphs before max_num_seqs."""

    def capture_sizes(self, config):
        return super().capture_sizes({k: v for k, v in config.items() if k != "speculative_schedule"})


class DecodeGraphsOfOneQ(Calculator):
    """Under a dynamic speculative schedule, decode graphs only for the largest q."""

    def dispatch(self, config, num_real_tokens, num_real_rows, uniform, allowed_modes):
        static = {k: v for k, v in config.items() if k != "speculative_schedule"}
        if "speculative_schedule" in config and uniform and num_real_rows and num_real_tokens != num_real_rows * (
                1 + config.get("num_speculative_tokens", 0)):
            uniform = False  # a batch of another q finds no graph of its own
        return super().dispatch(static, num_real_tokens, num_real_rows, uniform, allowed_modes)


class Decode025GraphsOfOneQ(Calculator025):
    """vLLM 0.25 under a dynamic speculative schedule with decode graphs for the config's q alone."""

    peer_release = "0.25"

    def _decode_lens(self, config):
        return None


class LmdeployMaxNotAppended(LmdeployCalculator):
    """User-given batch sizes taken as given: a batch between the largest and max_batch_size has no graph."""

    peer_release = LmdeployCalculator.release

    def capture_sizes(self, config):
        given = set(config.get("capture_sizes") or ())
        return [s for s in super().capture_sizes(config) if s in given]


class LmdeployKeepsSizesAboveTheMax(LmdeployCalculator):
    """User-given sizes above max_batch_size kept instead of dropped (and a list of only those accepted)."""

    peer_release = LmdeployCalculator.release

    def user_sizes(self, sizes, max_batch_size):
        over = [s for s in sizes if isinstance(s, int) and s > max_batch_size]
        return sorted(set(super().user_sizes(sizes, max(over, default=max_batch_size))))


class SglangPrefillPadsWithoutLimit(SglangCalculator):
    """Extend batches replay the smallest bucket that holds them however much it pads (no 2x limit)."""

    peer_release = SglangCalculator.release

    def prefill(self, graphs, num_tokens, num_reqs):
        mode, graph = super().prefill(graphs, num_tokens, num_reqs)
        buckets = sorted(graphs["prefill_tokens"])
        if mode == "NONE" and num_tokens <= buckets[-1]:
            return graphs["prefill_mode"], min(b for b in buckets if b >= num_tokens)
        return mode, graph


# broken calculator -> vLLM tests (as the peer data names them, any parameter) that must catch it
CATCHES = {
    FoldsPiecewiseCaptureIntoSplitting: ["test_resolve_cudagraph_mode_uses_loaded_piecewise_provider"],
    DropsDecodeGraphsWithoutPieces: ["test_resolve_cudagraph_mode_uses_loaded_piecewise_provider"],
    RefusesMoreRequestsThanMaxNumSeqs: ["test_uniform_decode_beyond_capture_ladder_falls_back"],
    RefusesMaxZero: ["test_cudagraph_sizes_post_init"],
    UniformByShapeOnly: ["test_prompt_chunk_of_decode_query_len_is_not_uniform_decode", "test_uniform_decode_predicate"],
    LevelOneCapturesFull: ["test_vllm_config_defaults"],
    EnforceEagerStillCompiles: ["test_enforce_eager"],
    IgnoresAttentionQuantFusion: ["test_splitting_ops_dynamic"],
    AcceptsAnyCompileSizes: ["test_compile_sizes_padding_validation"],
    DispatcherAcceptsUnresolvedModes: ["test_dispatcher"],
    # (vLLM's test_default_cudagraph_capture_sizes_cover_every_dynamic_decode_width passes either way:
    # its config's grid reaches 128 requests of q = 3 without the schedule.)
    SizesForTheWidestSpeculationOnly: ["test_dynamic_decode_capture_covers_schedule_gap_and_tail"],
    DecodeGraphsOfOneQ: ["test_dynamic_sd_full_cudagraph_covers_all_uniform_decode_shapes",
                         "test_dynamic_sd_only_captures_scheduled_query_lengths"],
    Decode025GraphsOfOneQ: ["test_dynamic_sd_full_cudagraph_covers_all_uniform_decode_shapes",
                            "test_dynamic_sd_only_captures_scheduled_query_lengths"],
    LmdeployMaxNotAppended: ["test_custom_capture_batch_sizes_include_max_batch_size",
                             "test_cache_config_normalizes_capture_batch_sizes",
                             "test_graph_runner_defensively_normalizes_capture_batch_sizes"],
    LmdeployKeepsSizesAboveTheMax: ["test_invalid_capture_batch_sizes_raise"],
    SglangPrefillPadsWithoutLimit: ["test_rejects_more_than_two_x_token_padding"],
}
