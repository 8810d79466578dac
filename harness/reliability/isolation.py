"""What a test may not leave behind: the process-wide state a runtime can change, read before and
after each test that runs runtime code, put back where it can be, and reported as a failure of
the test that changed it.

Taint, precisely: a change that outlives the test, to state the whole process shares, that can
change what a later test computes or how it runs. Tracked here (docs/reliability.md has the
list with the reasons): the working directory, os.environ, whether the garbage collector is
enabled; and where torch is imported, its default dtype and device, grad and inference mode,
deterministic algorithms, the TF32, cuDNN and reduced-precision matmul flags, the float32 matmul
precision, the torch function and dispatch mode stacks, the global CPU RNG state, and where
CUDA is initialised the CUDA RNG states and the CUDA memory still allocated.

Not taint: state the harness owns and changes on purpose (the graph log's wrapper around
torch.cuda.CUDAGraph, engines the EngineFactory caches across tests and the memory they
hold), memory a closed engine still holds within what its runtime declares per build
(`memory_kept_per_build`, measured by the EngineFactory), Python's `random` module (hypothesis and other test plugins reseed and restore it),
and changes a test's own fixtures make and undo (monkeypatch).
"""
from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from harness.reliability.safe import describe_exception, safe_repr

UNSET = object()  # no known value: torch was imported during the test, and this one has no fixed default
MEMORY = "CUDA memory allocated"
CUDA_RNG = "torch CUDA RNG (torch.cuda.get_rng_state_all)"
CUDA_STATE = (MEMORY, CUDA_RNG)  # meaningless once the CUDA context is broken
MEMORY_TOLERANCE = 8 << 20  # bytes: allocator rounding and small first-use buffers are not a leak
# cuBLAS keeps a workspace for each stream a matmul ran on (32 MiB on a Hopper GPU), made by whichever
# test runs one there first. The harness must not free it to take a reading: a CUDA graph captured
# with a matmul goes on using its workspace, and where graphs share a memory pool across engines
# (vLLM's), a later capture is handed that memory and the old graph's replays overwrite it (illegal
# memory accesses on the H200). So one workspace's growth is allowed on top of the tolerance.
CUBLAS_WORKSPACE = 32 << 20
_released = 0  # bytes of CUDA memory the harness itself freed (cached engines it dropped)
# Bytes allocated during tests that are no test's: what the harness keeps for itself (harness_holds)
# and what closed engines keep within their runtime's declaration (runtime_kept).
_excused = 0


def cuda_allocated(torch) -> int:
    """CUDA memory allocated on every device (cuBLAS's workspaces included: see CUBLAS_WORKSPACE)."""
    return sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))


def harness_released(nbytes: int) -> None:
    """Memory the harness freed on purpose while a test ran (a session fixture finalised in the
    last test's teardown): counted as still held, so it cannot hide a leak of that test."""
    global _released
    _released += max(nbytes, 0)


def harness_holds(nbytes: int) -> None:
    """Memory the harness allocated for itself while a test ran (a model it keeps for the session,
    transformers' anchor): not the test's, so not counted against it."""
    _excuse(nbytes)


def runtime_kept(nbytes: int) -> None:
    """Memory engines closed during a test still hold, measured by the harness and no more than their
    runtime declares per build (Capabilities.memory_kept_per_build): not counted against the test.
    Anything above the declaration is still counted."""
    _excuse(nbytes)


def _excuse(nbytes: int) -> None:
    global _excused
    _excused += max(nbytes, 0)


@dataclass(frozen=True)
class Tracked:
    name: str
    read: Callable[[], Any]
    restore: Callable[[Any, Any], None] | None = None  # (before, after); None: cannot be put back
    same: Callable[[Any, Any], bool] = lambda before, after: before == after
    show: Callable[[Any, Any], str] = lambda before, after: f"{safe_repr(before, 200)} -> {safe_repr(after, 200)}"
    default: Any = UNSET  # the value a freshly imported torch has
    settle: Callable[[], None] | None = None  # before believing a difference: let it settle, read again


def snapshot() -> dict[str, Any]:
    return {t.name: _read(t) for t in tracked()}


def undo(before: dict[str, Any], keep: Callable[[str], bool] = lambda name: True) -> list[str]:
    """Compare the process with `before` (the state named where `keep` says so); put back what
    changed where possible. One line per change."""
    lines = []
    for t in tracked():
        if not keep(t.name):
            continue
        was = before.get(t.name, t.default)  # absent: torch was imported during the test
        if was is UNSET:
            continue
        now = _read(t)
        if _same(t, was, now):
            continue
        if t.settle is not None:
            try:
                t.settle()
            except Exception:  # noqa: BLE001 - compare what can be read
                pass
            now = _read(t)
            if _same(t, was, now):
                continue
        lines.append(f"{t.name}: {t.show(was, now)}{_put_back(t, was, now)}")
    return lines


def _read(t: Tracked):
    try:
        return t.read()
    except Exception as exc:  # noqa: BLE001 - a runtime can leave state that cannot even be read
        return f"<unreadable: {describe_exception(exc, 200)}>"


def _same(t: Tracked, before, after) -> bool:
    try:
        return bool(t.same(before, after))
    except Exception:  # noqa: BLE001 - one side unreadable
        return False


def _put_back(t: Tracked, before, after) -> str:
    if t.restore is None:
        return " (cannot be put back: later tests in this process run with it)"
    try:
        t.restore(before, after)
    except Exception as exc:  # noqa: BLE001
        return f" (putting it back failed: {describe_exception(exc, 200)})"
    return " (put back for the tests after it)"


# -- what is tracked ------------------------------------------------------------------------------
def tracked() -> list[Tracked]:
    torch = sys.modules.get("torch")
    return _PROCESS + (_torch_state(torch) if torch is not None else [])


def _cwd() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        return "<deleted>"


# Variables torch's compiler stack and its OpenMP runtime add on first use to record a default
# they computed (cache directories, toolchain paths, fork handling; KMP_INIT_AT_FORK was seen set
# on an H200 machine), and TEARDOWN_CUPTI, which the harness's profiler sets on first use
# (graphs/counting.py); any later test would get the same value, so adding them is not taint.
SET_ON_FIRST_USE = ("TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_", "TORCH_WARM_POOL", "KMP_DUPLICATE_LIB_OK",
                    "KMP_INIT_AT_FORK", "CUDA_HOME", "TEARDOWN_CUPTI")


def _environ() -> dict[str, str]:
    # PYTEST_CURRENT_TEST is pytest's own, set and cleared around every phase.
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def _without_first_use(before: dict, after: dict) -> dict:
    return {k: v for k, v in after.items() if k in before or not k.startswith(SET_ON_FIRST_USE)}


def _show_environ(before: dict, after: dict) -> str:
    after = _without_first_use(before, after)
    added = [f"{k}={safe_repr(after[k], 80)}" for k in sorted(after.keys() - before.keys())]
    removed = sorted(before.keys() - after.keys())
    changed = [f"{k}={safe_repr(before[k], 80)} -> {safe_repr(after[k], 80)}"
               for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
    parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else []) \
        + ([f"changed {', '.join(changed)}"] if changed else [])
    return "; ".join(parts)


def _restore_environ(before: dict, after: dict) -> None:
    for key in _without_first_use(before, after).keys() - before.keys():
        os.environ.pop(key, None)
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


_PROCESS = [
    Tracked("working directory", _cwd, restore=lambda before, after: os.chdir(before)),
    Tracked("os.environ", _environ, restore=_restore_environ, show=_show_environ,
            same=lambda before, after: before == _without_first_use(before, after)),
    Tracked("garbage collector enabled", gc.isenabled,
            restore=lambda before, after: gc.enable() if before else gc.disable()),
]


def _torch_state(torch) -> list[Tracked]:
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils import _python_dispatch
    from torch.utils._device import DeviceContext

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn

    def function_modes():  # the default device is a DeviceContext mode: reported as the default device
        return tuple(m for m in _get_current_function_mode_stack() if not isinstance(m, DeviceContext))

    def pop_extra(stack, pop):
        def restore(before, after):
            while stack() and stack()[-1] not in before:
                pop()
        return restore

    def names(before, after):
        listed = [", ".join(type(m).__qualname__ for m in modes) for modes in (before, after)]
        return f"[{listed[0]}] -> [{listed[1]}]"

    def _restore_deterministic(before, after):
        if "torch._inductor.config" in sys.modules:  # keep inductor's copy of the flag in step
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        else:  # nothing else holds it: no need to import inductor to put a flag back
            torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])

    def set_attr(owner, attr):
        return lambda before, after: setattr(owner, attr, before)

    def rng_changed(before, after):
        return ("its state changed: the test drew random numbers from the global generator (a runtime should "
                "use a torch.Generator of its own, or torch.random.fork_rng)")

    state = [
        Tracked("torch default dtype", torch.get_default_dtype, default=torch.float32,
                restore=lambda before, after: torch.set_default_dtype(before)),
        Tracked("torch default device", lambda: str(torch.get_default_device()), default="cpu",
                restore=lambda before, after: torch.set_default_device(None if before == "cpu" else before)),
        Tracked("torch grad mode (torch.is_grad_enabled)", torch.is_grad_enabled, default=True,
                restore=lambda before, after: torch.set_grad_enabled(before)),
        Tracked("torch inference mode (entered, never exited)", torch.is_inference_mode_enabled, default=False),
        Tracked("torch deterministic algorithms (enabled, warn_only)",
                lambda: (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()), default=(False, False),
                restore=_restore_deterministic),
        Tracked("torch.backends.cuda.matmul.allow_tf32", lambda: matmul.allow_tf32, default=False,
                restore=set_attr(matmul, "allow_tf32")),
        Tracked("torch.backends.cudnn.allow_tf32", lambda: cudnn.allow_tf32, default=True,
                restore=set_attr(cudnn, "allow_tf32")),
        Tracked("torch.backends.cudnn.benchmark", lambda: cudnn.benchmark, default=False,
                restore=set_attr(cudnn, "benchmark")),
        Tracked("torch.backends.cudnn.deterministic", lambda: cudnn.deterministic, default=False,
                restore=set_attr(cudnn, "deterministic")),
        Tracked("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                lambda: matmul.allow_fp16_reduced_precision_reduction, default=True,
                restore=set_attr(matmul, "allow_fp16_reduced_precision_reduction")),
        Tracked("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
                lambda: matmul.allow_bf16_reduced_precision_reduction, default=True,
                restore=set_attr(matmul, "allow_bf16_reduced_precision_reduction")),
        Tracked("torch float32 matmul precision", torch.get_float32_matmul_precision, default="highest",
                restore=lambda before, after: torch.set_float32_matmul_precision(before)),
        Tracked("torch function modes", function_modes, default=(), show=names,
                same=lambda before, after: [id(m) for m in before] == [id(m) for m in after],
                restore=pop_extra(function_modes, torch._C._pop_torch_function_stack)),
        Tracked("torch dispatch modes", lambda: tuple(_python_dispatch._get_current_dispatch_mode_stack()),
                default=(), show=names, same=lambda before, after: [id(m) for m in before] == [id(m) for m in after],
                restore=pop_extra(_python_dispatch._get_current_dispatch_mode_stack, _python_dispatch._pop_mode)),
        Tracked("torch global CPU RNG (torch.get_rng_state)", torch.get_rng_state, same=torch.equal, show=rng_changed,
                restore=lambda before, after: torch.set_rng_state(before)),
    ]
    if torch.cuda.is_initialized():
        def allocated():
            return cuda_allocated(torch) + _released - _excused

        def settle():
            gc.collect()
            torch.cuda.empty_cache()

        state += [
            Tracked(CUDA_RNG, torch.cuda.get_rng_state_all, show=rng_changed,
                    same=lambda before, after: len(before) == len(after) and all(map(torch.equal, before, after)),
                    restore=lambda before, after: torch.cuda.set_rng_state_all(before)),
            # default=0: a test that is the first to touch CUDA starts from an empty allocator, and
            # what it leaves allocated is measured from there (else a first-use leak went unseen).
            Tracked(MEMORY, allocated, settle=settle, default=0,
                    same=lambda before, after: after <= before + MEMORY_TOLERANCE + CUBLAS_WORKSPACE,
                    show=lambda before, after: f"{(after - before) / 2**20:.1f} MiB more than before the test, after "
                                               "gc.collect() and torch.cuda.empty_cache(): tensors it left alive"),
        ]
    return state
