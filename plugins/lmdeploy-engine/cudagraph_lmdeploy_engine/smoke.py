"""The smoke stage of the GPU run: engines built through the runtime exactly as the suites build
them, captured, and driven through a short generation, with LMDeploy's live state logged at each
stage so that one run, even a failing one, says what LMDeploy did.

    python -m cudagraph_lmdeploy_engine.smoke [--modes NONE,FULL_DECODE_ONLY,FULL_AND_PIECEWISE]
        [--presets small,tiny] [--live PATH]

Printed (SMOKE lines) and, with --live, appended as JSON lines: each engine's live state
(engine.describe(): the capture batch sizes LMDeploy's runner computed, eager_mode, its graph
keys after capture, KV layout, dtype), the capture (graphs LMDeploy captured, graphs the harness
saw captured, seconds, memory, order), and per step what LMDeploy's graph runner decided and ran
(decoding, its own graph-path answer, the key, the path, the padded size), the graph launches the
harness counted, the runtime's own policy for the batch, the largest difference from
transformers' forward over the same checkpoint and from an eager step of the same engine at the
same shape, and the padded rows' inputs. The first preset runs every mode; the others only the
first graph mode (a probe of whether LMDeploy's kernels run that shape). Numbers are reported,
not judged (the suites judge); the exit status is 0 when every engine built and ran.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import replace

from . import settings

MODES = ("NONE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
PRESETS = ("small", "tiny")
# (kind, new requests (id, prompt length)): three prompts, decode steps of 3 (padded to 4), a
# mixed step, decode steps of 4, a large decode step of 7 (padded to 8).
PLAN = [("prefill", [(1, 5), (2, 11), (3, 3)]), ("decode", []), ("decode", []), ("mixed", [(4, 2)]),
        ("decode", []), ("prefill", [(5, 4), (6, 1), (7, 6)]), ("decode", []), ("decode", [])]


class Log:
    def __init__(self, path: str | None):
        self.path = path

    def __call__(self, stage: str, text: str, **data) -> None:
        print("SMOKE", stage, text, flush=True)
        if self.path:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"time": time.strftime("%H:%M:%S"), "stage": stage, **data}, default=str) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--live", default=None, help="append LMDeploy's live state here as JSON lines")
    args = parser.parse_args(argv)
    log = Log(args.live)
    settings.apply_environment()
    start = time.perf_counter()
    import torch

    from harness.expectations import presets
    from harness.expectations.anchor import Anchor
    from harness.graphs.log import watch_cuda_graphs

    from .runtime import LmdeployEngineRuntime

    watch_cuda_graphs()
    with settings.timed("smoke: runtime (imports LMDeploy)"):
        runtime = LmdeployEngineRuntime()
    log("runtime", f"{runtime.name} {runtime.version}; torch {torch.__version__}; {torch.cuda.get_device_name(0)}",
        capabilities=runtime.capabilities.summary(), precision=runtime.capabilities.precision)
    failed = []
    for number, preset in enumerate(p for p in args.presets.split(",") if p):
        anchor = Anchor(str(presets.checkpoint(preset)), device="cuda")
        modes = [m for m in args.modes.split(",") if m]
        for mode in modes if number == 0 else [m for m in modes if m != "NONE"][:1]:
            try:
                run_mode(runtime, anchor, preset, mode, log)
            except Exception as exc:
                failed.append(f"{preset}/{mode}")
                log("failed", f"preset={preset} mode={mode} FAILED: {type(exc).__name__}: {exc}",
                    preset=preset, mode=mode, traceback=traceback.format_exc())
                print(traceback.format_exc(), flush=True)
        del anchor
    log("done", f"in {time.perf_counter() - start:.1f}s; failed: {failed or 'none'}", failed=failed)
    return 1 if failed else 0


def engine_config(runtime, mode: str, preset: str):
    """The config the suites' engine factory makes for this mode and preset."""
    from harness.runtime.observe import EngineFactory

    return EngineFactory(runtime, "cuda", preset=preset).config(mode=mode)


def run_mode(runtime, anchor, preset: str, mode: str, log) -> None:
    import torch

    from harness.graphs.log import LOG
    from harness.protocol import Request
    from harness.scenarios.batches import prompt

    config = engine_config(runtime, mode, preset)
    where = f"preset={preset} mode={mode}"
    started = time.perf_counter()
    engine = runtime.build(config)
    log("build", f"{where} built in {time.perf_counter() - started:.1f}s: {engine.describe()}", preset=preset,
        mode=mode, seconds=time.perf_counter() - started, live=engine.describe(), resolution=engine.resolution)
    if engine.resolution.resolved != "NONE":
        before = LOG.snapshot()
        report = engine.capture()
        seen = LOG.since(before)
        log("capture", f"{where}: LMDeploy captured {dict(report.graphs)}, the harness saw {seen.captures} captures; "
            f"{report.seconds:.2f}s, {report.memory_bytes / 2**20:.1f} MiB; order {list(report.order)}", preset=preset,
            mode=mode, report=report, harness_captures=seen.captures, live=engine.describe())
    policy = replace(config.policy, mode=engine.resolution.resolved)
    history: dict[int, list[int]] = {}
    following: dict[int, int] = {}
    worst, equal = 0.0, 0
    for number, (kind, new) in enumerate(PLAN):
        requests = [Request(i, (following[i],), len(history[i])) for i in sorted(history)]
        requests += [Request(i, prompt(i, n), 0) for i, n in new]
        tokens = sum(len(r.token_ids) for r in requests)
        uniform = all(len(r.token_ids) == 1 for r in requests)
        before = LOG.snapshot()
        out = engine.step(requests)
        launches = LOG.since(before).replays
        record = engine.last
        inputs = engine.last_step_inputs()
        pad = slice(out.num_tokens, out.padded_num_tokens)
        expected = anchor.step(requests, history)
        difference = float((out.logits.float().cpu() - expected).abs().max())
        eager = engine.eager_step(requests, out.padded_num_tokens)
        same = torch.equal(out.logits, eager.logits)
        eager_difference = float((out.logits.double() - eager.logits.double()).abs().max())
        own = runtime.dispatch(policy, tokens, len(requests), uniform)
        worst, equal = max(worst, difference), equal + same
        log("step", f"{where} step={number} {kind}: {len(requests)} requests, {tokens} tokens -> ran {out.runtime_mode} "
            f"at {out.padded_num_tokens} (own policy: {own.runtime_mode} at {own.descriptor.num_tokens}); LMDeploy: "
            f"decoding={record.decoding} graph path offered={record.offered} declined={record.declined} key={record.key}; "
            f"graph launches {launches}; |logits - transformers| max {difference:.3g}; eager at the same shape: "
            f"{'bit-equal' if same else f'differs, max {eager_difference:.3g}'}", preset=preset, mode=mode, step=number,
            kind=kind, requests=len(requests), tokens=tokens, ran=(out.runtime_mode, out.padded_num_tokens),
            own=(own.runtime_mode, own.descriptor.num_tokens), decoding=record.decoding, offered=record.offered,
            declined=record.declined, key=record.key, replayed_key=record.replayed_key, launches=launches,
            anchor_difference=difference, eager_equal=same, eager_difference=eager_difference,
            padded_token_ids=inputs.token_ids[pad].tolist(), padded_positions=inputs.positions[pad].tolist(),
            slot_mapping=inputs.slot_mapping.tolist())
        row = 0
        for r in requests:
            history[r.request_id] = history.get(r.request_id, []) + list(r.token_ids)
            row += len(r.token_ids)
            following[r.request_id] = int(expected[row - 1].argmax())
    for request_id in history:
        engine.release(request_id)
    tolerance = anchor.tolerance(runtime.capabilities.precision, preset)
    log("summary", f"{where}: largest difference from transformers {worst:.3g} (the anchor's tolerance for declared "
        f"precision {tolerance.precision!r}: {tolerance.value:.3g}); "
        f"eager bit-equal in {equal}/{len(PLAN)} steps; addresses {len(engine.static_buffer_addresses())} buffers",
        preset=preset, mode=mode, anchor_difference=worst, eager_equal_steps=equal, steps=len(PLAN))


if __name__ == "__main__":
    sys.exit(main())
