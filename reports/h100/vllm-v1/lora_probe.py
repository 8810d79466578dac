"""Probe (issue 55): where vLLM 0.25's V1 runner applies the harness's LoRA adapters. The V1 lane's LoRA
suite found an eager step's logits equal with and without adapters, and the graph step's different
from the eager one. For each (mode, specialize_active_loras), one engine (bfloat16, max_loras 2), six
requests prefilled with adapters [1, None, 2, None, 1, None], then the same decode batch as a graph step
and as eager steps, with and without adapters: PROBE lines give the largest |difference| over the rows
that name an adapter, and the key each step ran. Run on a GPU where vLLM 0.25 is installed:

    PYTHONPATH=/tmp/site:.:plugins/vllm-engine:plugins/vllm-engine-v1 python reports/h100/vllm-v1/lora_probe.py
"""
from __future__ import annotations

from cudagraph_vllm_engine import settings

settings.apply_environment()

from harness.protocol import Request  # noqa: E402
from harness.runtime.factory import EngineFactory  # noqa: E402

from cudagraph_vllm_engine_v1.runtime import VllmEngineV1Runtime  # noqa: E402

ADAPTERS = [1, None, 2, None, 1, None]
LENGTHS = [5, 3, 7, 4, 6, 2]


def largest(a, b, rows) -> float:
    return max(float((a[r].float() - b[r].float()).abs().max()) for r in rows)


def probe(runtime, mode: str, specialize: bool) -> None:
    factory = EngineFactory(runtime, "cuda", preset="small")
    config = factory.config(mode=mode, max_loras=2, specialize_active_loras=specialize, dtype="bfloat16")
    engine = runtime.build(config)
    try:
        engine.capture()
        prefill = [Request(100 + i, tuple((7 * i + j) % 200 + 1 for j in range(n)), 0, lora=a)
                   for i, (n, a) in enumerate(zip(LENGTHS, ADAPTERS))]
        engine.step(prefill)

        def batch(with_adapters: bool):
            return [Request(r.request_id, (11,), len(r.token_ids), lora=r.lora if with_adapters else None)
                    for r in prefill]

        rows = [i for i, a in enumerate(ADAPTERS) if a is not None]
        graph = engine.step(batch(True))
        eager = engine.eager_step(batch(True), graph.num_padded_tokens)
        eager_plain = engine.eager_step(batch(False), graph.num_padded_tokens)
        exact = engine.eager_step(batch(True), len(prefill))
        exact_plain = engine.eager_step(batch(False), len(prefill))
        graph_plain = engine.step(batch(False))
        tag = f"PROBE mode={mode} specialize={specialize}"
        print(f"{tag} graph ran {graph.runtime_mode} at {graph.num_padded_tokens} key {graph.key}; eager key {eager.key}; "
              f"exact eager key {exact.key}")
        print(f"{tag} adapter effect (rows {rows}): graph {largest(graph.logits, graph_plain.logits, rows):.4g}, "
              f"eager padded {largest(eager.logits, eager_plain.logits, rows):.4g}, "
              f"eager exact {largest(exact.logits, exact_plain.logits, rows):.4g}")
        print(f"{tag} graph vs eager, adapters on: padded {largest(graph.logits, eager.logits, rows):.4g}, "
              f"exact {largest(graph.logits, exact.logits, rows):.4g}; adapters off: "
              f"{largest(graph_plain.logits, eager_plain.logits, range(len(prefill))):.4g}", flush=True)
    finally:
        engine.close()


def main() -> None:
    runtime = VllmEngineV1Runtime()
    for mode, specialize in (("FULL_DECODE_ONLY", True), ("FULL_DECODE_ONLY", False), ("PIECEWISE", True)):
        try:
            probe(runtime, mode, specialize)
        except Exception as error:  # noqa: BLE001 - a probe reports each case
            print(f"PROBE mode={mode} specialize={specialize} failed: {type(error).__name__}: {str(error)[:300]}",
                  flush=True)


if __name__ == "__main__":
    main()
