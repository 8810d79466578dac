"""The smoke driver for a runtime that drives a real engine: engines built through the factory the
suites use (harness.runtime.factory.EngineFactory: the same configs, so the compile caches it
leaves are the suites' too), captured, driven through the shared generation scenario
(harness.scenarios.generation), released and closed. It prints SMOKE lines: each engine's build
and capture, per step the mode and padded size the engine ran, the graph launches the harness
counted, what the runtime's own policy says, the largest difference from transformers' forward
over the same checkpoint and from an eager step of the same engine at the same shape; on CUDA,
the memory each closed build left allocated.

    python -m harness.smoke --runtime NAME [--modes NONE,FULL,...] [--presets small,tiny]
        [--graph-backend cuda] [--live PATH] [--keep-first-open]

Numbers are reported, not judged (the suites judge); the exit status is 0 when every engine built
and ran. The first preset runs every mode, the others only the first graph mode.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
import weakref
from dataclasses import replace

from harness.expectations import presets
from harness.expectations.anchor import Anchor
from harness.graphs.log import LOG, watch_cuda_graphs
from harness.protocol import CONFIG_MODES, Request
from harness.runtime.factory import EngineFactory
from harness.runtime.registry import RuntimeLoadError, resolve
from harness.scenarios.batches import prompt
from harness.scenarios.generation import generation

MiB = 1 << 20
# Three prompts, decode steps, a request joining a decode batch (a mixed step), more decode steps.
JOINS = {0: [(1, 5), (2, 11), (3, 3)], 4: [(4, 2)]}
STEPS = 6


class Log:
    """SMOKE lines on stdout and, with a path, the same stages appended as JSON lines."""

    def __init__(self, path: str | None = None):
        self.path = path

    def __call__(self, stage: str, text: str, **data) -> None:
        print("SMOKE", text, flush=True)
        if self.path:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"time": time.strftime("%H:%M:%S"), "stage": stage, **data}, default=str) + "\n")


def drive(runtime, modes, preset_names=("small",), *, graph_backend: str = "cuda", log: Log | None = None,
          joins=None, steps: int | None = None, keep_first_open: bool = False, step_details=None) -> list[str]:
    """Every mode on the first preset, the first graph mode on the others; the engines that failed."""
    log = log or Log()
    failed, kept, shared = [], [], None
    for number, preset in enumerate(preset_names):
        anchor = Anchor(str(presets.checkpoint(preset)), device=_device(graph_backend))
        chosen = list(modes) if number == 0 else [m for m in modes if m != "NONE"][:1]
        for index, mode in enumerate(chosen):
            # With keep_first_open the first engine stays open, as the suites' shared engines do, so
            # that the others close the way a test's own engines close beside it; it is closed last.
            keep = keep_first_open and number == 0 and index == 0 and len(chosen) > 1
            try:
                opened = run_mode(runtime, anchor, preset, mode, graph_backend, log, joins or JOINS,
                                  steps or STEPS, step_details)
                if keep:
                    shared = opened
                else:
                    kept.append(close_and_measure(opened, f"preset={preset} mode={mode}", log))
            except Exception as exc:
                failed.append(f"{preset}/{mode}")
                log("failed", f"preset={preset} mode={mode} FAILED: {type(exc).__name__}: {exc}", preset=preset,
                    mode=mode, traceback=traceback.format_exc())
                print(traceback.format_exc(), flush=True)
        del anchor
    if shared is not None:
        kept.append(close_and_measure(shared, f"preset={preset_names[0]} mode={modes[0]} (kept open, closed last)", log))
    declared = runtime.capabilities.memory_kept_per_build
    if graph_backend == "cuda":
        log("memory", f"memory kept per build after close(): {[round(k / MiB, 1) for k in kept]} MiB (declared: "
            f"{(declared or 0) / MiB:.1f} MiB)", kept=kept)
    return failed


def engine_config(runtime, mode: str, preset: str = "small", graph_backend: str = "cuda"):
    """The config the suites' engine factory makes for this mode and preset, so that the smoke stage
    fills the compile caches the suites then hit."""
    return EngineFactory(runtime, graph_backend, preset=preset).config(mode=mode)


def capture_counted(engine):
    """engine.capture(), and the captures the harness's own graph counter saw during it (the
    counter watches torch's CUDA graphs once watch_cuda_graphs() ran)."""
    before = LOG.snapshot()
    report = engine.capture()
    return report, LOG.since(before).captures


def step_counted(engine, requests):
    """engine.step(requests), and the graph launches the harness's counter saw during it."""
    before = LOG.snapshot()
    out = engine.step(requests)
    return out, LOG.since(before).replays


def _device(graph_backend: str) -> str:
    return "cuda" if graph_backend == "cuda" else "cpu"


def run_mode(runtime, anchor, preset, mode, graph_backend, log, joins, steps, step_details):
    """Build, capture and drive one engine; (engine, memory allocated before, the model if known)."""
    before = _allocated(graph_backend)
    config = engine_config(runtime, mode, preset, graph_backend)
    where = f"preset={preset} mode={mode}"
    started = time.perf_counter()
    engine = runtime.build(config)
    live = engine.describe() if hasattr(engine, "describe") else {}
    log("build", f"{where} built in {time.perf_counter() - started:.1f}s: {live}", preset=preset, mode=mode,
        seconds=time.perf_counter() - started, live=live, resolution=engine.resolution)
    model = getattr(getattr(engine, "runner", None), "model", None)
    opened = (engine, before, weakref.ref(model) if model is not None else None)
    try:
        drive_engine(runtime, anchor, engine, config, where, log, joins, steps, step_details)
    except BaseException:
        close_and_measure(opened, f"{where} (failed)", log)
        raise
    return opened


def drive_engine(runtime, anchor, engine, config, where, log, joins, steps, step_details=None) -> None:
    import torch

    resolved = engine.resolution.resolved
    if resolved != "NONE":
        report, captures = capture_counted(engine)
        log("capture", f"{where} capture: the engine counted {dict(report.graphs)}, the harness saw {captures} "
            f"captures; {report.seconds:.2f}s, {report.memory_bytes / MiB:.1f} MiB; order {list(report.order)}",
            report=report, harness_captures=captures)
    policy = replace(config.policy, mode=resolved)
    launches: list[int] = []

    def counted_step(requests):
        out, launched = step_counted(engine, requests)
        launches.append(launched)
        return out

    worst, equal, ran = 0.0, 0, []
    for number, (requests, out, expected) in enumerate(generation(engine, anchor, joins, steps=steps,
                                                                  step=counted_step)):
        num_real_tokens = sum(len(r.token_ids) for r in requests)
        uniform = all(len(r.token_ids) == 1 for r in requests)
        difference = float((out.logits.float().cpu() - expected).abs().max())
        details = step_details(engine, out) if step_details else {}
        eager = engine.eager_step(requests, out.num_padded_tokens)
        same = torch.equal(out.logits, eager.logits)
        eager_difference = float((out.logits.double() - eager.logits.double()).abs().max())
        own = runtime.dispatch(policy, num_real_tokens, len(requests), uniform)
        worst, equal = max(worst, difference), equal + same
        ran.append(f"{out.runtime_mode}@{out.num_padded_tokens}")
        said = "".join(f" {key}={value}" for key, value in details.items() if not key.startswith("_"))
        details = {key.lstrip("_"): value for key, value in details.items()}  # "_name": in the JSON line only
        log("step", f"{where} step={number}: {len(requests)} requests, {num_real_tokens} tokens -> ran "
            f"{out.runtime_mode} at {out.num_padded_tokens} (own policy: {own.runtime_mode} at "
            f"{own.descriptor.num_padded_tokens});{said} graph launches {launches[-1]}; |logits - transformers| max "
            f"{difference:.3g}; eager at the same shape: {'bit-equal' if same else f'differs, max {eager_difference:.3g}'}",
            step=number, requests=len(requests), tokens=num_real_tokens, ran=(out.runtime_mode, out.num_padded_tokens),
            own=(own.runtime_mode, own.descriptor.num_padded_tokens), launches=launches[-1], anchor_difference=difference,
            eager_equal=same, eager_difference=eager_difference, **details)
    tolerance = anchor.tolerance(runtime.capabilities.precision, config.preset)
    log("summary", f"{where} summary: ran {ran}; largest difference from transformers {worst:.3g} (the anchor's "
        f"tolerance for declared precision {tolerance.precision!r}: {tolerance.value:.3g}); eager bit-equal in "
        f"{equal}/{len(ran)} steps", anchor_difference=worst, eager_equal_steps=equal, steps=len(ran))


def _allocated(graph_backend: str) -> int:
    if graph_backend != "cuda":
        return 0
    import torch

    gc.collect()
    return torch.cuda.memory_allocated()


def close_and_measure(opened, label: str, log: Log) -> int:
    """Close the engine; on CUDA, the memory it left allocated (and what holds its model, if alive)."""
    engine, before, model = opened
    if hasattr(engine, "close"):  # optional in the protocol
        engine.close()
    del engine, opened
    gc.collect()
    if not before and model is None:
        return 0
    import torch

    if not torch.cuda.is_available():
        return 0
    torch.cuda.empty_cache()
    kept = torch.cuda.memory_allocated() - before
    alive = model is not None and model() is not None
    log("memory", f"memory {label}: {before / MiB:.1f} MiB allocated before the build, {kept / MiB:+.1f} MiB after "
        f"close(); the model {'is still alive' if alive else 'was freed'}", kept=kept)
    if alive:  # what holds it: the first referrers, for the next run to fix
        for holder in gc.get_referrers(model())[:6]:
            log("memory", f"  model held by {type(holder).__module__}.{type(holder).__qualname__}")
    return kept


def stage(log: Log, label: str, run) -> list[str]:
    """A smoke stage of a plugin's own: [] where `run()` returns, [label] (and the traceback) where it raises."""
    try:
        run()
        return []
    except Exception:
        log("failed", f"{label} FAILED", label=label, traceback=traceback.format_exc())
        print(traceback.format_exc(), flush=True)
        return [label]


def verify_steps(runtime, anchor, config, log: Log, label: str, said=None) -> None:
    """Verify steps on an engine built from `config` (k = its num_speculative_tokens): three prompts,
    then steps of q = k + 1 tokens a request, each its last sampled token and k drafts: drafts
    transformers' greedy decoding accepts, drafts it rejects, accepted ones again. Each step's
    logits against transformers' and an eager step of the same shape; `said(engine)`: what the
    engine itself reports of the step (the drafts its sampler accepted)."""
    import torch

    k = config.policy.num_speculative_tokens
    engine = runtime.build(config)
    try:
        log("verify", f"{label} built: {engine.describe() if hasattr(engine, 'describe') else {}}")
        engine.capture()
        history = {i: list(prompt(i, n)) for i, n in ((1, 6), (2, 9), (3, 4))}
        requests = [Request(i, tuple(t), 0) for i, t in history.items()]
        expected = anchor.step(requests, {})
        vocab = expected.shape[-1]
        engine.step(requests)
        nxt, row = {}, 0
        for r in requests:
            row += len(r.token_ids)
            nxt[r.request_id] = int(expected[row - 1].argmax())
        for number, accept in enumerate((True, False, True)):
            requests = []
            for i, tokens in history.items():
                drafts = greedy_drafts(anchor, tokens + [nxt[i]], k) if accept else [(nxt[i] + 7 + j) % vocab for j in range(k)]
                requests.append(Request(i, tuple([nxt[i]] + drafts), len(tokens)))
            want = anchor.step(requests, {i: list(t) for i, t in history.items()})
            out, launches = step_counted(engine, requests)
            diff = float((out.logits.float().cpu() - want).abs().max())
            eager = engine.eager_step(requests, out.num_padded_tokens)
            same = torch.equal(out.logits, eager.logits)
            own = runtime.dispatch(config.policy, out.num_real_tokens, len(requests), True)
            log("verify", f"{label} verify step {number} ({'drafts transformers accepts' if accept else 'drafts to reject'}): "
                f"{out.num_real_tokens} tokens -> ran {out.runtime_mode} at {out.num_padded_tokens} (own policy: "
                f"{own.runtime_mode} at {own.descriptor.num_padded_tokens}); graph launches {launches}; |logits - "
                f"transformers| max {diff:.3g}; eager bit-equal {same}{said(engine) if said else ''}")
            row = 0
            for r in requests:  # the next step starts after all q tokens (the harness rewrites rejected KV)
                history[r.request_id] += list(r.token_ids)
                row += len(r.token_ids)
                nxt[r.request_id] = int(want[row - 1].argmax())
        for i in history:
            engine.release(i)
    finally:
        if hasattr(engine, "close"):
            engine.close()


def greedy_drafts(anchor, tokens: list[int], k: int) -> list[int]:
    """k tokens transformers' greedy decoding would produce after `tokens` (drafts an engine should accept)."""
    drafts, current = [], list(tokens)
    for _ in range(k):
        logits = anchor.step([Request(0, tuple(current), 0)], {})
        current.append(int(logits[-1].argmax()))
        drafts.append(current[-1])
    return drafts


def main(argv=None, *, runtime: str | None = None, modes=CONFIG_MODES, presets=("small",), description=None,
         arguments=None, before=None, after=None, **drive_options) -> int:
    """The smoke driver. A plugin's own smoke module sets its engine's environment first (before
    anything imports the engine or the hub) and calls this with its runtime and defaults:
    `arguments(parser)` adds its options; `before(runtime, log, args)` and `after(runtime, log, args)`
    run its own stages around the modes (each returns the stages that failed); `drive_options` go to
    `drive` (joins, steps, keep_first_open, step_details)."""
    parser = argparse.ArgumentParser(prog=None if runtime else "python -m harness.smoke",
                                     description=description or __doc__.splitlines()[0])
    parser.add_argument("--runtime", required=runtime is None, default=runtime,
                        help="a runtime name or package.module:factory, as pytest's")
    parser.add_argument("--modes", default=",".join(modes))
    parser.add_argument("--presets", default=",".join(presets))
    parser.add_argument("--graph-backend", default="cuda", help="cuda, or emulated for a dry run on the CPU")
    parser.add_argument("--live", default=None, help="append every stage here as JSON lines")
    parser.add_argument("--keep-first-open", action="store_true",
                        help="keep the first engine open while the others run, and close it last")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    start, log = time.perf_counter(), Log(args.live)
    if args.graph_backend == "cuda":
        watch_cuda_graphs()
    try:
        made = time.perf_counter()
        runtime = resolve(args.runtime)
    except RuntimeLoadError as exc:
        print(f"harness.smoke: {exc}", file=sys.stderr)
        return 2
    where = ""
    if args.graph_backend == "cuda":
        import torch

        where = f"; torch {torch.__version__}; {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}"
    log("runtime", f"runtime {runtime.name} {runtime.version} (made in {time.perf_counter() - made:.1f}s){where}",
        capabilities=runtime.capabilities.summary(), precision=runtime.capabilities.precision)
    failed = list(before(runtime, log, args) or []) if before is not None else []
    options = {**drive_options, "keep_first_open": args.keep_first_open or drive_options.get("keep_first_open", False)}
    failed += drive(runtime, [m for m in args.modes.split(",") if m], [p for p in args.presets.split(",") if p],
                    graph_backend=args.graph_backend, log=log, **options)
    if after is not None:
        failed += list(after(runtime, log, args) or [])
    log("done", f"done in {time.perf_counter() - start:.1f}s; failed: {failed or 'none'}", failed=failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "Log", "drive", "engine_config", "capture_counted", "step_counted", "close_and_measure", "stage", "verify_steps",
    "greedy_drafts", "main",
]
