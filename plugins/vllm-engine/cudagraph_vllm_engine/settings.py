"""The vLLM settings this runtime runs with: the environment (defaults, set before the first
`import vllm`, since vLLM reads it at import), the EngineArgs every engine and policy answer is
built from, and the event log.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from harness.kit import guard
from harness.kit.events import EventLog, collected_warnings

ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # everything in this process (we drive the executor ourselves)
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not carried to the GPU machine
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",  # the checkpoint is a local folder; the GPU machine has no network
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast stays off on the lent machines
    "VLLM_CACHE_ROOT": "/tmp/vllm_cache",  # shared by the smoke stage and the suites: compile caches carry over
    # Inductor compiles in this process: its worker pool would be processes a test leaves running
    # (docs/reliability.md), and the harness ends those.
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}
ATTENTION_BACKEND = "TRITON_ATTN"  # the one backend the carried vLLM build is slimmed for
GPU_MEMORY_UTILIZATION = 0.05  # only checked against free memory: the KV cache size is fixed by num_blocks
USAGE_CONTEXT = "OPENAI_API_SERVER"  # what `vllm serve` defaults to where a config leaves a limit None (the spec's 8192 tokens)

EVENTS = EventLog("cudagraph_vllm_engine", "CUDAGRAPH_VLLM_EVENTS")  # the variable names a file every build, capture and first step is appended to
event, timed = EVENTS.event, EVENTS.timed  # one line about a stage, and a stage timed (harness.kit.events)


def apply_environment() -> None:
    guard.apply_environment(ENVIRONMENT)


# What vLLM changes for the process during a call, put back: draws from torch's global generators
# (forked around the call) and TORCHINDUCTOR_CACHE_DIR pointed at its own cache when it compiles.
process_state_restored = guard.process_state_restored


def engine_args(model: str | Path, policy, *, dtype: str = "float32", seed: int = 0,
                max_model_len: int | None = None, compilation: dict | None = None, draft: str | Path | None = None):
    """vLLM's EngineArgs for a model folder and a harness PolicyConfig. `draft` (policy questions only)
    names an EAGLE draft's config folder (V2 takes only draft-model methods; the policy model's own
    config will do, as sizes and keys depend on the number of speculative tokens only) and enables
    LoRA with no adapter; an engine gets neither, so speculative tokens or LoRA are a ValueError."""
    from vllm.engine.arg_utils import EngineArgs

    questions_only = draft is not None
    if policy.num_speculative_tokens and not questions_only:
        raise ValueError(f"vllm-engine drives q = 1 steps only; num_speculative_tokens={policy.num_speculative_tokens} "
                         "needs a draft model this runtime does not load (README: speculative decoding)")
    if policy.max_loras and not questions_only:
        raise ValueError(f"vllm-engine loads no LoRA adapters; max_loras={policy.max_loras} is answered as policy "
                         "only (README: LoRA)")
    kwargs = dict(model=str(model), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                  max_num_seqs=policy.max_num_seqs, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                  enable_prefix_caching=False,  # this runtime is the scheduler: every step names its tokens
                  async_scheduling=False, disable_log_stats=True,
                  attention_config={"backend": ATTENTION_BACKEND})
    if policy.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = policy.max_num_batched_tokens
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if policy.num_speculative_tokens:
        kwargs["speculative_config"] = {"method": "eagle", "model": str(draft),
                                        "num_speculative_tokens": policy.num_speculative_tokens}
    if policy.max_loras:
        kwargs.update(enable_lora=True, max_loras=policy.max_loras, specialize_active_lora=policy.specialize_active_loras)
    if policy.mode == "NONE":
        kwargs["enforce_eager"] = True  # vLLM's -O0: no torch.compile, no graphs
    else:
        options = {"cudagraph_mode": policy.mode, "cudagraph_specialize_lora": policy.specialize_lora,
                   **(compilation or {})}
        if policy.capture_sizes is not None:
            options["cudagraph_capture_sizes"] = list(policy.capture_sizes)
        if policy.max_capture_size is not None:
            options["max_cudagraph_capture_size"] = policy.max_capture_size
        kwargs["compilation_config"] = options
    return EngineArgs(**kwargs)


def create_vllm_config(args):
    """EngineArgs -> VllmConfig as the offline LLM class makes it; vLLM's config assertions and
    validation errors become ValueError (the protocol's rejection)."""
    from vllm.usage.usage_lib import UsageContext

    try:
        return args.create_engine_config(usage_context=UsageContext[USAGE_CONTEXT])
    except AssertionError as exc:
        raise ValueError(f"vLLM rejects the config: {exc}") from exc


@contextmanager
def collect_cudagraph_warnings():
    """vLLM's warnings about CUDA graphs (WARNING or above, naming cudagraphs) while it is active."""
    from vllm import logger as vllm_logger

    clear = getattr(getattr(vllm_logger, "_print_warning_once", None), "cache_clear", None)
    if clear:
        clear()  # each question is a fresh vLLM start: warn_once must warn again
    with collected_warnings("vllm", "cudagraph") as messages:
        yield messages
