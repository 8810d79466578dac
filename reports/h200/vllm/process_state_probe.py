"""Does a step's result depend on what the process built before it? (vLLM's known failure #8)

In the lane, test_replay_equivalence's rows-changing-owner step 0 took one of two values in one
worker process, and which one an engine gave (graph or eager, fresh or shared) changed with what
had run before; in a fresh process graph and eager agree. Here, in one process, round after
round, each mode builds two fresh engines and runs the same steps
(harness.scenarios.batches.rows_changing_owner) as the suite does:

  G   a fresh engine's graph steps, and its own eager step at the same shape after each
  E   a second fresh engine's eager steps at G's padded sizes
  S   the mode's shared engine (built in round 0, kept): its eager steps, a history growing by round

After each round, each mode builds an engine of the suites' larger policy (EngineFactory.larger_policy:
another grid, another token budget), runs the same steps through its graphs and closes it, as the
capture and padding suites do in a worker: round 0 is the only one before any such build.

For each, the first step's logits are printed as a fingerprint (the value at (0, 0) and a hash of
the raw bytes), so the distinct results, and the round where one appears, can be read off.

    python reports/h200/vllm/process_state_probe.py --runtime reference --graph-backend emulated --rounds 2   # anywhere
    python reports/h200/vllm/process_state_probe.py --runtime cudagraph_vllm_engine.runtime:VllmEngineRuntime \
        --preset small --modes FULL,PIECEWISE --seconds 300
"""
from __future__ import annotations

import hashlib
import sys
import time

from history_probe import probe_arguments, probe_factory


def fingerprint(logits) -> str:
    raw = logits.detach().cpu().contiguous()
    return f"{float(raw[0, 0]):.8f}/{hashlib.sha1(raw.view(-1).numpy().tobytes()).hexdigest()[:8]}"


def main(argv=None) -> int:
    parser = probe_arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=300.0, help="no new round starts after this")
    args = parser.parse_args(argv)

    from harness.expectations.equality import same_bits
    from harness.scenarios.batches import rows_changing_owner

    factory = probe_factory(args)
    modes = args.modes.split(",")
    begin = time.perf_counter()
    shared = {mode: factory.get(mode=mode) for mode in modes}
    seen: dict[str, list[str]] = {}  # fingerprint -> where it appeared

    def note(where: str, logits) -> str:
        mark = fingerprint(logits)
        seen.setdefault(mark, []).append(where)
        return mark

    for round_ in range(args.rounds):
        if round_ and time.perf_counter() - begin > args.seconds:
            break
        for mode in modes:
            graph, second = factory.get(mode=mode, fresh=True), factory.get(mode=mode, fresh=True)
            steps = []
            for requests, _ in rows_changing_owner(graph):
                got = graph.step(requests)
                steps.append((got, graph.eager_step(requests, got.padded_num_tokens)))
            others = {}
            for name, engine in (("E", second), ("S", shared[mode])):
                others[name] = [engine.eager_step(requests, steps[t][0].padded_num_tokens)
                                for t, (requests, _) in enumerate(rows_changing_owner(engine))]
            (g0, own0), e0, s0 = steps[0], others["E"][0], others["S"][0]
            where = f"round {round_} {mode}"
            print(f"PROBE {where}: step 0 ran {g0.runtime_mode} at {g0.padded_num_tokens}; "
                  f"G graph {note(where + ' G graph', g0.logits)}, G eager {note(where + ' G eager', own0.logits)}, "
                  f"E eager {note(where + ' E eager', e0.logits)}, S eager {note(where + ' S eager', s0.logits)}; "
                  f"steps where G graph = E eager: "
                  f"{sum(same_bits(a.logits, b.logits) for (a, _), b in zip(steps, others['E']))}/{len(steps)}",
                  flush=True)
            second.close()
            graph.close()
        for mode in modes:
            larger = factory.get(mode=mode, fresh=True, **factory.larger_policy())
            for requests, _ in rows_changing_owner(larger):
                larger.step(requests)
            larger.close()
    for mark, where in seen.items():
        print(f"PROBE result {mark}: {len(where)} times, first at {where[0]}, last at {where[-1]}", flush=True)
    print(f"PROBE done in {time.perf_counter() - begin:.1f}s: {len(seen)} distinct step-0 results", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
