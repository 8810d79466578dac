"""Giving back what a vLLM 0.25 engine holds, as vLLM's own test suite does between engines.

vLLM's tests/conftest.py ends every test with the engine shut down, `cleanup_dist_env_and_memory()`
(vllm/distributed/parallel_state.py: model-parallel groups and the distributed environment
destroyed, gc, empty_cache) and `torch._dynamo.reset()`. Here engines outlive tests (the harness
shares them), so the work is split:

- `release_engine` (every engine, at its close): what only this engine uses. The global bytecode
  hook each compiled module registers with dynamo (vllm/compilation/wrapper.py,
  `TorchCompileWithNoGuardsWrapper.cleanup`), which holds the module and so its weights; dynamo's
  cache entry on the compiled class's forward (`remove_from_cache`, which vLLM itself calls before
  every new engine's first compile: engines run their own compiled bytecode, not that entry), whose
  compiled function holds its example inputs, the weights again; then the worker's own
  `shutdown()` (vllm/v1/worker/gpu_worker.py -> gpu/model_runner.py `shutdown`: KV caches, the
  static forward context, the RoPE cache, the workspace manager, the model).
- `release_process` (when no engine of this runtime is left): the process-wide rest, exactly as
  vLLM's tests: `cleanup_dist_env_and_memory()` and `torch._dynamo.reset()`.
"""
from __future__ import annotations

import gc


def compiled_modules(model) -> list:
    """The modules of a model that vLLM compiled (@support_torch_compile), each registered with dynamo."""
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    if model is None:
        return []
    return [m for m in model.modules() if isinstance(m, TorchCompileWithNoGuardsWrapper)]


def release_engine(executor, runner, others_alive: bool) -> None:
    """What one engine holds. `others_alive`: another engine of this process still runs, so the
    process-wide state it relies on (the workspace manager) is put back after vLLM's shutdown."""
    import torch
    from vllm.v1.worker import workspace

    model = getattr(runner, "model", None)
    codes = []
    for module in compiled_modules(model):
        module.cleanup()  # the bytecode hook: a global reference to the module
        codes.append(module.original_code_object())
    del model
    device = getattr(runner, "device", None)
    had_workspace = workspace.is_workspace_manager_initialized()
    executor.shutdown()
    for code in codes:
        torch._dynamo.eval_frame.remove_from_cache(code)
    if others_alive and had_workspace and device is not None and not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(device)  # shutdown reset it; the live engines' workers made it
    gc.collect()
    torch.cuda.empty_cache()


def release_process() -> None:
    """The rest, once no engine is left (vLLM's tests/conftest.py: cleanup_fixture, dynamo_reset)."""
    import torch
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
