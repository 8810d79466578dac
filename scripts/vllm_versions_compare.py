"""vLLM 0.25's CUDA-graph policy beside vLLM 0.33's, each answered by its own code on the CPU.

    bash scripts/setup_vllm_versions.sh /tmp/vllm-versions        # a venv with vLLM 0.33, and 0.25 beside it
    /tmp/vllm-versions/venv/bin/python scripts/vllm_versions_compare.py \\
        --vllm025 /tmp/vllm-versions/vllm-0.25 --out reports/policy-compare

The same protocol questions (capture sizes, dispatch of every batch, LoRA dispatch, mode resolution)
go to vLLM 0.33 through the `vllm-policy` runtime (its V2 runner, 0.33's default) and to vLLM 0.25
through `vllm-engine-policy` (the code the `vllm-engine` runtime answers with, V2 being 0.25's
default too), each in a process of its own. Every answer that differs is put under the first rule
below whose question it is (RULES: what differs, and where in each release's code); an answer no rule
explains is listed as such. Writes vllm-0.25-vs-0.33.md (the table) and .json (every difference).

    /tmp/vllm-versions/venv/bin/python scripts/vllm_versions_compare.py --oracle vllm-0.25/v1 \\
        --vllm025 /tmp/vllm-versions/vllm-0.25 --out reports/policy-compare

asks the same questions of one
release's runner through its policy runtime (ORACLE_RUNTIMES: vLLM 0.25's V1 runner, its own
CudagraphDispatcher) and of the harness's oracle under those rules (harness.expectations.oracle,
harness.vocabulary.expected_resolution), and writes vllm-0.25-v1-vs-oracle.md and .json: every
answer that differs, none expected (exit 1 where one does).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.protocol import PolicyConfig, ResolveRequest  # noqa: E402
from harness.vocabulary import CONFIG_MODES, FAP, SUPPORT_LEVELS  # noqa: E402

PATHS = [ROOT, ROOT / "plugins" / "vllm-engine", ROOT / "plugins" / "vllm-engine-v1", ROOT / "plugins" / "vllm-policy"]
RUNTIMES = {"0.25": "cudagraph_vllm_engine.runtime:VllmEnginePolicyRuntime",
            "0.33": "cudagraph_vllm_policy.runtime:VllmPolicyRuntime"}
# One release's runner answered by its own code, to hold the oracle's model of it to (--oracle).
ORACLE_RUNTIMES = {"vllm-0.25/v1": "cudagraph_vllm_engine_v1.runtime:VllmEngineV1PolicyRuntime"}
# The rules next to each, whose oracle must disagree with the same answers (the comparison can fail).
NEIGHBOURS = {"vllm-0.25/v1": ("vllm-0.33/v1", "vllm-0.25/v2")}
GRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE")


# -- the questions --------------------------------------------------------------------------------
def size_questions() -> list[PolicyConfig]:
    grid = [PolicyConfig(max_num_seqs=s, num_speculative_tokens=q - 1, mode=m, platform_max=d)
            for s, q, m, d in itertools.product((1, 2, 3, 5, 8, 16, 24, 32, 64, 100, 128, 200, 256, 264, 300, 512, 1024),
                                                (1, 2, 3, 4), GRAPH_MODES, (512, 1024))]
    given = [PolicyConfig(max_num_seqs=8, capture_sizes=sizes, num_speculative_tokens=k)
             for sizes, k in itertools.product(((1, 2, 3, 5), (8, 4, 4, 1, 9000), (2, 6, 10, 40), ()), (0, 1, 3))]
    limits = [PolicyConfig(max_num_seqs=s, max_num_batched_tokens=t) for s, t in ((64, 100), (8, 16), (64, 32), (300, 300))]
    limits += [PolicyConfig(max_num_seqs=256, max_capture_size=m) for m in (257, 256, 250, 3, 1)]
    return grid + given + limits + [c for c in dispatch_questions() if c.capture_sizes is not None]


USER_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # the same sizes in both releases: what dispatch alone does


def dispatch_questions() -> list[PolicyConfig]:
    default = [PolicyConfig(max_num_seqs=s, num_speculative_tokens=q - 1, mode=m)
               for s, q, m in itertools.product((8, 64, 264), (1, 2, 3), CONFIG_MODES)]
    given = [PolicyConfig(max_num_seqs=s, num_speculative_tokens=q - 1, mode=m, capture_sizes=USER_SIZES)
             for s, q, m in itertools.product((8, 64), (1, 2, 3), GRAPH_MODES)]
    return default + given


def batches(config: PolicyConfig):
    """(tokens, requests, uniform) for every token count to past the largest size either release has."""
    q = config.query_len
    largest = max(config.capture_sizes) if config.capture_sizes else min(2 * q * config.max_num_seqs, 512)
    for tokens in range(1, largest + 3):
        yield tokens, max(1, min(tokens // 2, config.max_num_seqs)), False
        if tokens % q == 0 and tokens // q <= config.max_num_seqs:
            yield tokens, tokens // q, True


def lora_questions() -> list[PolicyConfig]:
    options = (dict(specialize_active_loras=True), dict(), dict(specialize_lora=False))
    return [PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64, mode=m, max_loras=n, **o)
            for m, n, o in itertools.product((FAP, "FULL"), (2, 4), options)]


def resolve_questions() -> list[ResolveRequest]:
    variants = ({}, {"attention_in_splitting_ops": False}, {"splitting_ops_empty": True})
    return [ResolveRequest(m, s, num_speculative_tokens=k, **v)
            for m, s, k, v in itertools.product(CONFIG_MODES, SUPPORT_LEVELS, (0, 1, 3), variants)]


# -- answering, in the process of one release -----------------------------------------------------
def _answer(call):
    try:
        value = call()
    except ValueError:
        return "rejected"
    if hasattr(value, "runtime_mode"):
        d = value.descriptor
        return [value.runtime_mode, d.num_padded_tokens, d.num_padded_rows, d.uniform, d.num_active_loras]
    if hasattr(value, "resolved"):
        return value.resolved
    return list(value) if value is not None else None


def answer_all(spec: str) -> dict:
    from harness.runtime import registry

    runtime = registry.resolve(spec, option="--answer")
    answers = {"version": runtime.version, "sizes": {}, "dispatch": {}, "lora": {}, "resolve": {}}
    for key, config in questions()["sizes"].items():
        answers["sizes"][key] = _answer(lambda: runtime.capture_sizes(config))
    for key, (config, tokens, reqs, uniform) in questions()["dispatch"].items():
        answers["dispatch"][key] = _answer(lambda: runtime.dispatch(config, tokens, reqs, uniform))
    for key, (config, tokens, reqs, uniform, active) in questions()["lora"].items():
        answers["lora"][key] = _answer(lambda: runtime.dispatch(config, tokens, reqs, uniform, num_active_loras=active))
    for key, request in questions()["resolve"].items():
        answers["resolve"][key] = _answer(lambda: runtime.resolve_mode(request))
    return answers


def questions() -> dict[str, dict]:
    """Every question of each kind, by a key both processes write alike (its repr)."""
    dispatch = [(c, *b) for c in dispatch_questions() for b in batches(c)]
    lora = [(c, tokens, reqs, uniform, active) for c in lora_questions()
            for tokens, active in itertools.product(range(1, 19), range(0, c.max_loras + 2))
            for reqs, uniform in ((tokens, True), (max(1, tokens // 3), False)) if not (uniform and tokens > c.max_num_seqs)]
    return {kind: {repr(q): q for q in found} for kind, found in
            (("sizes", size_questions()), ("dispatch", dispatch), ("lora", lora), ("resolve", resolve_questions()))}


# -- the rules that differ ------------------------------------------------------------------------
def _on_grid(n: int) -> bool:
    return n in (1, 2, 4) or (8 <= n <= 248 and n % 8 == 0) or (n >= 256 and n % 16 == 0)


def _extra(old, new) -> set:
    """Sizes 0.33 answers that 0.25 does not (None where either rejected, or 0.25 answers sizes 0.33 lacks)."""
    if not (isinstance(old, list) and isinstance(new, list)) or set(old) - set(new):
        return set()
    return set(new) - set(old)


# (name, kind, does it explain this differing answer: (question, 0.25's, 0.33's, same sizes?) -> bool,
#  vLLM 0.25, vLLM 0.33). A capture-size answer may need two of them: it counts under each.
RULES = [
    ("1024 cap on SM100", "sizes", lambda c, a, b, same: any(s > 512 for s in _extra(a, b)),
     "the default cap is min(2 x q x max_num_seqs, 512) on every device (config/vllm.py `_set_cudagraph_sizes`)",
     "512, or 1024 on data-center Blackwell (`is_device_capability_family(100)`)"),
    ("decode sizes appended (q = 1)", "sizes",
     lambda c, a, b, same: c.num_speculative_tokens == 0 and c.max_num_seqs in _extra(a, b),
     "the grid alone: an off-grid max_num_seqs gets no size of its own",
     "max_num_seqs appended when it is off the grid and within the cap (`uniform_decode_sizes`)"),
    ("decode sizes appended (q > 1)", "sizes",
     lambda c, a, b, same: c.num_speculative_tokens > 0 and any(s <= 512 and s % c.query_len == 0 for s in _extra(a, b)),
     "the grid alone", "n x q appended for n in the request-count grid up to max_num_seqs (`request_counts`)"),
    ("dispatch where the sizes differ", "dispatch", lambda q, a, b, same: not same(q[0]),
     "pads to 0.25's sizes", "pads to 0.33's sizes (the rules above)"),
    ("one key search across modes", "dispatch", lambda q, a, b, same: q[0].num_speculative_tokens > 0 and q[0].mode == FAP,
     "candidates for n tokens are every descriptor at the smallest size, of any mode, that holds n "
     "(v1/worker/gpu/cudagraph_utils.py `_init_candidates`): a mixed batch whose smallest holder is a decode graph "
     "runs eager, a uniform one may meet PIECEWISE before FULL",
     "FULL's descriptors at the smallest FULL size, then PIECEWISE's at the smallest PIECEWISE size"),
    ("FULL_AND_PIECEWISE without piecewise compilation", "resolve",
     lambda r, a, b, same: r.mode == FAP and not r.attention_in_splitting_ops and not r.splitting_ops_empty,
     "NONE, logged at INFO (`VllmConfig.__post_init__`: every mode that needs piecewise compilation -> NONE)",
     "FULL_DECODE_ONLY at INFO (`CUDAGraphMode.without_piecewise`), then the table for the backend"),
]
UNEXPLAINED = "not explained by a rule"


def compare(old: dict, new: dict) -> dict:
    """{rule name or 'not explained by a rule': [(question, 0.25's answer, 0.33's answer)]}, and counts."""
    asked = questions()

    def same_sizes(config: PolicyConfig) -> bool:
        key = repr(config)
        return config.mode == "NONE" or old["sizes"].get(key) == new["sizes"].get(key)

    found: dict[str, list] = {}
    for kind, keyed in asked.items():
        for key, question in keyed.items():
            if old[kind][key] == new[kind][key]:
                continue
            a, b = old[kind][key], new[kind][key]
            rules = [name for name, k, explains, _, _ in RULES if k == kind and explains(question, a, b, same_sizes)]
            if kind == "dispatch":
                rules = rules[:1]  # where the sizes differ, that is the cause
            for rule in rules or [UNEXPLAINED]:
                found.setdefault(rule, []).append((_compact(question), a, b))
    return {"asked": {kind: len(keyed) for kind, keyed in asked.items()}, "differences": found}


# -- the report -----------------------------------------------------------------------------------
def write(out: Path, old: dict, new: dict, result: dict, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    differences, asked = result["differences"], result["asked"]
    lines = ["# vLLM 0.25's CUDA-graph policy beside vLLM 0.33's", "",
             f"Written by `{command}` (scripts/vllm_versions_compare.py; set-up: scripts/setup_vllm_versions.sh). "
             f"Both answered by their own code on the CPU, each through the harness protocol and each for its "
             f"default model runner (V2): vLLM 0.25 by `{RUNTIMES['0.25']}` ({old['version']}), vLLM 0.33 by "
             f"`{RUNTIMES['0.33']}` ({new['version']}).", "",
             "Questions asked: " + ", ".join(f"{n} {k}" for k, n in asked.items())
             + f"; answers that differ: {sum(len(v) for v in differences.values())}.", "",
             "| rule | kind | answers that differ | vLLM 0.25 | vLLM 0.33 | example: question -> 0.25 / 0.33 |",
             "|---|---|---|---|---|---|"]
    for name, kind, _, then, now in RULES + [(UNEXPLAINED, "any", None, "", "")]:
        found = differences.get(name, [])
        if name == UNEXPLAINED and not found:
            continue
        example = f"`{_short(found[0][0])}` -> `{_short(found[0][1])}` / `{_short(found[0][2])}`" if found else "none found"
        lines.append(f"| {name} | {kind} | {len(found)} | {then} | {now} | {example} |")
    lines += ["", "Every other answer is the same in both releases: the grid and its user-given sizes and max, "
              "the errors, the decode and mixed keys for the same sizes, LoRA cases and their rounding, and the "
              "resolution table with the backend's support. Not compared: data parallelism (the `vllm-engine` "
              "runtime runs one rank) and the V1 runner.", ""]
    (out / "vllm-0.25-vs-0.33.md").write_text("\n".join(lines))
    (out / "vllm-0.25-vs-0.33.json").write_text(json.dumps(
        {"versions": {"0.25": old["version"], "0.33": new["version"]}, "asked": asked,
         "differences": {k: {"count": len(v), "first": [{"question": q, "0.25": a, "0.33": b} for q, a, b in v[:40]]}
                         for k, v in differences.items()}},
        indent=1))


def _compact(question) -> str:
    """A question with the fields that differ from their defaults only."""
    if isinstance(question, tuple):
        config, *batch = question
        names = ("tokens", "requests", "uniform", "active adapters")
        return f"{_compact(config)}; " + ", ".join(f"{n} {v}" for n, v in zip(names, batch))
    default = type(question)(**({"mode": question.mode, "support": question.support}
                                if isinstance(question, ResolveRequest) else {}))
    fields = {k: v for k, v in asdict(question).items() if v != asdict(default)[k] or k in ("mode", "support")}
    return f"{type(question).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def _short(value) -> str:
    if isinstance(value, list) and len(value) > 8 and all(isinstance(v, int) for v in value):
        return f"{len(value)} sizes: {value[:4]} ... {value[-2:]}".replace("]", "").replace("[", "")
    return str(value).replace("|", "/")


# -- one runner's own code against the oracle (--oracle) --------------------------------------------
def oracle_answer_all(rules: str) -> dict:
    """The oracle's answers to questions(), every question asked under `rules`."""
    from dataclasses import replace

    from harness.expectations import oracle
    from harness.vocabulary import expected_resolution, parse_rules

    release = parse_rules(rules).release

    def resolved(request: ResolveRequest):
        cell = expected_resolution(request.mode, request.support, request.num_speculative_tokens,
                                   request.attention_in_splitting_ops, request.splitting_ops_empty, vllm_version=release)
        if cell.error:
            raise ValueError("the spec's cell is an error")
        return cell

    asked = questions()
    answers = {"version": f"harness oracle, rules {rules}", "sizes": {}, "dispatch": {}, "lora": {}, "resolve": {}}
    for key, config in asked["sizes"].items():
        answers["sizes"][key] = _answer(lambda: oracle.capture_sizes(replace(config, rules=rules)))
    for key, (config, tokens, reqs, uniform) in asked["dispatch"].items():
        answers["dispatch"][key] = _answer(lambda: oracle.dispatch(replace(config, rules=rules), tokens, reqs, uniform))
    for key, (config, tokens, reqs, uniform, active) in asked["lora"].items():
        answers["lora"][key] = _answer(lambda: oracle.dispatch(replace(config, rules=rules), tokens, reqs, uniform,
                                                               num_active_loras=active))
    for key, request in asked["resolve"].items():
        answers["resolve"][key] = _answer(lambda: resolved(request))
    return answers


def compare_with_oracle(own: dict, modelled: dict) -> dict:
    asked = questions()
    found: dict[str, list] = {}
    for kind, keyed in asked.items():
        for key, question in keyed.items():
            if own[kind][key] != modelled[kind][key]:
                found.setdefault(kind, []).append((_compact(question), own[kind][key], modelled[kind][key]))
    return {"asked": {kind: len(keyed) for kind, keyed in asked.items()}, "differences": found}


def write_oracle(out: Path, rules: str, own: dict, result: dict, command: str, neighbours: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    differences, asked = result["differences"], result["asked"]
    stem = f"{rules.replace('/', '-')}-vs-oracle"
    lines = [f"# {rules}: vLLM's own code beside the harness's oracle", "",
             f"Written by `{command}` (scripts/vllm_versions_compare.py). The same questions asked of "
             f"`{ORACLE_RUNTIMES[rules]}` ({own['version']}: vLLM's own code on the CPU) and of the harness's "
             f"oracle under rules `{rules}` (`harness.expectations.oracle`, resolution: "
             "`harness.vocabulary.expected_resolution`; written from docs/spec.md section 11, not from vLLM).", "",
             "| kind | questions | answers that differ |", "|---|---|---|"]
    lines += [f"| {kind} | {n} | {len(differences.get(kind, []))} |" for kind, n in asked.items()]
    lines += ["", f"Questions asked: {sum(asked.values())}; answers that differ: "
              f"{sum(len(v) for v in differences.values())}.", "",
              "The comparison can fail: the same answers of vLLM's code against the oracle under the rules next to "
              "these differ in " + "; ".join(
                  f"{sum(len(v) for v in found.values())} (`{name}`: "
                  + ", ".join(f"{len(v)} {kind}" for kind, v in found.items()) + ")"
                  for name, found in neighbours.items()) + ".", ""]
    for kind, found in differences.items():
        lines += [f"## {kind}: first differences (question -> vLLM / oracle)", ""]
        lines += [f"- `{_short(q)}` -> `{_short(a)}` / `{_short(b)}`" for q, a, b in found[:20]] + [""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    (out / f"{stem}.json").write_text(json.dumps(
        {"rules": rules, "vllm": own["version"], "asked": asked,
         "neighbours": {name: {kind: len(v) for kind, v in found.items()} for name, found in neighbours.items()},
         "differences": {k: {"count": len(v), "first": [{"question": q, "vllm": a, "oracle": b} for q, a, b in v[:40]]}
                         for k, v in differences.items()}}, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm025", help="a folder holding vLLM 0.25's `vllm` package (put before the installed one)")
    parser.add_argument("--vllm033", default="", help="a folder holding vLLM 0.33's; default: the installed vLLM")
    parser.add_argument("--out", default="reports/policy-compare")
    parser.add_argument("--oracle", choices=sorted(ORACLE_RUNTIMES),
                        help="compare this release's runner (its own code) with the oracle, not two releases")
    parser.add_argument("--answer", choices=sorted(RUNTIMES) + sorted(ORACLE_RUNTIMES), help=argparse.SUPPRESS)
    parser.add_argument("--to", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.answer:
        Path(args.to).write_text(json.dumps(answer_all({**RUNTIMES, **ORACLE_RUNTIMES}[args.answer])))
        return 0
    if not args.vllm025:
        parser.error("--vllm025 is required: a folder with vLLM 0.25's vllm package (scripts/setup_vllm_versions.sh)")
    if args.oracle:
        return oracle_main(args)
    answers = {}
    with tempfile.TemporaryDirectory() as scratch:
        for version, folder in (("0.25", args.vllm025), ("0.33", args.vllm033)):
            start, to = time.perf_counter(), Path(scratch) / f"{version}.json"
            path = os.pathsep.join(filter(None, [folder, *map(str, PATHS), os.environ.get("PYTHONPATH", "")]))
            subprocess.run([sys.executable, __file__, "--answer", version, "--to", str(to)], check=True,
                           env={**os.environ, "PYTHONPATH": path})
            answers[version] = json.loads(to.read_text())
            print(f"vLLM {version}: {answers[version]['version']} answered in {time.perf_counter() - start:.0f}s",
                  file=sys.stderr)
    result = compare(answers["0.25"], answers["0.33"])
    command = "python scripts/vllm_versions_compare.py --vllm025 VLLM_0_25_FOLDER" + (
        " --vllm033 VLLM_0_33_FOLDER" if args.vllm033 else "") + f" --out {args.out}"
    write(Path(args.out), answers["0.25"], answers["0.33"], result, command)
    print(Path(args.out) / "vllm-0.25-vs-0.33.md")
    return 1 if UNEXPLAINED in result["differences"] else 0


def oracle_main(args) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        start, to = time.perf_counter(), Path(scratch) / "own.json"
        path = os.pathsep.join(filter(None, [args.vllm025, *map(str, PATHS), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, __file__, "--answer", args.oracle, "--to", str(to)], check=True,
                       env={**os.environ, "PYTHONPATH": path})
        own = json.loads(to.read_text())
        print(f"{args.oracle}: {own['version']} answered in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    result = compare_with_oracle(own, oracle_answer_all(args.oracle))
    command = f"python scripts/vllm_versions_compare.py --oracle {args.oracle} --vllm025 VLLM_0_25_FOLDER --out {args.out}"
    neighbours = {name: compare_with_oracle(own, oracle_answer_all(name))["differences"] for name in NEIGHBOURS[args.oracle]}
    write_oracle(Path(args.out), args.oracle, own, result, command, neighbours)
    print(Path(args.out) / f"{args.oracle.replace('/', '-')}-vs-oracle.md")
    return 1 if result["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
