"""Cross-engine CUDA-graph policy report: capture sizes, graphs, padding and padding waste, side by side.

    python scripts/policy_compare.py --out reports/policy-compare
    python scripts/policy_compare.py --engine mine=my_package.runtime:make_runtime --seqs 8,64 --q 1

For the same scheduler limits (max_num_seqs, q = 1 + speculative tokens, each engine's default
token budget, an H200's platform maximum) every engine is asked, through the harness protocol:
its capture sizes; the graph each decode batch of 1..max_num_seqs requests (q tokens each)
replays, so its padded size and waste; and the distinct graphs decode and mixed batches use.
Engines: vLLM's V1 and V2 model runners, SGLang, the bucket engine, and any runtime object
given as `--engine NAME=module:factory`. Each engine's numbers say where they came from: the
engine's own code (the vllm-policy / sglang-policy plugins, a runtime object) or a reproduction
(the reference policy, where vLLM is not installed; SGLang's runner rules, which its plugin
reproduces from source because their module cannot be imported without a CUDA torch).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.runtime import registry  # noqa: E402
from harness.protocol import PolicyConfig  # noqa: E402
from harness.vocabulary import waste_percent  # noqa: E402

RANGES = ((1, 8), (9, 32), (33, 128), (129, 512))  # batch ranges (requests) the waste is summarised over
MIXED_TOKENS = 8192  # mixed batches are asked up to vLLM's and SGLang's default token budget on an H200
COLOURS = {"vLLM V1": "tab:blue", "vLLM V2": "tab:green", "SGLang": "tab:red", "bucket engine": "tab:purple"}
# V1 and V2 pad decode steps alike: V1 drawn wide and dashed, so the V2 line on top leaves it visible.
LINES = {"vLLM V1": dict(linestyle="--", linewidth=3, alpha=0.6)}
MARKERS = {"vLLM V1": "x"}


@dataclass
class Engine:
    name: str
    runtime: object
    source: str  # where the numbers come from
    policy: dict = field(default_factory=dict)  # PolicyConfig fields this engine is asked with


def _load(spec: str):
    """The runtime SPEC names: module:factory or an installed runtime's name (harness.runtime.registry,
    which raises RuntimeLoadError with what went wrong)."""
    return registry.resolve(spec, option="--engine")


def default_engines() -> tuple[list[Engine], list[str]]:
    """The engines this environment can answer for, and a line for each it cannot."""
    engines, missing = [], []
    try:
        from cudagraph_vllm_policy.runtime import VllmPolicyRuntime

        vllm = VllmPolicyRuntime()
        for runner in ("v1", "v2"):
            engines.append(Engine(f"vLLM {runner.upper()}", vllm, f"vLLM's own code ({vllm.version}, runner {runner})",
                                  {"runner": runner}))
    except Exception as exc:  # vLLM absent: the reference policy, checked against vLLM by the vllm-policy lane
        from reference_runtime.adapter import ReferenceRuntime

        for runner in ("v1", "v2"):
            engines.append(Engine(f"vLLM {runner.upper()}", ReferenceRuntime(),
                                  f"reproduction: reference_runtime.policy, runner {runner} (vLLM not importable: "
                                  f"{type(exc).__name__})", {"runner": runner}))
    try:
        from cudagraph_sglang_policy.runtime import SglangPolicyRuntime

        sglang = SglangPolicyRuntime()
        engines.append(Engine("SGLang", sglang, f"SGLang's own code for its grid and backends ({sglang.version}); "
                                                "runner padding rules reproduced from its source"))
    except Exception as exc:
        missing.append(f"SGLang: not importable ({type(exc).__name__}: {exc}); bash scripts/setup_sglang_policy.sh")
    try:
        bucket = _load("bucket_engine.runtime:BucketRuntime")
        engines.append(Engine("bucket engine", bucket, f"its own code (bucket_engine.runtime:BucketRuntime {bucket.version})"))
    except registry.RuntimeLoadError as exc:
        missing.append(f"bucket engine: not importable ({str(exc).splitlines()[0]}); add examples/bucket_engine to "
                       "the path or pass --engine 'bucket engine=bucket_engine.runtime:BucketRuntime'")
    return engines, missing


# -- measuring --------------------------------------------------------------------------------
def measure(engine: Engine, seqs: int, q: int) -> dict:
    config = PolicyConfig(max_num_seqs=seqs, num_speculative_tokens=q - 1, **engine.policy)
    sizes = list(engine.runtime.capture_sizes(config))
    padded, decode_keys = [], set()
    for reqs in range(1, seqs + 1):  # a decode step of `reqs` requests, q tokens each
        got = engine.runtime.dispatch(config, reqs * q, reqs, True)
        padded.append(got.descriptor.num_padded_tokens if got.runtime_mode != "NONE" else None)
        if got.runtime_mode != "NONE":
            decode_keys.add((got.runtime_mode, got.descriptor))
    mixed_keys = set()
    for tokens in range(1, max([*sizes, seqs * q, MIXED_TOKENS]) + 1):  # one request's prefill chunk of `tokens`
        got = engine.runtime.dispatch(config, tokens, 1, False)
        if got.runtime_mode != "NONE":
            mixed_keys.add((got.runtime_mode, got.descriptor))
    return {"sizes": sizes, "padded": padded, "decode_graphs": len(decode_keys),
            "graphs": len(decode_keys | mixed_keys), "mixed_graphs": len(mixed_keys)}


def waste(padded: list, q: int, low: int, high: int) -> tuple[float, float, int] | None:
    """(mean %, worst %, eager batches) over decode batches low..high requests; None if none."""
    rows = [(n, p) for n, p in enumerate(padded, start=1) if low <= n <= high]
    if not rows:
        return None
    pct = [waste_percent(n * q, p) for n, p in rows if p is not None]
    eager = sum(p is None for _, p in rows)
    return (sum(pct) / len(pct) if pct else 0.0, max(pct, default=0.0), eager)


# -- output -----------------------------------------------------------------------------------
def plot(results: dict, seqs: int, q: int, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.6), dpi=110)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    batches = list(range(1, seqs + 1))
    for name, result in results.items():
        colour = COLOURS.get(name)
        tokens = [p if p is not None else float("nan") for p in result["padded"]]
        left.step(batches, tokens, where="post", label=name, color=colour, **LINES.get(name, {}))
        right.plot(batches, [waste_percent(n * q, p) if p else float("nan") for n, p in zip(batches, result["padded"])],
                   MARKERS.get(name, "."), markersize=3 if seqs > 64 else 5, label=name, color=colour)
    left.plot(batches, [n * q for n in batches], ":", color="grey", label="unpadded")
    left.set(title=f"padded decode step, max_num_seqs={seqs}, q={q}", xlabel="requests in the batch",
             ylabel="tokens the graph runs")
    right.set(title="padding waste (gaps: the batch runs eager)", xlabel="requests in the batch",
              ylabel="waste (% of the padded step)")
    for axes in (left, right):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


def render(engines: list[Engine], missing: list[str], table: dict, plots: dict, seqs_list, q_list) -> str:
    lines = ["# Cross-engine CUDA-graph policy", "",
             "Written by `python scripts/policy_compare.py`. For the same scheduler limits, each engine's capture "
             "sizes, the graphs decode and mixed batches use, and the padding of every decode step of 1..max_num_seqs "
             "requests (q tokens each; q = 1 + speculative tokens). Each engine uses its own default token budget "
             "and an H200's platform maximum (512). A decode batch an engine runs eager counts as no waste and is "
             "counted under *eager*.", "", "## Where each engine's numbers come from", ""]
    lines += [f"- **{e.name}**: {e.source}" for e in engines]
    lines += [f"- not in this report: {m}" for m in missing]
    lines += ["", "Graph counts: *decode graphs* are the distinct graphs decode batches of 1..max_num_seqs replay; "
              f"*all graphs* adds those a single request's prefill of 1..{MIXED_TOKENS} tokens replays (vLLM's mixed "
              "graphs share its capture sizes; SGLang's prefill graphs are token buckets up to its budget).", ""]
    for q in q_list:
        for seqs in seqs_list:
            lines += [f"## max_num_seqs={seqs}, q={q}", "",
                      "| engine | capture sizes | largest | decode graphs | all graphs | "
                      + " | ".join(f"waste {lo}-{hi}: mean / worst (eager)" for lo, hi in RANGES if lo <= seqs) + " |",
                      "|---|---|---|---|---|" + "---|" * sum(lo <= seqs for lo, _ in RANGES)]
            for e in engines:
                r = table[(e.name, seqs, q)]
                cells = []
                for lo, hi in RANGES:
                    if lo > seqs:
                        continue
                    mean, worst, eager = waste(r["padded"], q, lo, min(hi, seqs))
                    cells.append(f"{mean:.1f}% / {worst:.1f}%" + (f" ({eager})" if eager else ""))
                lines.append(f"| {e.name} | {len(r['sizes'])} | {max(r['sizes'], default='-')} | {r['decode_graphs']} | "
                             f"{r['graphs']} | " + " | ".join(cells) + " |")
            lines += ["", f"![padding, max_num_seqs={seqs}, q={q}]({plots[(seqs, q)]})", ""]
            small = min(seqs, 24)
            lines += [f"<details><summary>padded size of each decode batch 1..{seqs} (requests -> tokens; "
                      "- = eager)</summary>", "", "| requests | " + " | ".join(e.name for e in engines) + " |",
                      "|---|" + "---|" * len(engines)]
            for n in range(1, seqs + 1):
                row = [table[(e.name, seqs, q)]["padded"][n - 1] for e in engines]
                if n <= small or len({str(x) for x in row}) > 1 or n == seqs:
                    lines.append(f"| {n} ({n * q} tokens) | " + " | ".join("-" if x is None else str(x) for x in row) + " |")
            lines += ["", f"(rows where every engine pads alike are left out above {small})", "</details>", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "policy-compare"), help="output folder")
    parser.add_argument("--seqs", default="8,64,256,512", help="max_num_seqs values, comma-separated")
    parser.add_argument("--q", default="1,2", help="q values (1 + speculative tokens), comma-separated")
    parser.add_argument("--engine", action="append", default=[], metavar="NAME=module:factory",
                        help="another runtime to compare (its own code): module:factory or an installed "
                             "runtime's name; may repeat")
    parser.add_argument("--only-given", action="store_true", help="compare only the --engine runtimes")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # vLLM and SGLang log their config decisions at length
    try:
        seqs_list = [int(s) for s in args.seqs.split(",")]
        q_list = [int(s) for s in args.q.split(",")]
    except ValueError:
        parser.error("--seqs and --q take comma-separated integers")
    engines, missing = ([], []) if args.only_given else default_engines()
    for spec in args.engine:
        name, _, factory = spec.partition("=")
        if not name or not factory:
            parser.error(f"--engine wants NAME=module:factory or NAME=RUNTIME (an installed runtime), got {spec!r}")
        engines = [e for e in engines if e.name != name]
        try:
            engines.append(Engine(name, _load(factory), f"its own code ({factory})"))
        except registry.RuntimeLoadError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if not engines:
        parser.error("no engine to compare")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table, plots = {}, {}
    for q in q_list:
        for seqs in seqs_list:
            results = {}
            for e in engines:
                table[(e.name, seqs, q)] = results[e.name] = measure(e, seqs, q)
            plots[(seqs, q)] = f"padding-seqs{seqs}-q{q}.png"
            plot(results, seqs, q, out / plots[(seqs, q)])
    (out / "README.md").write_text(render(engines, missing, table, plots, seqs_list, q_list) + "\n")
    (out / "policy-compare.json").write_text(json.dumps(
        {"engines": {e.name: e.source for e in engines}, "missing": missing,
         "results": [{"engine": n, "max_num_seqs": s, "q": q, **r} for (n, s, q), r in table.items()]}, indent=1) + "\n")
    print(f"policy comparison: {out / 'README.md'} ({len(engines)} engines, {len(plots)} plots)")
    return 0


if __name__ == "__main__":
    from harness.reliability import pipes

    sys.exit(pipes.run(main))  # quiet when the reader closes the pipe
