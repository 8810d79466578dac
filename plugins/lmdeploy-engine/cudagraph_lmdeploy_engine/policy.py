"""LMDeploy 0.18's CUDA-graph policy for the model this runtime drives (a LlamaForCausalLM on
LMDeploy's Triton attention, one GPU, one token a request a decode step), in the harness's words.

Pure Python (no torch, no LMDeploy), so it is answered and tested anywhere. It restates
LMDeploy's code, cited rule by rule (paths under lmdeploy/pytorch/); tests/test_lmdeploy_policy.py
checks it against LMDeploy's own functions where LMDeploy imports, and every build checks it
against what the live engine computed (engine.py), so a restatement that drifts fails loudly.

- Graphs are FULL graphs of decode batches only: `CUDAGraphRunner._should_use_full_graph`
  (backends/cuda/graph_runner/runner.py) takes the graph path when the step is decoding
  (`ModelInputs.is_decoding`) and the model supports graphs; every other step runs eager,
  unpadded. LMDeploy's piecewise graphs are for prefill of models that opt in
  (`PiecewiseCudaGraphMixin`: Qwen3, Qwen3.5, GLM-MoE-DSA); `LlamaForCausalLM` (models/llama.py)
  does not, so this model has none. `eager_mode=True` captures nothing.
- Sizes are batch sizes (requests): `_get_capture_batch_size_impl(max_batch_size)` (runner.py)
  gives the powers of two up to min(256, max), then steps of 256, then max_batch_size itself;
  user sizes go through `normalize_cudagraph_capture_batch_sizes` (config.py): those up to the
  max, sorted and unique, with max_batch_size appended. With one token a request, a size in
  requests is a size in tokens.
- Padding: a decode batch of n requests runs the graph of the smallest size >= n
  (`CUDAGraphRunner._get_capture_tokens`). The largest size is always max_batch_size, which no
  decode batch exceeds; above it LMDeploy asserts, and this policy answers eager.
- Keys: `(padded batch, is_decoding, enable_microbatch, query_len)` (`get_graph_key`): one FULL
  graph per size, keyed by the padded request count.

The harness's config modes map onto LMDeploy's one switch: NONE is `eager_mode=True`,
FULL_DECODE_ONLY is `eager_mode=False`; every other mode lands on one of the two, with a warning.
"""
from __future__ import annotations

from harness import protocol as p
from harness.vocabulary import FAP, FDO, padded

ATTENTION = "lmdeploy-triton"  # LMDeploy's Triton attention (backends/cuda/attention/default.py)
# Its graphs hold single-token decode batches only (the runner's rule above): in the harness's
# words, UNIFORM_SINGLE_TOKEN_DECODE.
SUPPORT = "UNIFORM_SINGLE_TOKEN_DECODE"
DEFAULT_PREFILL_TOKENS = 8192  # PytorchEngineConfig.max_prefill_token_num (messages.py)
POWER_OF_TWO_LIMIT = 256  # runner.py: batch_step

DECODE_ONLY = ("LMDeploy puts only decode batches in CUDA graphs (CUDAGraphRunner._should_use_full_graph: "
               "global_is_decoding); prefill and mixed batches run eager")
NO_PIECEWISE = ("LlamaForCausalLM does not opt into LMDeploy's piecewise prefill graphs (no "
                "PiecewiseCudaGraphMixin in lmdeploy/pytorch/models/llama.py)")
WARNINGS = {
    "FULL": f"FULL resolves to FULL_DECODE_ONLY: {DECODE_ONLY}",
    FAP: f"FULL_AND_PIECEWISE resolves to FULL_DECODE_ONLY: {NO_PIECEWISE}; {DECODE_ONLY}",
    "PIECEWISE": (f"PIECEWISE resolves to NONE (eager_mode=True): {NO_PIECEWISE}, and LMDeploy has no mode "
                  "with piecewise graphs but no FULL decode graphs"),
}


def capture_batch_sizes(max_batches: int) -> list[int]:
    """`_get_capture_batch_size_impl` (backends/cuda/graph_runner/runner.py)."""
    sizes, size = [], 1
    while size <= min(POWER_OF_TWO_LIMIT, max_batches):
        sizes.append(size)
        size *= 2
    sizes += list(range(size, max_batches + 1, POWER_OF_TWO_LIMIT))
    if sizes[-1] != max_batches:
        sizes.append(max_batches)
    return sizes


def user_batch_sizes(sizes, max_batches: int) -> list[int]:
    """`normalize_cudagraph_capture_batch_sizes` (config.py); its assertions as ValueError."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("LMDeploy rejects empty capture_sizes (cudagraph_capture_batch_sizes should not be empty)")
    if not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(f"LMDeploy rejects capture_sizes {sizes}: cudagraph_capture_batch_sizes must be positive "
                         "integers")
    kept = sorted({s for s in sizes if s <= max_batches})
    if not kept:
        raise ValueError(f"LMDeploy rejects capture_sizes {sizes}: none is <= max_batch_size ({max_batches}), the "
                         "max_num_seqs")
    if kept[-1] != max_batches:
        kept.append(max_batches)
    return kept


def check_supported(config: p.PolicyConfig) -> None:
    """ValueError for what this runtime does not drive, or LMDeploy has no option for."""
    if config.num_speculative_tokens:
        raise ValueError(f"num_speculative_tokens={config.num_speculative_tokens}: this runtime drives LMDeploy at one "
                         "token a request (its speculative decoding needs FlashAttention-3 and a draft model)")
    if config.max_loras:
        raise ValueError(f"max_loras={config.max_loras}: this runtime loads no LoRA adapters")
    if config.max_capture_size is not None:
        raise ValueError(f"max_capture_size={config.max_capture_size}: LMDeploy has no such option (it captures up "
                         "to max_batch_size); give capture_sizes instead")
    budget = config.max_num_batched_tokens
    if budget is not None and budget < config.max_num_seqs:
        raise ValueError(f"max_num_batched_tokens={budget} is below max_num_seqs={config.max_num_seqs}: LMDeploy "
                         "captures a decode graph of max_batch_size requests, which that token budget cannot hold")


def resolve(mode: str, support: str = SUPPORT) -> tuple[str, tuple[str, ...]]:
    """(resolved config mode, warnings) for a requested mode over attention of this support level."""
    if mode not in p.CONFIG_MODES:
        raise ValueError(f"unknown config mode {mode!r}; expected one of {', '.join(p.CONFIG_MODES)}")
    if mode == "NONE":
        return "NONE", ()
    if support == "NEVER":
        return "NONE", (f"{mode} resolves to NONE (eager_mode=True): attention of support NEVER cannot be in a "
                        "graph, and LMDeploy's only graphs are FULL decode graphs",)
    if mode == FDO:
        return FDO, ()
    resolved = "NONE" if mode == "PIECEWISE" else FDO
    return resolved, (WARNINGS[mode],)


class LmdeployPolicy:
    """The protocol's policy questions, answered by the rules above."""

    def sizes(self, config: p.PolicyConfig) -> list[int]:
        """Sizes with a graph under the mode the config resolves to (none under NONE)."""
        check_supported(config)
        if resolve(config.mode)[0] == "NONE":
            return []
        if config.capture_sizes is not None:
            return user_batch_sizes(config.capture_sizes, config.max_num_seqs)
        return capture_batch_sizes(config.max_num_seqs)

    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return self.sizes(config)

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        return padded(self.sizes(config), num_real_tokens)

    def dispatch(self, config: p.PolicyConfig, num_real_tokens: int, num_real_rows: int | None = None, uniform: bool = False,
                 num_active_loras: int = 0) -> p.Dispatch:
        if num_active_loras:
            raise ValueError("this runtime loads no LoRA adapters: num_active_loras must be 0")
        # A uniform batch (one token a request) is what this runtime sends LMDeploy as a decoding step.
        size = padded(self.sizes(config), num_real_tokens) if uniform else None
        if size is None:
            return p.Dispatch("NONE", p.Descriptor(num_real_tokens))
        return p.Dispatch("FULL", p.Descriptor(size, size, True))

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        if request.num_speculative_tokens:
            raise ValueError(f"num_speculative_tokens={request.num_speculative_tokens}: this runtime drives LMDeploy at "
                             f"one token a request; NONE and {FDO} are what it runs")
        resolved, warnings = resolve(request.mode, request.support)
        return p.Resolution(request.mode, resolved, warnings)
