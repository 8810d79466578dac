"""LoRA adapters on vLLM 0.25's V1 runner: the harness's PEFT folders as vLLM's LoRARequests.

What vLLM does with them (read in vLLM 0.25's source):
- EngineArgs `enable_lora`, `max_loras`, `max_lora_rank`, `max_cpu_loras`, `specialize_active_lora`
  become its LoRAConfig (vllm/config/lora.py); `max_lora_rank` is one of vLLM's listed ranks and at
  least every adapter's `r`.
- GPUModelRunner.load_model wraps the model with LoRA layers (`load_lora_model`,
  vllm/v1/worker/lora_model_runner_mixin.py) and holds an LRUCacheWorkerLoRAManager
  (`runner.lora_manager`, vllm/lora/worker_manager.py) that loads an adapter from its
  `lora_path` the first time a step names it.
- A request names its adapter in `NewRequestData.lora_request`; the runner's persistent batch
  keeps it (`input_batch.lora_id_to_lora_request`), `set_active_loras` maps each token row to
  its request's adapter, and the dispatcher is asked with `num_active_loras` = the number of
  distinct adapters in the batch (gpu_model_runner.py, `_determine_batch_execution_and_padding`).

The pure parts (the EngineArgs fields, the checks of the adapter folders, each request's
LoRARequest) are here without vLLM, tested on a CPU (tests/test_vllm_engine_v1_lora_cpu.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from harness import protocol as p

# vLLM 0.25's MaxLoRARanks (vllm/config/lora.py): max_lora_rank is one of these.
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The projections of vLLM's Llama that take LoRA (its packed qkv_proj and gate_up_proj, by their parts).
LLAMA_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


class AdapterRefused(ValueError):
    """An adapter this runtime or vLLM will not load, naming the adapter and what was refused."""


def read_adapter(folder: str) -> dict:
    """An adapter folder's adapter_config.json, checked for what vLLM's Llama LoRA layers take."""
    path = Path(folder) / "adapter_config.json"
    if not path.is_file():
        raise AdapterRefused(f"LoRA adapter {folder}: no adapter_config.json (a PEFT adapter folder has one)")
    if not (Path(folder) / "adapter_model.safetensors").is_file():
        raise AdapterRefused(f"LoRA adapter {folder}: no adapter_model.safetensors")
    config = json.loads(path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterRefused(f"LoRA adapter {folder}: peft_type {config.get('peft_type')!r}, not LORA")
    targets = set(config.get("target_modules") or ())
    if not targets or not targets <= LLAMA_TARGETS:
        raise AdapterRefused(f"LoRA adapter {folder}: target_modules {sorted(targets)}; vLLM's Llama takes LoRA on "
                             f"{', '.join(sorted(LLAMA_TARGETS))}")
    return config


def max_lora_rank(configs) -> int:
    """The smallest of vLLM's ranks that holds every adapter's r, and at least vLLM's warm-up rank
    (8: `maybe_setup_dummy_loras` warms up at min(max_lora_rank, 8)); 8 where no adapter is given."""
    rank = max([8] + [int(c["r"]) for c in configs])
    for allowed in VLLM_RANKS:
        if allowed >= rank:
            return allowed
    raise AdapterRefused(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_RANKS[-1]})")


# vLLM 0.25's LoRA kernels assert their weights are half precision (vllm/lora/ops/triton_ops/
# lora_expand_op.py, _lora_expand): an engine in float32 would fail inside them at capture.
LORA_DTYPES = ("bfloat16", "float16")


def lora_args(policy: p.PolicyConfig, adapters: tuple[str, ...], dtype: str | None = None) -> dict:
    """The EngineArgs fields of an engine with these adapters (none where LoRA is off): as many
    adapters cached on the CPU as there are, max_loras per batch as the policy says. Refused in a
    dtype vLLM's LoRA kernels do not take."""
    if not policy.max_loras:
        if adapters:
            raise ValueError(f"{len(adapters)} LoRA adapters given, but max_loras=0 (LoRA off): set "
                             "PolicyConfig.max_loras to the most adapters one batch may use")
        return {}
    if dtype is not None and dtype not in LORA_DTYPES:
        raise ValueError(f"LoRA adapters in {dtype}: vLLM 0.25's LoRA kernels take {' or '.join(LORA_DTYPES)} only "
                         "(vllm/lora/ops/triton_ops/lora_expand_op.py); build the engine in one of them")
    configs = [read_adapter(folder) for folder in adapters]
    return dict(enable_lora=True, max_loras=policy.max_loras, max_lora_rank=max_lora_rank(configs),
                max_cpu_loras=max(policy.max_loras, len(adapters)),
                specialize_active_lora=policy.specialize_active_loras)


def lora_requests(adapters: tuple[str, ...], make) -> dict[int, object]:
    """Adapter id (from 1, Request.lora) -> vLLM's LoRARequest, made by `make` (vLLM's LoRARequest
    class: lora_name, lora_int_id, lora_path)."""
    return {i: make(lora_name=f"harness-adapter-{i}", lora_int_id=i, lora_path=str(folder))
            for i, folder in enumerate(adapters, start=1)}


def request_lora(request_id: int, lora: int | None, known: dict) -> object | None:
    """The LoRARequest a request names, or None; an id with no adapter is refused, naming both."""
    if lora is None:
        return None
    if lora not in known:
        raise ValueError(f"request {request_id} names LoRA adapter {lora}; this engine was built with adapters "
                         f"{sorted(known) or 'none'} (EngineConfig.lora_adapters, ids from 1)")
    return known[lora]


def load_each(manager, requests: dict) -> None:
    """Load every adapter once through vLLM's worker LoRA manager, so that one vLLM refuses fails the
    build naming it and vLLM's reason (not a step later, inside the forward); then unload them: a
    step loads what it names, and capture runs with vLLM's own dummy adapters."""
    for lora_id, request in requests.items():
        try:
            manager.add_adapter(request)
        except Exception as exc:
            raise AdapterRefused(f"vLLM refused LoRA adapter {lora_id} ({request.lora_path}): "
                                 f"{type(exc).__name__}: {exc}") from exc
    manager.remove_all_adapters()
