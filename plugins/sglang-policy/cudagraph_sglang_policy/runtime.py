"""The `sglang-policy` runtime: SGLang's CUDA-graph policy (sglang 0.5.23) behind the harness protocol.

SGLang keeps two graph sets. Decode graphs (`DecodeCudaGraphRunner`) are keyed by batch size,
the number of requests, each replaying bs x q tokens; every other batch is an extend (prefill)
batch, whose graphs (`PrefillCudaGraphRunner`, "breakable" by default on CUDA: captured in
segments with attention run eagerly between them) are keyed by token count. The protocol's
uniform batches are SGLang's decode batches; the rest are extend batches.

Where each answer comes from (SOURCES says it again for the report):

- SGLang's own code, called: the graph configuration the server-argument pipeline resolves.
  `ServerArgs`, then `arg_groups.cuda_graph_hook.parse_cuda_graph_config` (flags -> per-phase
  backends) and `arg_groups.memory_hook.handle_gpu_memory_settings` (decode `max_bs` from GPU
  memory, clamped to `max_running_requests`; the decode batch-size list from
  `generate_decode_cuda_graph_batch_sizes`; the prefill token buckets from
  `generate_prefill_cuda_graph_batch_sizes`; the device's default `chunked_prefill_size`).
- A reproduction from SGLang's source, cited function by function below (`_capture_bs`,
  `_decode`, `_prefill`): the runner-level rules. Their modules cannot be imported here:
  `sglang.srt.model_executor.runner` imports `sglang.srt.dllm.config`, which imports the
  `sglang.srt.configs` package, whose `nano_nemotron_vl` -> `multimodal.internvl_utils` does
  `import torchvision.transforms`; PyPI's torchvision wheels are CUDA builds that need
  `libtorch_cuda.so` (`RuntimeError: operator torchvision::nms does not exist` over a CPU torch),
  and without torchvision it is `ModuleNotFoundError: No module named 'torchvision'`. The same
  import blocks `handle_gpu_memory_settings`'s prefill default (`use_mla_backend`), so the prefill
  `max_bs` is given explicitly as that default is for a non-MLA model: `chunked_prefill_size`.

Stood in, for the length of each question: the device queries `get_device_memory_capacity`
(an H200's 143,771 MiB for platform_max 512, a B200's 183,359 MiB for 1024) and `is_cuda`
(True, so the CUDA defaults apply). Assumed: one attention-TP rank without data-parallel
attention or two-batch overlap (batch-size alignment 1), and a KV pool large enough that the
request pool holds `max_running_requests`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness import protocol as p
# BaseCudaGraphRunner._pad_to_bucket (model_executor/runner/base_cuda_graph_runner.py) is the smallest
# bucket >= size by bisect: the harness's own padded().
from harness.vocabulary import padded

from . import __version__

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny_llama"  # a config.json only: ServerArgs needs a model path, never weights
KNOWN_FAILURES = HERE.parent / "known_failures.toml"
SGLANG_VERSION = "0.5.23"
DEVICE_MEMORY_MIB = {512: 143_771.0, 1024: 183_359.0}  # platform_max -> an H200's, a B200's memory
# SGLang's per-phase backends as the protocol's runtime modes.
BACKEND_MODES = {"full": "FULL", "breakable": "PIECEWISE", "disabled": "NONE"}
# The protocol's config modes as SGLang flags (FULL_AND_PIECEWISE is SGLang's CUDA default).
MODE_FLAGS = {
    "NONE": dict(disable_cuda_graph=True),
    "PIECEWISE": dict(cuda_graph_backend_decode="breakable"),
    "FULL": dict(cuda_graph_backend_prefill="full"),
    "FULL_DECODE_ONLY": dict(disable_prefill_cuda_graph=True),
    "FULL_AND_PIECEWISE": {},
}
# model_executor/runner/prefill_cuda_graph_runner.py: a replay pads at most 2x its tokens.
MAX_PREFILL_PADDING_FACTOR = 2
SOURCES = {
    "decode batch sizes, max_bs, prefill buckets, backends": "SGLang's own code (server-argument hooks)",
    "decode capture list clamp, padding, can_run_graph": "reproduction (runner modules do not import)",
    "prefill padding, 2x padding limit, full-prefill request slots": "reproduction (runner modules do not import)",
}


@dataclass(frozen=True)
class Graphs:
    """What SGLang captures for one config: decode graphs per batch size, prefill per token count."""

    q: int  # tokens per request in a decode (verify) step
    decode_mode: str  # runtime mode of the decode graphs
    capture_bs: tuple[int, ...]  # request counts with a decode graph
    prefill_mode: str
    prefill_tokens: tuple[int, ...]  # token counts with a prefill graph
    prefill_slots: int | None  # full prefill graphs: the request slots baked in


class SglangPolicyRuntime:
    name = "sglang-policy"
    known_failures = str(KNOWN_FAILURES)
    capabilities = p.Capabilities(
        capture_sizes=True, dispatch=True, speculative=True,
        notes=("policy only (no GPU, no model weights). SGLang's own code resolves the graph config (decode "
               "batch sizes and max_bs, prefill token buckets, per-phase backends); the runner rules (decode "
               "clamp and padding, prefill padding and its 2x limit) are a reproduction from SGLang's source "
               "because sglang.srt.model_executor.runner needs torchvision, which needs a CUDA torch. Stood in: "
               "device memory (H200 / B200) and is_cuda. capture_sizes are decode graphs in tokens (batch size "
               "x q); user sizes are SGLang request counts; speculative = NGRAM with q draft tokens"),
    )

    def __init__(self):
        import sglang  # fails here, with the reason shown by the harness, when SGLang is not installed

        self.version = f"{__version__} (SGLang {sglang.__version__})"
        self._graphs = lru_cache(maxsize=256)(self._resolve)

    # -- SGLang's own code ---------------------------------------------------------------
    @contextlib.contextmanager
    def _device(self, platform_max: int):
        """Answer SGLang's device queries as a GPU of this platform would, for one question."""
        import sglang.srt.utils as utils
        from sglang.srt.arg_groups import memory_hook

        memory = DEVICE_MEMORY_MIB[platform_max]
        real_memory, real_is_cuda = memory_hook.get_device_memory_capacity, utils.is_cuda
        memory_hook.get_device_memory_capacity = lambda device=None: memory
        utils.is_cuda = lambda: True
        try:
            yield
        except (AssertionError, TypeError, ValueError) as exc:  # SGLang's argument checks
            raise ValueError(f"SGLang rejects the config: {exc}") from exc
        finally:
            memory_hook.get_device_memory_capacity, utils.is_cuda = real_memory, real_is_cuda

    @staticmethod
    def _graph_config(config: p.PolicyConfig, chunked_prefill_size: int | None, prefill_max_bs: int):
        """Run SGLang's graph-config resolution for these server arguments."""
        from sglang.srt.arg_groups import cuda_graph_hook, memory_hook
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.server_args import ServerArgs

        flags = dict(MODE_FLAGS[config.mode])
        if config.capture_sizes is not None:
            flags["cuda_graph_bs_decode"] = list(config.capture_sizes)
        if config.max_capture_size is not None:
            flags["cuda_graph_max_bs_decode"] = config.max_capture_size
        if config.num_speculative_tokens:
            flags.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=config.query_len)
        args = ServerArgs(model_path=str(MODEL_DIR), device="cuda", skip_tokenizer_init=True, tp_size=1,
                          max_running_requests=config.max_num_seqs, chunked_prefill_size=chunked_prefill_size,
                          cuda_graph_max_bs_prefill=prefill_max_bs,
                          mem_fraction_static=0.8,  # its default needs the model config (torchvision)
                          **flags)
        cuda_graph_hook.parse_cuda_graph_config(args)
        cuda_graph_hook.validate_cuda_graph_config(args)
        memory_hook.handle_gpu_memory_settings(args)
        return resolving_view(args)

    def _resolve(self, config: p.PolicyConfig) -> Graphs:
        with self._device(config.platform_max):
            tokens = config.max_num_batched_tokens
            if tokens is None:  # the device's default, as SGLang's memory hook picks it
                tokens = self._graph_config(config, None, 1).chunked_prefill_size
            resolved = self._graph_config(config, tokens, tokens)
        decode, prefill = resolved.cuda_graph_config.decode, resolved.cuda_graph_config.prefill
        pool = config.max_num_seqs  # req_to_token_pool.size (kv_cache_configurator.resolve_max_num_reqs)
        prefill_mode = BACKEND_MODES[prefill.backend]
        slots = None
        if prefill_mode == "FULL":
            # model_runner_components/cuda_graph_setup.py: full prefill graphs bake in
            # max(chunked_prefill_size // 512, 1) request slots, at most the request pool.
            slots = min(prefill.full_prefill_max_req or max(tokens // 512, 1), pool)
        return Graphs(
            q=config.query_len,
            decode_mode=BACKEND_MODES[decode.backend],
            capture_bs=tuple(_capture_bs(decode.bs, pool)) if decode.backend != "disabled" else (),
            prefill_mode=prefill_mode,
            prefill_tokens=tuple(sorted(set(prefill.bs))) if prefill.backend != "disabled" else (),
            prefill_slots=slots,
        )

    # -- policy --------------------------------------------------------------------------
    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        """The decode graphs, in tokens: each captured batch size x q."""
        graphs = self._graphs(config)
        return [bs * graphs.q for bs in graphs.capture_bs]

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        """A decode step of num_real_tokens: the graph of the smallest batch size that holds it."""
        graphs = self._graphs(config)
        return padded([bs * graphs.q for bs in graphs.capture_bs], num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0) -> p.Dispatch:
        if num_active_loras:
            raise ValueError("sglang-policy does not model LoRA graphs (capability lora is off)")
        graphs = self._graphs(config)
        if uniform:
            return _decode(graphs, num_real_tokens, num_real_rows if num_real_rows is not None else num_real_tokens // graphs.q)
        return _prefill(graphs, num_real_tokens, num_real_rows if num_real_rows is not None else min(num_real_tokens, config.max_num_seqs))


# -- the runner rules, reproduced from SGLang's source ------------------------------------------
def _capture_bs(decode_bs, pool_size: int) -> list[int]:
    """get_batch_sizes_to_capture (model_executor/runner/base_cuda_graph_runner.py), with
    alignment 1: when the list goes past the request pool, the pool size is appended; sizes
    above the pool are dropped; sorted, unique; an empty list is an error."""
    capture_bs = list(decode_bs or [])
    if not capture_bs:
        raise ValueError("SGLang needs at least one decode CUDA graph batch size (cuda_graph_config[decode].bs)")
    if max(capture_bs) > pool_size:
        capture_bs.append(pool_size)
    capture_bs = sorted({bs for bs in capture_bs if bs <= pool_size})
    if not capture_bs or capture_bs[0] <= 0:
        raise ValueError(f"SGLang decode CUDA graph batch sizes must be positive, got {sorted(decode_bs)}")
    return capture_bs


def _decode(graphs: Graphs, num_real_tokens: int, num_real_rows: int) -> p.Dispatch:
    """DecodeCudaGraphRunner.can_run_graph and load_batch (model_executor/runner/
    decode_cuda_graph_runner.py): a batch of bs requests replays when bs <= max_bs, at the
    bucket of its batch size; the graph runs bucket x q tokens and is keyed by the bucket."""
    eager = p.Dispatch("NONE", p.Descriptor(num_real_tokens))
    if graphs.decode_mode == "NONE" or not graphs.capture_bs or num_real_rows > graphs.capture_bs[-1]:
        return eager
    bs = padded(graphs.capture_bs, num_real_rows)
    return p.Dispatch(graphs.decode_mode, p.Descriptor(bs * graphs.q, bs, True))


def _prefill(graphs: Graphs, num_real_tokens: int, num_real_rows: int) -> p.Dispatch:
    """PrefillCudaGraphRunner.can_replay_locally (model_executor/runner/prefill_cuda_graph_runner.py):
    full graphs take at most their request slots; the batch must fit the largest token bucket,
    and the bucket it pads to may be at most twice its tokens; keyed by the token bucket."""
    eager = p.Dispatch("NONE", p.Descriptor(num_real_tokens))
    if graphs.prefill_mode == "NONE" or not graphs.prefill_tokens or num_real_tokens > graphs.prefill_tokens[-1]:
        return eager
    if graphs.prefill_slots is not None and num_real_rows > graphs.prefill_slots:
        return eager
    bucket = padded(graphs.prefill_tokens, num_real_tokens)
    if bucket > num_real_tokens * MAX_PREFILL_PADDING_FACTOR:
        return eager
    return p.Dispatch(graphs.prefill_mode, p.Descriptor(bucket, graphs.prefill_slots, False))
