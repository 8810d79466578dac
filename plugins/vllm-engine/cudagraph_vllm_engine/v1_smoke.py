"""The V1 smoke stage: vLLM 0.25's V1 model runner (vllm-engine-v1) built for each mode asked
(default FULL_AND_PIECEWISE and FULL_DECODE_ONLY), captured, six steps against transformers and an
eager step each (harness.smoke.drive, the kit's one smoke driver), then an ngram engine (k = 2) with verify steps of q = 3: drafts that
transformers' argmax would accept, then drafts it would reject, each step's logits against
transformers and the drafts vLLM's rejection sampler accepted. SMOKE lines as smoke.py prints them.

    python -m cudagraph_vllm_engine.v1_smoke [--modes FULL_AND_PIECEWISE,FULL_DECODE_ONLY] [--k 2]

Exit status 0 when every engine built and ran.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import replace

from . import settings
from .smoke import PRESET, engine_config


def say(text: str) -> None:
    print("SMOKE", text, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="FULL_AND_PIECEWISE,FULL_DECODE_ONLY")
    parser.add_argument("--k", type=int, default=2)
    args = parser.parse_args(argv)
    settings.apply_environment()
    start = time.perf_counter()
    import torch

    from harness import smoke
    from harness.expectations import presets
    from harness.expectations.anchor import Anchor

    from .v1_runtime import VllmEngineV1Runtime

    smoke.watch_cuda_graphs()
    with settings.timed("v1 smoke: runtime (imports vLLM)"):
        runtime = VllmEngineV1Runtime()
    say(f"runtime {runtime.name} {runtime.version}; torch {torch.__version__}; {torch.cuda.get_device_name(0)}")
    say(f"capabilities: {runtime.capabilities.summary()}")
    modes = [m for m in args.modes.split(",") if m]
    failed = smoke.drive(runtime, modes, (PRESET,), log=smoke.Log()) if modes else []
    if args.k:
        anchor = Anchor(str(presets.checkpoint(PRESET)), device="cuda")
        failed += stage(f"ngram k={args.k}", lambda: verify(runtime, anchor, args.k))
    say(f"done in {time.perf_counter() - start:.1f}s; failed: {failed or 'none'}")
    return 1 if failed else 0


def stage(label: str, run) -> list[str]:
    try:
        run()
        return []
    except Exception:
        say(f"{label} FAILED")
        print(traceback.format_exc(), flush=True)
        return [label]


def verify(runtime, anchor, k: int) -> None:
    import torch

    from harness.graphs.log import LOG
    from harness.protocol import Request
    from harness.scenarios.batches import prompt

    base = engine_config(runtime, "FULL_AND_PIECEWISE")
    config = replace(base, policy=replace(base.policy, num_speculative_tokens=k))
    engine = runtime.build(config)
    try:
        say(f"ngram k={k} built: {engine.describe()}")
        engine.capture()
        history = {i: list(prompt(i, n)) for i, n in ((1, 6), (2, 9), (3, 4))}
        requests = [Request(i, tuple(t), 0) for i, t in history.items()]
        expected = anchor.step(requests, {})
        engine.step(requests)
        nxt, row = {}, 0
        for r in requests:
            row += len(r.token_ids)
            nxt[r.request_id] = int(expected[row - 1].argmax())
        for number, accept in enumerate((True, False, True)):
            requests = []
            for i, tokens in history.items():
                drafts = greedy_drafts(anchor, tokens + [nxt[i]], k) if accept else [(nxt[i] + 7 + j) % engine.vocab for j in range(k)]
                requests.append(Request(i, tuple([nxt[i]] + drafts), len(tokens)))
            want = anchor.step(requests, {i: list(t) for i, t in history.items()})
            before = LOG.snapshot()
            out = engine.step(requests)
            launches = LOG.since(before).replays
            diff = float((out.logits.float().cpu() - want).abs().max())
            eager = engine.eager_step(requests, out.num_padded_tokens)
            same = torch.equal(out.logits, eager.logits)
            own = runtime.dispatch(config.policy, out.num_real_tokens, len(requests), True)
            say(f"ngram k={k} verify step {number} ({'drafts transformers accepts' if accept else 'drafts to reject'}): "
                f"{out.num_real_tokens} tokens -> ran {out.runtime_mode} at {out.num_padded_tokens} (own policy: "
                f"{own.runtime_mode} at {own.descriptor.num_padded_tokens}); graph launches {launches}; |logits - "
                f"transformers| max {diff:.3g}; eager bit-equal {same}; vLLM accepted {engine.accepted}")
            row = 0
            for r in requests:  # the next step starts after all q tokens (the harness rewrites rejected KV)
                history[r.request_id] += list(r.token_ids)
                row += len(r.token_ids)
                nxt[r.request_id] = int(want[row - 1].argmax())
        for i in history:
            engine.release(i)
    finally:
        engine.close()


def greedy_drafts(anchor, tokens: list[int], k: int) -> list[int]:
    """k tokens transformers' greedy decoding would produce after `tokens` (drafts vLLM should accept)."""
    from harness.protocol import Request

    drafts, current = [], list(tokens)
    for _ in range(k):
        logits = anchor.step([Request(0, tuple(current), 0)], {})
        current.append(int(logits[-1].argmax()))
        drafts.append(current[-1])
    return drafts


if __name__ == "__main__":
    sys.exit(main())
