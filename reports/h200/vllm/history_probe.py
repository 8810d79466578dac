"""Does an engine's eager step depend on what the engine ran before it?

The question behind test_replay_equivalence's rows-changing-owner failures on vLLM (7.3e-05 in
nearly every logit, FULL and PIECEWISE, under xdist and serially): the suite compares a fresh
graph engine's decode steps with the eager steps of the suites' shared engine of the same mode,
an engine other tests used first. Here, per mode, the same steps (harness.scenarios.batches
.rows_changing_owner) run on

  G   a fresh engine, graph steps (the suite's `got`)
  T0  a fresh twin, eager steps at G's padded size (no history)
  T1  a twin that first served longer requests in batches that pad (a history), then the same
      eager steps

and each step's logits are compared bit for bit (torch.equal): G against T0, G against T1, T0
against T1. If T0 equals G and T1 does not, a step's real rows depend on what the engine held
from earlier steps (its padded rows, say), not on the graph.

    python reports/h200/vllm/history_probe.py --runtime reference --graph-backend emulated --modes FULL   # anywhere
    python reports/h200/vllm/history_probe.py --runtime cudagraph_vllm_engine.runtime:VllmEngineRuntime --preset small
"""
from __future__ import annotations

import argparse
import sys
import time

import torch


def probe_arguments(doc: str) -> argparse.ArgumentParser:
    """The options of the engine probes (this one, reports/h200/vllm/process_state_probe.py)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--runtime", default="reference")
    parser.add_argument("--graph-backend", default="cuda")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--modes", default="FULL,PIECEWISE,FULL_DECODE_ONLY,FULL_AND_PIECEWISE")
    return parser


def probe_factory(args):
    """The runtime's engines as a suites run builds them, with the harness counting graph launches."""
    from harness.runtime import registry
    from harness.runtime.observe import EngineFactory
    from harness.session import machine

    runtime = registry.resolve(args.runtime, None)
    machine.share(args.graph_backend, None)
    return EngineFactory(runtime, args.graph_backend, preset=args.preset)


def main(argv=None) -> int:
    args = probe_arguments(__doc__).parse_args(argv)

    from harness.protocol import Request
    from harness.scenarios.batches import advance, decode_requests, prompt, Sequence, rows_changing_owner

    factory = probe_factory(args)
    begin = time.perf_counter()

    budget = factory.defaults["max_num_batched_tokens"]
    longest = factory.max_model_len - 8  # room for the decode steps after the prompt

    def history(engine, first_id: int) -> None:
        """Requests up to near the engine's longest context, prefilled in chunks of the token budget,
        decoded four at a time and then three (the fourth row padded, holding a long request's
        state), released."""
        seqs = []
        for i, n in enumerate((longest, longest // 2, longest - 9, longest // 3)):
            tokens = prompt(first_id + i, n)
            for start in range(0, n, budget):
                engine.step([Request(first_id + i, tokens[start:start + budget], start)])
            seqs.append(Sequence(first_id + i, list(tokens)))
        for live in (seqs, seqs, seqs[:3], seqs[:3], seqs[1:]):
            requests = decode_requests(live)
            engine.step(requests)
            advance(live, requests)
        for s in seqs:
            engine.release(s.request_id)

    verdicts = []
    for mode in args.modes.split(","):
        graph = factory.get(mode=mode, fresh=True)
        fresh_twin = factory.get(mode=mode, fresh=True)
        used_twin = factory.get(mode=mode, fresh=True)
        history(used_twin, 500)
        got = [graph.step(requests) for requests, _ in rows_changing_owner(graph)]
        twins = {}
        for name, twin in (("T0", fresh_twin), ("T1", used_twin)):
            twins[name] = [twin.eager_step(requests, got[t].padded_num_tokens)
                           for t, (requests, _) in enumerate(rows_changing_owner(twin))]
        for t, result in enumerate(got):
            line = [f"PROBE mode={mode} step={t} ran {result.runtime_mode} at {result.padded_num_tokens}"]
            pairs = (("G=T0", result, twins["T0"][t]), ("G=T1", result, twins["T1"][t]),
                     ("T0=T1", twins["T0"][t], twins["T1"][t]))
            for label, a, b in pairs:
                same = torch.equal(a.logits, b.logits)
                largest = float((a.logits.float() - b.logits.float()).abs().max())
                line.append(f"{label}: {'bit-equal' if same else f'differ (largest {largest:.2g})'}")
                verdicts.append((mode, label, same))
            print("; ".join(line), flush=True)
        for engine in (used_twin, fresh_twin, graph):  # newest first, as the harness closes a test's engines
            engine.close()
    for mode in args.modes.split(","):
        summary = {label: all(same for m, l, same in verdicts if m == mode and l == label) for label in ("G=T0", "G=T1", "T0=T1")}
        print(f"PROBE summary mode={mode}: " + ", ".join(f"{k} in every step: {v}" for k, v in summary.items()))
    print(f"PROBE done in {time.perf_counter() - begin:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
