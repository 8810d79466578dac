"""Hostile runtimes: each does, through the protocol, something a third-party runtime must not be
able to do to the harness (docs/reliability.md). tests/test_hostile_runtimes.py (sections 1-5) and
tests/test_hostile_processes.py (6-9: processes left running, a process that dies, hangs in every
step, answers of the wrong kind) run the harness against each and check that the run ends by
itself, fails what they did with a reason, and reports every test.

Each has one hostility per protocol operation, so a self-test picks the hostility by calling
that operation. Where one operation carries several (wrong answers, taint), the self-test names
the one it wants in `runtime.wrapped.pick` before calling it.
"""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile

from harness.expectations import presets
from harness import protocol as p

POLICY = dict(capture_sizes=True, dispatch=True, mode_resolution=True, data_parallel=True)


class Runtime:
    """The well-behaved part every hostile runtime shares: policy answers of the right form, and
    engines that run eager steps of zeros (enough for the harness to drive them)."""

    name, version = "hostile", "0"
    capabilities = p.Capabilities(**POLICY, execution=True, graph_backends=("emulated",))
    pick: str | None = None  # which hostility an operation with several shows next

    def capture_sizes(self, config):
        return [1, 2, 4, 8]

    def padded_size(self, config, num_real_tokens):
        return next((s for s in self.capture_sizes(config) if s >= num_real_tokens), None)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return p.Dispatch("NONE", p.Descriptor(num_real_tokens))

    def resolve_mode(self, request):
        return p.Resolution(request.mode, request.mode)

    def dp_dispatch(self, config, ranks):
        return [self.dispatch(config, r.num_real_tokens) for r in ranks]

    def build(self, config):
        return Engine(self, config)


class Engine:
    def __init__(self, runtime, config: p.EngineConfig):
        self.runtime, self.config = runtime, config
        self.resolution = p.Resolution(config.policy.mode, "NONE")
        self.vocab = presets.preset(config.preset).vocab
        if config.device.startswith("cuda"):  # what a KV cache holds on a GPU, for as long as the engine lives
            import torch

            self.kv_cache = torch.zeros(64 << 20, dtype=torch.uint8, device=config.device)

    def capture(self):
        return p.CaptureReport(graphs={}, seconds=0.0, memory_bytes=None)

    def step(self, requests, padding_fill=None):
        import torch

        n = sum(len(r.token_ids) for r in requests)
        return p.StepResult(torch.zeros(n, self.vocab, device=self.config.device), "NONE", n, n)

    def eager_step(self, requests, num_padded_tokens):
        return self.step(requests)

    def release(self, request_id):
        pass

    def static_buffer_addresses(self):
        return {}


# -- 1. exceptions the harness must turn into failures with a reason ----------------------------
class UnprintableError(Exception):
    def __str__(self):
        raise ValueError("this exception's message cannot be read")

    def __repr__(self):
        raise KeyboardInterrupt  # a raise that is not Ctrl-C


class BreaksTracebacks(Exception):
    """pytest's own traceback formatting raises on this one."""

    @property
    def __notes__(self):
        raise RuntimeError("__notes__ raised")


class RaisesFromDel:
    def __init__(self):
        self.cycle = self  # only the garbage collector frees it

    def __del__(self):
        raise UnprintableError()


class RaisesTheUnprintable(Runtime):
    """Every operation raises something the harness cannot print, or that looks like the end of the world."""

    name = "raises-the-unprintable"

    def device_description(self):  # read by the report's header and JSON
        raise UnprintableError()

    def capture_sizes(self, config):
        RaisesFromDel()  # garbage whose __del__ raises, for the collector after this test
        raise UnprintableError()

    def padded_size(self, config, num_real_tokens):
        raise RuntimeError("engine state:\n" + "x" * 10_000_000)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        raise SystemExit(3)

    def resolve_mode(self, request):
        raise KeyboardInterrupt("raised by the runtime")

    def dp_dispatch(self, config, ranks):
        raise BreaksTracebacks("ranks disagree")


# -- 2. answers of the wrong form --------------------------------------------------------------
WRONG_STEPS = {  # answers to a one-token step, each wrong in one way: (torch, vocab) -> answer
    "None": lambda torch, vocab: None,
    "tuple": lambda torch, vocab: (torch.ones(1, vocab), "NONE", 1, 1),
    "logits-wrong-shape": lambda torch, vocab: p.StepResult(torch.ones(3, 7), "NONE", 1, 1),
    "logits-int-dtype": lambda torch, vocab: p.StepResult(torch.ones(1, vocab, dtype=torch.int64), "NONE", 1, 1),
    "logits-on-meta": lambda torch, vocab: p.StepResult(torch.ones(1, vocab, device="meta"), "NONE", 1, 1),
    "mode-not-in-vocabulary": lambda torch, vocab: p.StepResult(torch.ones(1, vocab), "TURBO", 1, 1),
    "padded-negative": lambda torch, vocab: p.StepResult(torch.ones(1, vocab), "NONE", 1, -4),
    "padded-not-int": lambda torch, vocab: p.StepResult(torch.ones(1, vocab), "NONE", 1, 2.5),
    "attributes-raise": lambda torch, vocab: _AttributesRaise(),
}


class _AttributesRaise:
    def __getattr__(self, name):
        raise ZeroDivisionError(f"reading {name} divides by zero")
WRONG_POLICY = {  # operation -> answers it gives in turn
    "capture_sizes": {"None": None, "str": "1,2,4", "negative": [1, -2], "not-int": [1, 2.5]},
    "padded_size": {"negative": -3, "float": 8.0, "str": "8", "below-the-batch": 2},
    "dispatch": {"None": None, "tuple": ("FULL", 8), "mode-not-in-vocabulary": p.Dispatch("TURBO", p.Descriptor(8))},
    "resolve_mode": {"str": "FULL", "unknown-mode": p.Resolution("FULL", "FASTEST")},
    "dp_dispatch": {"wrong-count": []},
}
WRONG_CAPTURE = {"None": None, "missing-fields": type("Report", (), {"graphs": {"FULL": 1}})(),
                 "negative-count": p.CaptureReport(graphs={"FULL": -1}, seconds=0.0, memory_bytes=None)}
WRONG_ENGINE = ["build-None", "no-resolution", "addresses-None"]  # an engine that is not one, or half of one


class GivesWrongAnswers(Runtime):
    """Answers every operation with something of the wrong form, picked by `pick`."""

    name = "gives-wrong-answers"

    def _answer(self, operation):
        return WRONG_POLICY[operation][self.pick]

    def capture_sizes(self, config):
        return self._answer("capture_sizes")

    def padded_size(self, config, num_real_tokens):
        return self._answer("padded_size")

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        return self._answer("dispatch")

    def resolve_mode(self, request):
        return self._answer("resolve_mode")

    def dp_dispatch(self, config, ranks):
        return self._answer("dp_dispatch")

    def build(self, config):
        return None if self.pick == "build-None" else WrongEngine(self, config)


class WrongEngine(Engine):
    def __init__(self, runtime, config):
        super().__init__(runtime, config)
        if runtime.pick == "no-resolution":
            del self.resolution

    def static_buffer_addresses(self):
        return None if self.runtime.pick == "addresses-None" else {}

    def capture(self):
        return WRONG_CAPTURE[self.runtime.pick]

    def step(self, requests, padding_fill=None):
        import torch

        return WRONG_STEPS[self.runtime.pick](torch, self.vocab)


# -- 3. hangs where SIGALRM cannot reach ---------------------------------------------------------
def _deadlock(library) -> None:
    """Lock a default pthread mutex twice from one thread: the call never returns and no signal ends it."""
    mutex = ctypes.create_string_buffer(64)  # zeroed: a default mutex (pthread_mutex_t is 40 bytes on x86-64)
    library.pthread_mutex_lock(mutex)
    library.pthread_mutex_lock(mutex)


class HangsInNativeCode(Runtime):
    """Blocks for ever in a C call, as a step waiting on a wedged GPU does."""

    name = "hangs-in-native-code"

    def capture_sizes(self, config):
        _deadlock(ctypes.CDLL(None))  # releases the GIL, as blocking C calls and torch.cuda.synchronize() do

    def padded_size(self, config, num_real_tokens):
        _deadlock(ctypes.PyDLL(None))  # holds the GIL: no Python thread runs again


# -- 4. a message that only mentions CUDA -------------------------------------------------------
class MentionsCudaErrors(Runtime):
    """On a CPU-only run, raises errors whose text reads like a sticky CUDA error."""

    name = "mentions-cuda-errors"

    def build(self, config):
        return CudaWordsEngine(self, config)


class CudaWordsEngine(Engine):
    def step(self, requests, padding_fill=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated: no GPU is used)")


# -- on a GPU: a sticky error, and a hang in torch.cuda.synchronize() ----------------------------
CUDA = dict(execution=True, graph_backends=("cuda",))


class _Pointer:
    """A device pointer shown to torch through the CUDA array interface, with whatever length it claims."""

    def __init__(self, tensor, length: int):
        self.__cuda_array_interface__ = {"shape": (length,), "typestr": "<f4", "data": (tensor.data_ptr(), False),
                                         "version": 3, "strides": None}


class BreaksTheCudaContext(Runtime):
    """A step writes four terabytes past its buffer: an illegal memory access, which leaves the CUDA
    context unusable for the rest of the process (a sticky error)."""

    name = "breaks-the-cuda-context"
    capabilities = p.Capabilities(**POLICY, **CUDA)

    def build(self, config):
        return IllegalAccessEngine(self, config)


class IllegalAccessEngine(Engine):
    def step(self, requests, padding_fill=None):
        import torch

        buffer = torch.zeros(1, device=self.config.device)
        beyond = torch.as_tensor(_Pointer(buffer, 1 << 40), device=self.config.device)[-1:]
        beyond.add_(1)
        torch.cuda.synchronize()
        return super().step(requests)


class HangsInCudaSynchronize(Runtime):
    """A step launches a kernel that spins for decades and waits for it in torch.cuda.synchronize()."""

    name = "hangs-in-cuda-synchronize"
    capabilities = p.Capabilities(**POLICY, **CUDA)

    def build(self, config):
        return SpinningEngine(self, config)


class SpinningEngine(Engine):
    def step(self, requests, padding_fill=None):
        import torch

        torch.cuda._sleep(1 << 62)  # clock cycles
        torch.cuda.synchronize()


# -- 5. process-wide state changed and left so ---------------------------------------------------
def _taints():
    import torch
    from torch.overrides import TorchFunctionMode

    return {
        "default-dtype": lambda: torch.set_default_dtype(torch.float64),
        "default-device": lambda: torch.set_default_device("meta"),
        "grad-mode": lambda: torch.set_grad_enabled(False),
        # The switch underneath torch.use_deterministic_algorithms, as native code flips it; the Python
        # call would import torch._inductor, which an in-process self-test's sys.modules snapshot then drops.
        "deterministic": lambda: torch._C._set_deterministic_algorithms(True),
        "tf32": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
        "cpu-rng": lambda: torch.randn(3),
        "function-mode": lambda: TorchFunctionMode().__enter__(),
        "cwd": lambda: os.chdir(tempfile.gettempdir()),
        "environ": lambda: os.environ.__setitem__("HOSTILE_RUNTIME_WAS_HERE", "1"),
        "gc-disabled": gc.disable,
        "cuda-rng": lambda: torch.randn(3, device="cuda"),
        "cuda-memory": lambda: _LEAKED.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda")),
    }


_LEAKED = []  # what the cuda-memory taint keeps alive


TAINTS = ["default-dtype", "default-device", "grad-mode", "deterministic", "tf32", "cpu-rng", "function-mode", "cwd",
          "environ", "gc-disabled"]
CUDA_TAINTS = ["cuda-rng", "cuda-memory"]  # on a GPU only


class LeavesStateBehind(Runtime):
    """capture_sizes() changes the process-wide state named by `pick` and leaves it changed."""

    name = "leaves-state-behind"
    capabilities = p.Capabilities(**POLICY, execution=True, graph_backends=("emulated", "cuda"))

    def capture_sizes(self, config):
        _taints()[self.pick]()
        return super().capture_sizes(config)


# -- floods and exhaustion ----------------------------------------------------------------------
def _flood() -> None:
    line = "flood " * 20 + "\n"
    sys.stdout.write(line * 40_000)  # about 5 MB each
    sys.stderr.write(line * 40_000)


class FloodsOutput(Runtime):
    """Prints megabytes to stdout and stderr."""

    name = "floods-output"

    def capture_sizes(self, config):
        _flood()
        raise RuntimeError("failed after flooding the output")

    def padded_size(self, config, num_real_tokens):
        _flood()
        return 8


class ExhaustsMemory(Runtime):
    """Allocates until the process has no memory left. Run it only under a memory limit (RLIMIT_AS)."""

    name = "exhausts-memory"

    def capture_sizes(self, config):
        held = []
        while True:
            held.append(bytearray(64 << 20))


# -- 6. processes left running -------------------------------------------------------------------
def _sleeper(*, daemon: bool = False) -> None:
    """A `sleep 120` the caller never stops; as a daemon (its own session, its parent gone) it is
    re-parented, as a service a runtime starts would be."""
    import subprocess

    if daemon:
        subprocess.run(["sh", "-c", "setsid sleep 120 </dev/null >/dev/null 2>&1 &"], check=True)
    else:
        subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


class LeavesProcessesRunning(Runtime):
    """build() starts a child process and never stops it; capture_sizes() starts a daemon."""

    name = "leaves-processes-running"

    def capture_sizes(self, config):
        _sleeper(daemon=True)
        return super().capture_sizes(config)

    def build(self, config):
        _sleeper()
        return super().build(config)


class KeepsAWorkerPool(Runtime):
    """Keeps one helper process for the whole session, as an engine's worker pool does, and declares
    it (helper_processes()); with `pick = "lies"` it declares init's pid, which it did not start."""

    name = "keeps-a-worker-pool"
    pool = None

    def build(self, config):
        import subprocess

        if self.pool is None:
            self.pool = subprocess.Popen(["sh", "-c", "sleep 120 & wait"], stdin=subprocess.DEVNULL)
        return super().build(config)

    def helper_processes(self):
        return [1] if self.pick == "lies" else [self.pool.pid] if self.pool else []


# -- 7. a process that dies ------------------------------------------------------------------------
DEATHS = {  # how capture_sizes() ends its own process, picked by `pick`
    "SIGSEGV": lambda: ctypes.string_at(0),  # a read through a null pointer, as a native crash
    "SIGABRT": os.abort,
    "SIGKILL": lambda: os.kill(os.getpid(), 9),
    "os._exit(0)": lambda: os._exit(0),
}


class DiesBySignal(Runtime):
    """capture_sizes() says something, then ends its process as `pick` says."""

    name = "dies-by-signal"

    def capture_sizes(self, config):
        print(f"about to die by {self.pick}", flush=True)
        sys.stderr.write("the runtime's last words\n")
        sys.stderr.flush()
        DEATHS[self.pick or "SIGSEGV"]()


# -- 8. hangs SIGALRM can end, in every step or once ----------------------------------------------
class HangsInEveryStep(Runtime):
    """Every step sleeps for an hour: SIGALRM ends each, and after two the rest are skipped."""

    name = "hangs-in-every-step"
    hangs = 10 ** 9  # steps that hang before the engine recovers

    def build(self, config):
        return HangingEngine(self, config)


class HangsOnce(HangsInEveryStep):
    """The first step hangs, every later one is fine: the run recovers and runs the rest."""

    name = "hangs-once"
    hangs = 1


class HangingEngine(Engine):
    def step(self, requests, padding_fill=None):
        import time

        if self.runtime.hangs > 0:
            self.runtime.hangs -= 1
            time.sleep(3600)
        return super().step(requests)


# -- 9. answers of the right form and the wrong kind -----------------------------------------------
WRONG_KINDS = ["bfloat16-steps", "nan-logits", "kv-changes-shape", "float-step-inputs"]


class ReturnsWrongKinds(Runtime):
    """Answers shaped right but of the wrong kind, picked by `pick`: bfloat16 logits from step()
    where eager_step() gives float32 (the engine was built float32), NaN logits, a KV snapshot that
    changes shape, floating-point step inputs."""

    name = "returns-wrong-kinds"
    capabilities = p.Capabilities(**POLICY, execution=True, graph_backends=("emulated",), kv_inspection=True,
                                  input_inspection=True)

    def build(self, config):
        return WrongKindEngine(self, config)


class WrongKindEngine(Engine):
    snapshots = 0

    def step(self, requests, padding_fill=None):
        result = super().step(requests)
        if self.runtime.pick == "bfloat16-steps":
            result.logits = result.logits.bfloat16()
        if self.runtime.pick == "nan-logits":
            result.logits[-1, 3] = float("nan")
        return result

    def eager_step(self, requests, num_padded_tokens):
        return super().step(requests)

    def kv_snapshot(self):
        import torch

        self.snapshots += 1
        shape = (16, 4) if self.runtime.pick != "kv-changes-shape" or self.snapshots == 1 else (8, 4)
        return torch.zeros(shape)

    def slot_of(self, request_id, position):
        return 0

    def last_step_inputs(self):
        import torch

        dtype = torch.float32 if self.runtime.pick == "float-step-inputs" else torch.long
        return p.StepInputs(*(torch.zeros(1, dtype=dtype) for _ in range(3)))
