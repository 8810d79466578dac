"""The LMDeploy settings this runtime runs with, in one place: the environment set before LMDeploy
is imported, the dtype and KV layout every engine is built with, the engine config made from a
harness EngineConfig, what LMDeploy changes for the whole process (put back around every call),
and the event log.

LMDeploy reads its environment at import (lmdeploy/pytorch/envs.py), so `apply_environment()`
runs before the first `import lmdeploy` (runtime.py, smoke.py). Values are defaults: a variable
already set wins, and the build checks the two that would change what the suites observe.
"""
from __future__ import annotations

from harness.kit import guard
from harness.kit.block_book import num_blocks_for
from harness.kit.events import EventLog
from harness.kit.guard import EngineRandom  # noqa: F401  (this module's name for it, kept)

from .policy import DEFAULT_PREFILL_TOKENS

ENVIRONMENT = {
    # LMDeploy's defaults, stated: decode graphs capture the plain model (an eager reference at the
    # same shape then runs the same kernels), and captures are real CUDA graphs.
    "LMDEPLOY_ENABLE_DECODE_TORCH_COMPILE": "0",
    "LMDEPLOY_FAKE_CUDA_GRAPH_CAPTURE": "0",
    "LMDEPLOY_SKIP_WARMUP": "0",  # warm-up is where LMDeploy captures: this runtime's capture()
    "HF_HUB_OFFLINE": "1",  # the checkpoint is a local folder; the GPU machine has no network
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast stays off on the lent machines
    # LMDeploy compiles some ops with torch.compile (lmdeploy/pytorch/nn/norm.py rms_scale): in this
    # process, since Inductor's worker pool (seen: 17 processes on an H200) would outlive the test.
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}
# PytorchEngineConfig.dtype takes 'auto', 'float16' or 'bfloat16' (messages.py): no float32. 'auto'
# makes a float32 checkpoint float16, and so does this runtime, whatever it is asked
# (Capabilities.precision says so).
DTYPE = "float16"
BLOCK_SIZE = 64  # PytorchEngineConfig.block_size's default; the kernel block size follows it
RESERVED_BLOCKS = 1  # ConfigBuilder.build_cache_config: block 0 "for dummy input and padding"

EVENTS = EventLog("cudagraph_lmdeploy_engine", "CUDAGRAPH_LMDEPLOY_EVENTS")  # the variable names a file every build, capture and first step is appended to
event, timed = EVENTS.event, EVENTS.timed  # one line about a stage, and a stage timed (harness.kit.events)


def apply_environment() -> None:
    guard.apply_environment(ENVIRONMENT)


def num_gpu_blocks(kv_tokens: int | None, max_seqs: int) -> int:
    """LMDeploy's reserved block, the blocks kv_tokens needs, and one partly filled block a request."""
    return num_blocks_for(kv_tokens, BLOCK_SIZE, max_seqs, reserved=RESERVED_BLOCKS)


def engine_config(config, resolved: str):
    """LMDeploy's PytorchEngineConfig for a harness EngineConfig whose mode resolved to `resolved`
    (policy.resolve): NONE is eager_mode, FULL_DECODE_ONLY is LMDeploy's default graph mode."""
    from lmdeploy.messages import PytorchEngineConfig

    policy = config.policy
    sizes = list(policy.capture_sizes) if policy.capture_sizes is not None else None  # one token a request
    return PytorchEngineConfig(
        dtype=DTYPE, tp=1, session_len=config.max_model_len, max_batch_size=policy.max_num_seqs,
        block_size=BLOCK_SIZE, num_gpu_blocks=num_gpu_blocks(config.kv_tokens, policy.max_num_seqs),
        num_cpu_blocks=0, max_prefill_token_num=policy.max_num_batched_tokens or DEFAULT_PREFILL_TOKENS,
        cudagraph_capture_batch_sizes=sizes, enable_prefix_caching=False, eager_mode=resolved == "NONE",
        device_type="cuda", distributed_executor_backend="uni")


# A call into LMDeploy with its own random streams, and what it changes for the process put back
# (`process_state_restored(rng)`). LMDeploy draws from torch's global generators (every graph step
# fills its padded token ids with `random_`, CudaGraphMixin.fill_buffers_cudagraph; warm-up draws
# dummy inputs): `rng` (harness.kit.guard.EngineRandom) holds LMDeploy's CPU and CUDA generator
# states between calls, so its draws go on as one stream and the caller's generators are untouched.
process_state_restored = guard.process_state_restored
