"""Giving back what a vLLM 0.25 engine holds, as vLLM's tests/conftest.py does after every test
(engine shut down, `cleanup_dist_env_and_memory()`, `torch._dynamo.reset()`), split in two since
the harness's engines outlive tests:

- `release_engine`, at every close: the dynamo bytecode hook of each compiled module
  (`TorchCompileWithNoGuardsWrapper.cleanup`: it holds the module, so the weights), dynamo's cache
  entry on the compiled forward (`remove_from_cache`, as vLLM does before each engine's first
  compile; its example inputs hold the weights too), then the worker's `shutdown()` (KV caches,
  forward context, RoPE cache, workspace manager, model);
- `release_process`, once no engine of this runtime is left: the process-wide rest, as vLLM's tests.
"""
from __future__ import annotations

from harness.kit.guard import cached_memory_returned


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
    cached_memory_returned()


def release_process() -> None:
    """The rest, once no engine is left (vLLM's tests/conftest.py: cleanup_fixture, dynamo_reset)."""
    import torch
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    torch._dynamo.reset()
    cached_memory_returned()
