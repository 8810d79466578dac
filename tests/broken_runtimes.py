"""Deliberately broken runtimes: each is the reference with one bug that a real engine shipped
or could ship. The self-tests check that the suites catch every one of them.

Each mutant changes one behaviour through the public protocol only, as a buggy third-party
runtime would.
"""
from __future__ import annotations

import bisect
from dataclasses import replace

from harness import protocol as p
from harness.expectations import oracle
from harness.vocabulary import padded
from reference_runtime.adapter import ReferenceRuntime


class OwnPolicy(ReferenceRuntime):
    """The reference declaring a policy of its own (not vLLM's): only the generic suites apply."""

    capabilities = replace(ReferenceRuntime.capabilities, rules=None)


class PiecewiseOnly(OwnPolicy):
    """Not broken: an engine with no FULL graphs; every mode with a FULL routine resolves to
    PIECEWISE (with a warning), and its policy answers for the mode it runs."""

    name = "piecewise-only"
    FULL_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

    def _runs(self, config):
        return replace(config, mode="PIECEWISE") if config.mode in self.FULL_MODES else config

    def resolve_mode(self, request):
        if request.mode in self.FULL_MODES:
            return p.Resolution(request.mode, "PIECEWISE", (f"{request.mode} resolved to PIECEWISE: no FULL graphs here",))
        return super().resolve_mode(request)

    def capture_sizes(self, config):
        return super().capture_sizes(self._runs(config))

    def padded_size(self, config, num_real_tokens):
        return super().padded_size(self._runs(config), num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return super().dispatch(self._runs(config), num_real_tokens, num_real_rows, uniform, num_active_loras)

    def dp_dispatch(self, config, ranks):
        return super().dp_dispatch(self._runs(config), ranks)


class RejectsUserSizes(OwnPolicy):
    """Not broken: a policy of its own that does not take user-given capture sizes and says so."""

    name = "rejects-user-sizes"

    def capture_sizes(self, config):
        if config.capture_sizes is not None:
            raise ValueError("user-given capture_sizes are not supported; leave them None")
        return super().capture_sizes(config)


class VagueRejection(OwnPolicy):
    """Rejects FULL over attention that cannot be captured without saying what would work."""

    name = "vague-rejection"

    def resolve_mode(self, request):
        if request.mode == "FULL" and request.support == "NEVER":
            raise ValueError("not supported")
        return super().resolve_mode(request)


class IgnoresAdapters(OwnPolicy):
    """An own policy that declares lora but dispatches every batch as if it had no adapter: a
    LoRA batch replays a graph captured without LoRA kernels."""

    name = "ignores-adapters"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras=0)


def _on_grid(size: int) -> bool:
    return size in (1, 2, 4) or (size <= 248 and size % 8 == 0) or (size >= 256 and size % 16 == 0)


class PaddingOffByOne(ReferenceRuntime):
    """A batch that exactly fills a size is padded to the next one (bisect_right)."""

    name = "padding-off-by-one"

    def padded_size(self, config, num_real_tokens):
        sizes = list(self.capture_sizes(config))
        index = bisect.bisect_right(sizes, num_real_tokens)
        return sizes[index] if index < len(sizes) else None


class PaddingRoundsDown(ReferenceRuntime):
    """Pads to the largest size <= n: the graph is smaller than the batch."""

    name = "padding-rounds-down"

    def padded_size(self, config, num_real_tokens):
        sizes = list(self.capture_sizes(config))
        if num_real_tokens > sizes[-1]:
            return None
        return sizes[max(0, bisect.bisect_right(sizes, num_real_tokens) - 1)]


class ClampsAboveMax(ReferenceRuntime):
    """Above the max size the batch is truncated to the largest graph instead of running eager."""

    name = "clamps-above-max"

    def padded_size(self, config, num_real_tokens):
        return super().padded_size(config, num_real_tokens) or list(self.capture_sizes(config))[-1]


class MissingOffGridAppend(ReferenceRuntime):
    """Forgets to append an off-grid max_num_seqs (264 pads to 272)."""

    name = "missing-off-grid-append"

    def capture_sizes(self, config):
        sizes = list(super().capture_sizes(config))
        if config.capture_sizes is None and not _on_grid(config.max_num_seqs) and config.max_num_seqs in sizes:
            sizes.remove(config.max_num_seqs)
        return sizes


class GridGapsAbove256(ReferenceRuntime):
    """Above 256 its default grid skips every third step of 16 (288, 336, ...): a batch there pads
    16 tokens further. Only grids past 256 show it, so only a sweep that reaches vLLM's sizes does."""

    name = "grid-gaps-above-256"

    def capture_sizes(self, config):
        sizes = list(super().capture_sizes(config))
        if config.capture_sizes is None and sizes:
            sizes = [s for s in sizes if not (256 < s < sizes[-1] and s % 48 == 0)]
        return sizes


class NoSpeculativeRounding(ReferenceRuntime):
    """Does not round sizes to multiples of q for FULL decode graphs."""

    name = "no-speculative-rounding"

    def capture_sizes(self, config):
        return super().capture_sizes(replace(config, mode="PIECEWISE"))


class SilentDowngrade(ReferenceRuntime):
    """Downgrades the mode as the table says but tells nobody."""

    name = "silent-downgrade"

    def resolve_mode(self, request):
        return replace(super().resolve_mode(request), warnings=())


class FullWithNeverBackend(ReferenceRuntime):
    """Keeps FULL even when attention cannot be captured (graphs would hold a broken attention)."""

    name = "full-with-never-backend"

    def resolve_mode(self, request):
        if request.support == "NEVER" and request.mode == "FULL":
            return p.Resolution(request.mode, "FULL", ())
        return super().resolve_mode(request)


class PiecewiseBeforeFull(ReferenceRuntime):
    """Checks the PIECEWISE keys before the FULL keys."""

    name = "piecewise-before-full"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        result = super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)
        if result.runtime_mode == "FULL" and config.mode == "FULL_AND_PIECEWISE":
            key = result.descriptor
            return p.Dispatch("PIECEWISE", replace(key, num_padded_rows=None, uniform=False))
        return result


class LoraCountNotRounded(ReferenceRuntime):
    """Looks up the raw active-adapter count, which has no graph unless it is captured."""

    name = "lora-count-not-rounded"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        result = super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)
        if num_active_loras and result.descriptor.num_active_loras != num_active_loras:
            return p.Dispatch("NONE", p.Descriptor(num_real_tokens, num_real_rows, uniform, True, num_active_loras))
        return result


class DataParallelMovesUp(ReferenceRuntime):
    """After padding to the largest rank, re-dispatches with every mode allowed."""

    name = "data-parallel-moves-up"

    def dp_dispatch(self, config, ranks):
        agreed = super().dp_dispatch(config, ranks)
        size = max(d.descriptor.num_padded_tokens for d in agreed)
        return [self.dispatch(config, size, None, r.uniform) for r in ranks]


class RejectsEveryConfig(OwnPolicy):
    """Rejects every config with a ValueError: property tests that return on a rejection pass it."""

    name = "rejects-every-config"

    def capture_sizes(self, config):
        raise ValueError("no config is good enough")


class KeyIsTokensPlusThree(OwnPolicy):
    """Keys its graphs by num_real_tokens + 3 instead of the padded size (its engine pads correctly)."""

    name = "key-is-tokens-plus-three"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        result = super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)
        if result.runtime_mode == "NONE":
            return result
        return replace(result, descriptor=replace(result.descriptor, num_padded_tokens=num_real_tokens + 3))


class MixedBatchRunsDecodeGraph(OwnPolicy):
    """Under FULL_DECODE_ONLY, dispatches mixed batches to the FULL decode graphs."""

    name = "mixed-batch-runs-decode-graph"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        result = super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)
        if config.mode == "FULL_DECODE_ONLY" and not uniform and num_real_tokens <= max(self.capture_sizes(config)):
            return p.Dispatch("FULL", p.Descriptor(self.padded_size(config, num_real_tokens), num_real_rows, False))
        return result


class PaddingNotMonotone(OwnPolicy):
    """Pads every even batch to the largest size: bigger than needed, and not monotone."""

    name = "padding-not-monotone"

    def padded_size(self, config, num_real_tokens):
        padded = super().padded_size(config, num_real_tokens)
        return max(self.capture_sizes(config)) if padded is not None and num_real_tokens % 2 == 0 else padded


class V2RoundsSizes(ReferenceRuntime):
    """Answers vLLM's V2 runner with V1's sizes: rounded to multiples of q, where V2 rounds only its decode keys."""

    name = "v2-rounds-sizes"

    def capture_sizes(self, config):
        return super().capture_sizes(replace(config, rules="vllm-0.33/v1"))


class V2ExactKeyDispatch(ReferenceRuntime):
    """Answers vLLM's V2 runner with V1's dispatch: one exact key over V1's sizes, V1's eager key."""

    name = "v2-exact-key-dispatch"

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return super().dispatch(replace(config, rules="vllm-0.33/v1"), num_real_tokens, num_real_rows, uniform, num_active_loras)


class V2DataParallelSharesPaddedSizes(ReferenceRuntime):
    """Answers vLLM's V2 runner with V1's data-parallel agreement (padded sizes shared, kept on eager)."""

    name = "v2-data-parallel-shares-padded-sizes"

    def dp_dispatch(self, config, ranks):
        return super().dp_dispatch(replace(config, rules="vllm-0.33/v1"), ranks)


class DeclaresVllm025AnswersVllm033(ReferenceRuntime):
    """Declares vLLM 0.25's policy (Capabilities.rules) and answers with 0.33's rules: the
    off-grid max_num_seqs appended, V2's dispatch searching FULL keys before PIECEWISE ones."""

    name = "declares-vllm-0.25-answers-0.33"
    capabilities = replace(ReferenceRuntime.capabilities, rules="vllm-0.25", data_parallel=False)


class DeclaresVllm025V1AnswersVllm033V1(ReferenceRuntime):
    """Declares vLLM 0.25's V1 runner (Capabilities.rules "vllm-0.25/v1") and answers with 0.33's V1
    rules: decode sizes appended before V1 rounds the sizes to whole requests (q = 3, max_num_seqs
    256: 56 sizes up to 504, where 0.25's V1 has 49 up to 498), the off-grid max_num_seqs appended."""

    name = "declares-vllm-0.25-v1-answers-0.33"
    capabilities = replace(ReferenceRuntime.capabilities, rules="vllm-0.25/v1", data_parallel=False)


class DeclaresVllm025V1AnswersV2(ReferenceRuntime):
    """Declares vLLM 0.25's V1 runner and answers with 0.25's V2 rules (the harness's model of them):
    sizes not rounded to whole requests (q = 2: 51 sizes, where V1 has 50), an eager step keyed by
    its request count too, one key search across both modes."""

    name = "declares-vllm-0.25-v1-answers-v2"
    capabilities = replace(ReferenceRuntime.capabilities, rules="vllm-0.25/v1", data_parallel=False)
    V2 = "vllm-0.25/v2"

    def capture_sizes(self, config):
        return oracle.capture_sizes(replace(config, rules=self.V2))

    def padded_size(self, config, num_real_tokens):
        return padded(self.capture_sizes(config), num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return oracle.dispatch(replace(config, rules=self.V2), num_real_tokens, num_real_rows, uniform, num_active_loras)


class V2DecodeKeysPastTheMax(ReferenceRuntime):
    """vLLM's V2 runner rounds its uniform-decode sizes up to whole requests and keeps those within
    q x max_num_seqs and its largest size; this one forgets the largest size. Where the token budget
    or the platform caps the grid below q x max_num_seqs, a decode batch near the top of the grid
    pads past its largest graph (q > 1, V2 only, FULL decode graphs)."""

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        got = super().dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)
        q, sizes = config.query_len, self.capture_sizes(config)
        if (config.vllm_runner != "v2" or q == 1 or not uniform or got.runtime_mode == "FULL" or num_active_loras
                or config.mode not in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") or not sizes or num_real_tokens > sizes[-1]):
            return got
        past = sorted(w for w in (-(-s // q) * q for s in sizes) if sizes[-1] < w <= q * config.max_num_seqs)
        key = next((w for w in past if w >= num_real_tokens), None)
        return got if key is None else p.Dispatch("FULL", p.Descriptor(key, key // q, True))


MUTANTS = [
    PaddingOffByOne, PaddingRoundsDown, ClampsAboveMax, MissingOffGridAppend, NoSpeculativeRounding,
    SilentDowngrade, FullWithNeverBackend, PiecewiseBeforeFull, LoraCountNotRounded, DataParallelMovesUp,
    RejectsEveryConfig, KeyIsTokensPlusThree, MixedBatchRunsDecodeGraph, PaddingNotMonotone,
    V2RoundsSizes, V2ExactKeyDispatch, V2DataParallelSharesPaddedSizes, IgnoresAdapters,
    VagueRejection, DeclaresVllm025AnswersVllm033, V2DecodeKeysPastTheMax, GridGapsAbove256,
    DeclaresVllm025V1AnswersVllm033V1, DeclaresVllm025V1AnswersV2,
]
