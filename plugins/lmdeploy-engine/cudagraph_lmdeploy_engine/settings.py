"""The LMDeploy settings this runtime runs with, in one place: the environment set before LMDeploy
is imported, the dtype and KV layout every engine is built with, the engine config made from a
harness EngineConfig, what LMDeploy changes for the whole process (put back around every call),
and the event log.

LMDeploy reads its environment at import (lmdeploy/pytorch/envs.py), so `apply_environment()`
runs before the first `import lmdeploy` (runtime.py, smoke.py). Values are defaults: a variable
already set wins, and the build checks the two that would change what the suites observe.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager

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
DEFAULT_KV_TOKENS = 4096
EVENTS_VARIABLE = "CUDAGRAPH_LMDEPLOY_EVENTS"  # a file every build, capture and first step is appended to

_log = logging.getLogger("cudagraph_lmdeploy_engine")


def apply_environment() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    inductor = sys.modules.get("torch._inductor.config")  # read its variable already: told directly
    if inductor is not None:
        inductor.compile_threads = int(os.environ["TORCHINDUCTOR_COMPILE_THREADS"])


def num_gpu_blocks(kv_tokens: int | None, max_seqs: int) -> int:
    """LMDeploy's reserved block, the blocks kv_tokens needs, and one partly filled block a request."""
    return RESERVED_BLOCKS + -(-(kv_tokens or DEFAULT_KV_TOKENS) // BLOCK_SIZE) + max_seqs


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


@contextmanager
def process_state_restored(rng):
    """Run a call into LMDeploy with its own random streams, and put back what it changes for the
    process. LMDeploy draws from torch's global generators (every graph step fills its padded
    token ids with `random_`, CudaGraphMixin.fill_buffers_cudagraph; warm-up draws dummy inputs):
    `rng` holds LMDeploy's CPU and CUDA generator states between calls, so its draws go on as one
    stream and the caller's generators are untouched. The harness fails a test that leaves
    process-wide state changed (docs/reliability.md); this runtime, not LMDeploy, owns that promise."""
    environment = dict(os.environ)
    caller = rng.swap_in()
    try:
        yield
    finally:
        rng.swap_out(caller)
        for name in set(os.environ) - set(environment):
            del os.environ[name]
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


class EngineRandom:
    """LMDeploy's CPU and CUDA generator states, seeded once, kept between calls (`device` None:
    the CPU generator only)."""

    def __init__(self, seed: int, device: int | None):
        import torch

        self.device = device
        self.cpu = torch.Generator().manual_seed(seed).get_state()
        self.cuda = None if device is None else torch.Generator(device=f"cuda:{device}").manual_seed(seed).get_state()

    def swap_in(self):
        import torch

        caller = (torch.get_rng_state(), None if self.device is None else torch.cuda.get_rng_state(self.device))
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        return caller

    def swap_out(self, caller) -> None:
        import torch

        self.cpu = torch.get_rng_state()
        torch.set_rng_state(caller[0])
        if self.device is not None:
            self.cuda = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(caller[1], self.device)


def event(message: str) -> None:
    """One line about a stage (build, capture, a failure), to the log and to the events file, so a
    GPU run that dies still says how far it got and how long each stage took."""
    line = f"{time.strftime('%H:%M:%S')} {message}"
    _log.info(line)
    path = os.environ.get(EVENTS_VARIABLE)
    if path:
        try:
            with open(path, "a") as handle:
                handle.write(line + "\n")
        except OSError as exc:  # the log is a help, never a reason to fail a test
            print(f"cudagraph_lmdeploy_engine: cannot append to {path}: {exc}", file=sys.stderr)


@contextmanager
def timed(what: str):
    start = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        event(f"FAILED {what} after {time.perf_counter() - start:.1f}s: {type(exc).__name__}: {exc}")
        raise
    event(f"{what}: {time.perf_counter() - start:.1f}s")
