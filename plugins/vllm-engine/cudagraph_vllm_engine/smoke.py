"""The smoke stage of the GPU run: every config mode built once through the runtime, exactly as
the suites build them (so the compile caches it leaves are the suites' too), captured, driven
through a short generation, and closed. It prints SMOKE lines with what vLLM reported: the resolved
mode and the sizes with graphs, the graphs captured (vLLM's count and the harness's), and per step
the mode and padded size vLLM ran, the graph launches the harness counted, what the runtime's own
policy says the step should have run, the largest difference from transformers' forward over the
same checkpoint (beside the tolerance the runtime's declared precision earns), and from an eager
step of the same engine at the same shape. After each close it measures the CUDA memory the build
left allocated (`SMOKE memory`): what close() could not give back, build after build (a capture on
a stream of torch's pool that no matmul ran on before leaves that stream's cuBLAS workspace, 32 MiB
on an H200, which the harness allows any test once).

    python -m cudagraph_vllm_engine.smoke [--modes NONE,PIECEWISE,FULL,FULL_DECODE_ONLY,FULL_AND_PIECEWISE]

Numbers are reported, not judged (the suites judge); the exit status is 0 when every mode built
and ran.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
import weakref
from dataclasses import replace

from . import settings

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
MiB = 1 << 20


def say(*parts) -> None:
    print("SMOKE", *parts, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    settings.apply_environment()
    start = time.perf_counter()
    import torch

    from harness.expectations import presets
    from harness.expectations.anchor import Anchor
    from harness.graphs.log import watch_cuda_graphs
    from harness.protocol import PolicyConfig

    from .runtime import VllmEngineRuntime

    watch_cuda_graphs()
    with settings.timed("smoke: runtime (imports vLLM)"):
        runtime = VllmEngineRuntime()
    say(f"runtime {runtime.name} {runtime.version}; torch {torch.__version__}; {torch.cuda.get_device_name(0)}")
    say(f"capabilities: {runtime.capabilities.summary()}")
    with settings.timed("smoke: policy questions with speculative tokens (vLLM inspects the EAGLE draft once)"):
        sizes = runtime.capture_sizes(PolicyConfig(max_num_seqs=32, num_speculative_tokens=1, vllm_version="0.25"))
    say(f"policy: q = 2, max_num_seqs 32: {len(sizes)} sizes up to {sizes[-1]}")
    anchor = Anchor(str(presets.checkpoint(PRESET)), device="cuda")
    failed, kept, shared = [], [], None
    modes = [m for m in args.modes.split(",") if m]
    for number, mode in enumerate(modes):
        try:
            # The first engine stays open, as the suites' shared engines do, so that the others close
            # the way a test's own engines close beside them; it is closed last, alone.
            result = run_mode(runtime, anchor, mode, close=number > 0 or len(modes) == 1)
            if number == 0 and len(modes) > 1:
                shared = result
            else:
                kept.append(result)
        except Exception:
            failed.append(mode)
            say(f"mode={mode} FAILED")
            print(traceback.format_exc(), flush=True)
    if shared is not None:
        kept.append(close_and_measure(shared, f"mode={modes[0]} (kept open, closed last)"))
    say(f"memory kept per build after close(): {[round(k / MiB, 1) for k in kept]} MiB (declared: "
        f"{runtime.capabilities.memory_kept_per_build / MiB:.1f} MiB)")
    say(f"done in {time.perf_counter() - start:.1f}s; modes failed: {failed or 'none'}")
    return 1 if failed else 0


# vLLM's Triton attention refuses the tiny preset's head size of 16 ('head_size not supported'):
# the small preset's heads are 64 wide.
PRESET = "small"


def engine_config(runtime, mode: str):
    """The config the suites' engine factory makes for this mode, so that the smoke stage fills the
    compile caches the suites then hit."""
    from harness.runtime.observe import EngineFactory

    return EngineFactory(runtime, "cuda", preset=PRESET).config(mode=mode)


def run_mode(runtime, anchor, mode: str, close: bool = True):
    """Build, capture and step one engine; closed: the CUDA memory it left allocated, else the engine
    (with what close_and_measure needs)."""
    import torch

    gc.collect()
    before = torch.cuda.memory_allocated()
    config = engine_config(runtime, mode)
    started = time.perf_counter()
    engine = runtime.build(config)
    say(f"mode={mode} built in {time.perf_counter() - started:.1f}s: {engine.describe()}")
    opened = (engine, before, weakref.ref(engine.runner.model))
    del engine
    try:
        drive(runtime, anchor, opened[0], config, mode)
    except BaseException:
        close_and_measure(opened, f"mode={mode} (failed)")
        raise
    return close_and_measure(opened, f"mode={mode}") if close else opened


def close_and_measure(opened, label: str) -> int:
    import torch

    engine, before, model = opened
    engine.close()
    del engine, opened
    gc.collect()
    torch.cuda.empty_cache()
    kept = torch.cuda.memory_allocated() - before
    say(f"memory {label}: {before / MiB:.1f} MiB allocated before the build, {kept / MiB:+.1f} MiB after close(); "
        f"the model {'is still alive' if model() is not None else 'was freed'}")
    if model() is not None:  # what holds it: the first referrers, for the next run to fix
        for holder in gc.get_referrers(model())[:6]:
            say(f"  model held by {type(holder).__module__}.{type(holder).__qualname__}")
    return kept


def drive(runtime, anchor, engine, config, mode: str) -> None:
    import torch

    from harness.graphs.log import LOG
    from harness.protocol import Request
    from harness.scenarios.batches import prompt

    if mode != "NONE":
        before = LOG.snapshot()
        report = engine.capture()
        seen = LOG.since(before)
        say(f"mode={mode} capture: vLLM counted {dict(report.graphs)}, the harness saw {seen.captures} captures; "
            f"{report.seconds:.2f}s, {report.memory_bytes / MiB:.1f} MiB; order {list(report.order)}")
    policy = replace(config.policy, mode=engine.resolution.resolved)
    tolerance = anchor.tolerance(runtime.capabilities.precision, PRESET)
    history: dict[int, list[int]] = {}
    following: dict[int, int] = {}
    plan = [("prefill", [(1, 5), (2, 11), (3, 3)]), ("decode", []), ("decode", []), ("decode", []),
            ("mixed", [(4, 2)]), ("decode", [])]
    worst_anchor, eager_equal, ran = 0.0, 0, []
    for number, (kind, new) in enumerate(plan):
        requests = [Request(i, (following[i],), len(history[i])) for i in sorted(history)]
        requests += [Request(i, prompt(i, n), 0) for i, n in new]
        tokens = sum(len(r.token_ids) for r in requests)
        uniform = all(len(r.token_ids) == 1 for r in requests)
        before = LOG.snapshot()
        out = engine.step(requests)
        launches = LOG.since(before).replays
        expected = anchor.step(requests, history)
        got = out.logits.float().cpu()
        anchor_diff = float((got - expected).abs().max())
        eager = engine.eager_step(requests, out.padded_num_tokens)
        same = torch.equal(out.logits, eager.logits)
        eager_diff = float((out.logits.double() - eager.logits.double()).abs().max())
        own = runtime.dispatch(policy, tokens, len(requests), uniform)
        worst_anchor, eager_equal = max(worst_anchor, anchor_diff), eager_equal + same
        ran.append(f"{out.runtime_mode}@{out.padded_num_tokens}")
        say(f"mode={mode} step={number} {kind}: {len(requests)} requests, {tokens} tokens -> ran {out.runtime_mode} at "
            f"{out.padded_num_tokens} (own policy: {own.runtime_mode} at {own.descriptor.num_tokens}); graph launches "
            f"{launches}; |logits - transformers| max {anchor_diff:.3g}; eager at the same shape: "
            f"{'bit-equal' if same else f'differs, max {eager_diff:.3g}'}")
        row = 0
        for r in requests:
            history[r.request_id] = history.get(r.request_id, []) + list(r.token_ids)
            row += len(r.token_ids)
            following[r.request_id] = int(expected[row - 1].argmax())
    for request_id in history:
        engine.release(request_id)
    say(f"mode={mode} summary: ran {ran}; largest difference from transformers {worst_anchor:.3g} (the anchor's "
        f"tolerance for declared precision {tolerance.precision!r}: {tolerance.value:.3g}); eager bit-equal in "
        f"{eager_equal}/{len(plan)} steps")


if __name__ == "__main__":
    sys.exit(main())
