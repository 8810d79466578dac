"""The V1 smoke stage: vLLM 0.25's V1 model runner (vllm-engine-v1) built for each mode asked
(default FULL_AND_PIECEWISE and FULL_DECODE_ONLY), captured, six steps against transformers and an
eager step each (harness.smoke.drive, the kit's one smoke driver), then an ngram engine (k = 2) with verify steps of q = 3: drafts that
transformers' argmax would accept, then drafts it would reject, each step's logits against
transformers and the drafts vLLM's rejection sampler accepted. SMOKE lines as smoke.py prints them.

    python -m cudagraph_vllm_engine.v1_smoke [--modes FULL_AND_PIECEWISE,FULL_DECODE_ONLY] [--k 2]

Exit status 0 when every engine built and ran.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from . import settings
from .smoke import PRESET, engine_config


def main(argv=None) -> int:
    settings.apply_environment()  # before anything imports vLLM or the hub
    from harness import smoke

    return smoke.main(argv, runtime="cudagraph_vllm_engine.v1_runtime:VllmEngineV1Runtime",
                      modes=("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"), presets=(PRESET,),
                      description=__doc__.splitlines()[0],
                      arguments=lambda parser: parser.add_argument("--k", type=int, default=2), after=ngram_stage)


def ngram_stage(runtime, log, args) -> list[str]:
    """An ngram engine of k speculative tokens, its verify steps against transformers."""
    from harness import smoke
    from harness.expectations import presets
    from harness.expectations.anchor import Anchor

    if not args.k:
        return []
    anchor = Anchor(str(presets.checkpoint(PRESET)), device="cuda")

    def say(text: str) -> None:
        log("verify", text)

    return smoke.stage(log, f"ngram k={args.k}", lambda: verify(runtime, anchor, args.k, say))


def verify(runtime, anchor, k: int, say) -> None:
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
