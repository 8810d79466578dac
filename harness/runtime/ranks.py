"""Data-parallel ranks in processes of their own: the harness starts them, joins them in one
torch.distributed group, builds each rank's engine through the protocol, sends every rank its
batch of a step and observes what each ran. It never takes part in the ranks' consensus.

- `pool(world, graph_backend)` gives a live `RankPool`: gloo ranks on the CPU (the graph
  emulator), or NCCL ranks with one GPU each (`cuda:{rank}`; NVLink multicast off). Pools
  live as long as the process that started them, so engines built once serve every test of a
  session; a pool that failed is replaced by a fresh one on the next call.
- `RankPool.build(runtime, config)` builds and captures `runtime.build(EngineConfig(...,
  data_parallel=(rank, world), device=...))` in every rank; `RankPool.step(...)` runs one step.
- Every wait is bounded. A rank that hangs (it waits in a collective another rank skipped),
  raises or dies fails the call with a `RankFailure` naming the step and each rank's batch, and
  the pool's processes are killed.

In a rank, around `engine.step(batch)`, the harness counts graph launches itself (graphs.log),
snapshots the KV cache (kv_inspection), and runs `engine.eager_step(batch, padded)`, which
must not communicate: the expected logits come from the rank's own eager step.
"""
from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import pickle
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import wait

from harness.expectations import expected, kv, presets
from harness.session import machine
from harness.scenarios.batches import describe_batch
from harness.reliability import processes
from harness.reliability.processes import harness_owned
from harness.runtime import validate
from harness.reliability.safe import safe_str

# A step takes milliseconds on the emulator or a GPU; one that waits on a collective another rank
# skipped never ends. The self-tests lower this to make a hang cheap.
STEP_TIMEOUT_S = 15.0
START_TIMEOUT_S = 240.0  # a rank imports torch and joins the process group
BUILD_TIMEOUT_S = 300.0  # build() and capture() in every rank
MAX_ENGINES = 8  # engines a pool keeps built; the oldest goes first
OWNER = "the data-parallel rank pool"  # what harness.reliability.processes calls the pools' processes
# How ranks start: a parent that initialised CUDA cannot fork, so GPU ranks are spawned; CPU ranks
# fork from a server that imported torch once.
START_METHODS = {"gloo": "forkserver", "nccl": "spawn"}
# Imported once in the CPU lane's fork server, so a rank starts in milliseconds instead of seconds:
# what every rank needs before it builds an engine.
PRELOAD = ("torch", "torch.distributed", "safetensors.torch")


class RankFailure(Exception):
    """Ranks that hung, raised or died: `what` in one line, `ranks` one line per rank."""

    def __init__(self, what: str, ranks: dict[str, str]):
        self.what, self.ranks = what, ranks
        super().__init__(self.describe(what))

    def describe(self, first_line: str) -> str:
        return first_line + "".join(f"\n    {name}: {text}" for name, text in self.ranks.items())


@dataclass
class RankStep:
    """What one rank ran in one step, as the harness saw it in that rank's process."""

    rank: int
    requests: list
    runtime_mode: str
    num_real_tokens: int
    num_padded_tokens: int
    logits: object  # [num_real_tokens, vocab] on the CPU
    eager_logits: object | None  # eager_step at num_padded_tokens; None for an idle rank
    graph_launches: int  # replays the harness counted during step()
    stray_kv_slots: list[int] | None  # slots that changed outside the real tokens' slots; None: no kv_inspection
    problem: str | None = None  # what broke the protocol (the step's result, or its eager step)


@dataclass(frozen=True)
class BuiltEngine:
    key: bytes
    resolved: str  # the config mode rank 0's engine resolved at build time
    pieces_per_size: int | None  # PIECEWISE graphs a step launches (rank 0's capture report); None: unknown


def describe_rank_batch(requests) -> str:
    return describe_batch(requests) if requests else "idle (no requests)"


# -- the parent's side ----------------------------------------------------------------------------
class RankPool:
    def __init__(self, world: int, graph_backend: str):
        self.world, self.graph_backend = world, graph_backend
        self.backend = "nccl" if graph_backend == "cuda" else "gloo"
        self.alive = False
        self.engines: dict[bytes, BuiltEngine] = {}
        self.processes, self.connections = [], []
        with harness_owned(OWNER):  # its processes, and the fork server the first pool starts
            self._start()

    def _start(self) -> None:
        if self.backend == "nccl":
            import torch

            if torch.cuda.device_count() < self.world:
                raise RankFailure(f"{self.world} NCCL ranks need {self.world} GPUs, and torch sees "
                                  f"{torch.cuda.device_count()}", {})
        context = multiprocessing.get_context(START_METHODS[self.backend])
        if START_METHODS[self.backend] == "forkserver":
            context.set_forkserver_preload(list(PRELOAD))  # only the fork server's first start reads it
        port = machine.free_port()
        for rank in range(self.world):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_rank_main, args=(rank, self.world, self.backend, port, child_end),
                                      name=f"data-parallel-rank-{rank}", daemon=True)
            process.start()
            child_end.close()
            self.processes.append(process)
            self.connections.append(parent_end)
        self.alive = True
        self._gather("starting the ranks (import, init_process_group, a barrier)", START_TIMEOUT_S,
                     {f"rank {r}": f"joining a {self.backend} group of {self.world}" for r in range(self.world)})

    def build(self, runtime, config) -> BuiltEngine:
        """Every rank builds and captures the engine (once per pool for a runtime and config)."""
        try:
            key = pickle.dumps((runtime, config))
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
            raise RankFailure(f"each rank builds its engine from the runtime object, which must pickle (a "
                              f"module-level class): {type(exc).__name__}: {exc}", {}) from None
        if key in self.engines:
            return self.engines[key]
        if len(self.engines) >= MAX_ENGINES:
            oldest = next(iter(self.engines))
            self._call(("drop", oldest), "dropping an engine", START_TIMEOUT_S)
            del self.engines[oldest]
        replies = self._call(("build", key, runtime, config), f"building and capturing {config.policy.mode} engines",
                             BUILD_TIMEOUT_S)
        built = BuiltEngine(key, replies[0]["resolved"], replies[0]["pieces_per_size"])
        self.engines[key] = built
        return built

    def step(self, engine: BuiltEngine, index: int, batches: list[list], kv_inspection: bool) -> list[RankStep]:
        """Rank r runs batches[r] (an empty list: idle). Raises RankFailure naming the step."""
        if len(batches) != self.world:
            raise ValueError(f"a step needs one batch per rank ({self.world}), got {len(batches)}")
        for connection, batch in zip(self.connections, batches):
            connection.send(("step", engine.key, list(batch), kv_inspection))
        replies = self._gather(f"step {index}", STEP_TIMEOUT_S,
                               {f"rank {r}": describe_rank_batch(b) for r, b in enumerate(batches)})
        return [RankStep(rank=r, requests=list(b), **_unpacked(reply)) for r, (b, reply) in
                enumerate(zip(batches, replies))]

    def release(self, engine: BuiltEngine, request_ids: list[set[int]]) -> None:
        """Forget requests in each rank's engine (rank r: request_ids[r])."""
        for connection, ids in zip(self.connections, request_ids):
            connection.send(("release", engine.key, sorted(ids)))
        self._gather("releasing requests", STEP_TIMEOUT_S, {f"rank {r}": f"releasing {sorted(ids)}"
                                                             for r, ids in enumerate(request_ids)})

    def _call(self, message, what: str, timeout: float) -> list:
        for connection in self.connections:
            connection.send(message)
        return self._gather(what, timeout, {f"rank {r}": what for r in range(self.world)})

    def _gather(self, what: str, timeout: float, doing: dict[str, str]) -> list:
        """One reply from every rank before the deadline, else kill them all and raise."""
        replies: dict[int, object] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        waiting = {connection: rank for rank, connection in enumerate(self.connections)}
        while waiting and (left := deadline - time.monotonic()) > 0:
            for ready in wait([*waiting, *(self.processes[r].sentinel for r in waiting.values())], timeout=left):
                if ready in waiting:
                    rank = waiting.pop(ready)
                    try:
                        status, value = ready.recv()
                    except (EOFError, OSError):
                        self.processes[rank].join(timeout=1)
                        errors[rank] = f"the process died (exit code {self.processes[rank].exitcode})"
                        continue
                    if status == "ok":
                        replies[rank] = value
                    else:
                        errors[rank] = f"raised: {_last_lines(value)}"
            for connection, rank in list(waiting.items()):
                if not self.processes[rank].is_alive() and not connection.poll():
                    errors[rank] = f"the process died (exit code {self.processes[rank].exitcode})"
                    del waiting[connection]
        if not waiting and not errors:
            return [replies[r] for r in range(self.world)]
        self.close(kill=True)
        ranks = {}
        for rank in range(self.world):
            name = f"rank {rank}"
            if rank in errors:
                outcome = errors[rank]
            elif rank in replies:
                outcome = "answered" + (f": ran {_ran(replies[rank])}" if _ran(replies[rank]) else "")
            else:
                outcome = (f"no answer within {timeout:g} s (waiting in a collective another rank skipped, "
                           "or deadlocked)")
            ranks[name] = f"{doing.get(name, '')} -> {outcome}"
        silent = [r for r in range(self.world) if r not in replies and r not in errors]
        summary = (f"{len(silent)} of {self.world} ranks did not finish within {timeout:g} s" if silent
                   else f"{len(errors)} of {self.world} ranks failed")
        raise RankFailure(f"{what}: {summary}; the rank processes were killed", ranks)

    def close(self, kill: bool = False) -> None:
        if not kill and self.alive:
            for connection in self.connections:
                try:
                    connection.send(("close",))
                except OSError:
                    pass
            for process in self.processes:
                process.join(timeout=5)
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for connection in self.connections:
            connection.close()
        self.alive = False


_POOLS: dict[tuple[int, str], RankPool] = {}


def pool(world: int, graph_backend: str) -> RankPool:
    """A live pool of `world` ranks for a graph backend: the one already running, else a new one."""
    current = _POOLS.get((world, graph_backend))
    if current is not None and current.alive and not all(p.is_alive() for p in current.processes):
        current.close(kill=True)  # a rank ended outside the pool (a session's end reaped it): start afresh
    if current is None or not current.alive:
        current = _POOLS[(world, graph_backend)] = RankPool(world, graph_backend)
    return current


def world_size(graph_backend: str) -> int:
    """Two ranks; on GPUs, one per device up to four, where there are more than two."""
    if graph_backend != "cuda":
        return 2
    import torch

    return max(2, min(4, torch.cuda.device_count()))


@atexit.register
def close_all() -> None:
    """At exit: each pool's ranks, then a SIGTERM for the fork server, which would otherwise end
    after this process by its own interpreter's teardown (it imported torch), a wait the session's
    end pays. multiprocessing's resource tracker ignores SIGTERM and ends once its users have gone."""
    for current in _POOLS.values():
        current.close()
    _POOLS.clear()
    processes.terminate(processes.owned(OWNER))


def _last_lines(text: str, lines: int = 3) -> str:
    return safe_str(" | ".join(line.strip() for line in str(text).strip().splitlines()[-lines:]), limit=600)


def _ran(reply) -> str:
    if isinstance(reply, dict) and "runtime_mode" in reply:
        return f"{reply['runtime_mode']} at {reply['num_padded_tokens']}"
    return ""


def _unpacked(reply: dict) -> dict:
    return {**reply, "logits": _tensor(reply["logits"]), "eager_logits": _tensor(reply["eager_logits"])}


def _packed(tensor) -> bytes | None:
    # Bytes rather than tensors through the pipe: torch would share their memory across processes.
    if tensor is None:
        return None
    import torch

    buffer = io.BytesIO()
    torch.save(tensor.detach().to("cpu").clone(), buffer)
    return buffer.getvalue()


def _tensor(data: bytes | None):
    if data is None:
        return None
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


# -- a rank's side --------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, backend: str, port: int, connection) -> None:
    """A rank's loop: join the group, then answer the parent's messages until it closes."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (NVLS)
    try:
        device = _join(rank, world, backend, port)
    except BaseException:  # noqa: BLE001 - the parent must hear why, whatever it was
        connection.send(("error", traceback.format_exc()))
        return
    connection.send(("ok", None))
    engines: dict[bytes, tuple] = {}
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone
            return
        if message[0] == "close":
            break
        try:
            reply = ("ok", _HANDLERS[message[0]](engines, rank, world, device, *message[1:]))
        except Exception:  # noqa: BLE001 - a runtime's failure is reported, the rank stays up
            reply = ("error", traceback.format_exc())
        connection.send(reply)
    import torch.distributed as dist

    dist.destroy_process_group()


def _join(rank: int, world: int, backend: str, port: int) -> str:
    import torch.distributed as dist

    machine.share("cuda" if backend == "nccl" else "emulated", rank)  # a GPU, or one CPU thread, a rank
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    # The group's own timeout outlasts the harness's: the harness names the hang first.
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(START_TIMEOUT_S, 4 * STEP_TIMEOUT_S)))
    dist.barrier(**({"device_ids": [rank]} if backend == "nccl" else {}))  # every rank is in; NCCL sets up here
    return device


def _build(engines, rank, world, device, key, runtime, config) -> dict:
    engine = runtime.build(replace(config, device=device, data_parallel=(rank, world)))
    report = engine.capture()
    problem = validate.capture_report(report) or validate.resolution(engine.resolution)
    if problem:
        raise ValueError(f"the engine's capture() or resolution {problem}")
    engines[key] = (engine, presets.preset(config.preset).vocab)
    return {"resolved": engine.resolution.resolved, "pieces_per_size": expected.pieces_per_size(report)}


def _drop(engines, rank, world, device, key) -> None:
    engines.pop(key, None)


def _step(engines, rank, world, device, key, requests, kv_inspection) -> dict:
    from harness.graphs.log import LOG  # torch: a rank process has it preloaded, the pool's process never imports it

    engine, vocab = engines[key]
    before = engine.kv_snapshot() if kv_inspection else None
    seen = LOG.snapshot()
    result = engine.step(requests)
    launches = LOG.since(seen).replays
    n = sum(len(r.token_ids) for r in requests)
    problem = validate.step_result(result, n, vocab, device)
    if problem:
        return {"runtime_mode": "?", "num_real_tokens": n, "num_padded_tokens": 0, "logits": None, "eager_logits": None,
                "graph_launches": launches, "stray_kv_slots": None, "problem": f"the engine's step() {problem}"}
    stray = None
    if kv_inspection:
        stray = kv.stray_slots(engine, requests, before, engine.kv_snapshot())
    eager, eager_problem = None, None
    if requests:
        seen = LOG.snapshot()
        eager = engine.eager_step(requests, result.num_padded_tokens)
        eager_problem = validate.step_result(eager, n, vocab, device)
        if not eager_problem:
            eager_problem = expected.eager_step_problem(eager.runtime_mode, eager.num_padded_tokens,
                                                        result.num_padded_tokens, LOG.since(seen).replays)
    return {"runtime_mode": result.runtime_mode, "num_real_tokens": result.num_real_tokens,
            "num_padded_tokens": result.num_padded_tokens, "logits": _packed(result.logits),
            "eager_logits": _packed(eager.logits) if eager is not None else None, "graph_launches": launches,
            "stray_kv_slots": stray,
            "problem": f"the engine's {eager_problem}" if eager_problem else None}


def _release(engines, rank, world, device, key, request_ids) -> None:
    engine, _ = engines[key]
    for request_id in request_ids:
        engine.release(request_id)


_HANDLERS = {"build": _build, "drop": _drop, "step": _step, "release": _release}
