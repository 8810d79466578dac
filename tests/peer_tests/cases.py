"""Load the peer cases and check one against a calculator.

A case is one engine test (or one parameter or assert group of it): `test` names it, `status` is
`translated` or `not_modelled` (then `reason` says why), `question` says what the calculator is
asked; the other fields are the inputs and the engine's expected values, taken from its asserts.
check() returns the disagreements, each one line naming what was asked, the engine's value and the
calculator's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.vocabulary import ROUTINES

from .calculators import Calculator, sizes_of

ROOT = Path(__file__).parent
# release -> (engine, its version, the folder of its cases); vLLM's releases keep their bare names
ENGINES = {
    "0.33": ("vLLM", "0.33.0", "vllm-0.33"),
    "0.25": ("vLLM", "0.25.0", "vllm-0.25"),
    "sglang-0.5.23": ("SGLang", "0.5.23", "sglang-0.5.23"),
    "lmdeploy-0.18.0": ("LMDeploy", "0.18.0", "lmdeploy-0.18.0"),
}
RELEASES = tuple(ENGINES)
STATUSES = ("translated", "not_modelled")


@dataclass(frozen=True)
class PeerFile:
    release: str
    path: Path  # the data file
    file: str  # the engine's test file, from its repository's root
    about: str
    cases: tuple[dict, ...]
    source: str = ""  # where the test was read, where that is not the release's source distribution

    @property
    def engine(self) -> str:
        return ENGINES[self.release][0]

    @property
    def vllm_file(self) -> str:  # the name the vLLM-only data used
        return self.file

    @property
    def citation(self) -> str:
        engine, version, _ = ENGINES[self.release]
        return f"{engine} {version} {self.file}"


def load(release: str) -> list[PeerFile]:
    files = []
    for path in sorted((ROOT / ENGINES[release][2]).glob("*.json")):
        data = json.loads(path.read_text())
        files.append(PeerFile(release, path, data.get("vllm_file") or data["file"], data.get("about", ""),
                              tuple(data["cases"]), data.get("source", "")))
    return files


def case_id(peer: PeerFile, case: dict) -> str:
    return f"{peer.release}:{peer.file.removeprefix('tests/')}::{case['test']}"


def check(calculator: Calculator, case: dict) -> list[str]:
    """vLLM's expected values against the calculator's answers: [] when they all agree."""
    try:
        return QUESTIONS[case["question"]](calculator, case)
    except ValueError as exc:  # the calculator refused inputs vLLM accepts
        return [f"the calculator refused the inputs: {exc}"]


def _differ(what: str, vllm, ours, engine: str = "vLLM") -> list[str]:
    return [] if vllm == ours else [f"{what}: {engine} {vllm!r}, calculator {ours!r}"]


def _sizes(calc: Calculator, case: dict) -> list[str]:
    expect = case["expect"]
    try:
        sizes = calc.capture_sizes(case["config"])
    except ValueError as exc:
        return [] if expect.get("error") else [f"capture sizes: vLLM accepts the config, the calculator refused it: {exc}"]
    if expect.get("error"):
        return [f"capture sizes: vLLM rejects the config, the calculator answered {sizes}"]
    found = []
    if "sizes" in expect:
        found += _differ("capture sizes", expect["sizes"], sizes)
    if "max" in expect:
        found += _differ("max capture size", expect["max"], max(sizes, default=0))
    found += [f"capture sizes lack {s}, which vLLM captures" for s in expect.get("contains", []) if s not in sizes]
    found += [f"capture sizes hold {s}, which vLLM does not capture" for s in expect.get("excludes", []) if s in sizes]
    for tier in expect.get("decode_widest", []):  # the most requests a decode graph of that q can hold
        q, most = tier["query_len"], case["config"]["max_num_seqs"]
        widest = max((-(-s // q) for s in sizes if -(-s // q) <= most), default=0)
        if widest < tier.get("at_least", 0) or widest != tier.get("equals", widest):
            found.append(f"decode graphs of q={q} hold at most {widest} requests; vLLM: {tier}")
    if "all_at_most" in expect and sizes and max(sizes) > expect["all_at_most"]:
        found.append(f"capture sizes go up to {max(sizes)}, vLLM keeps them <= {expect['all_at_most']}")
    if "resolve" in case:
        found += _differ("resolved mode", case["resolve"]["expect"], calc.resolve(case["resolve"]["request"]))
    return found


def _key_matches(expect: dict, key: dict) -> list[str]:
    return [f"key {field}: vLLM {value!r}, calculator {key.get(field)!r}" for field, value in expect.items()
            if key.get(field) != value]


def _dispatch_one(calc: Calculator, config: dict, batch: dict) -> list[str]:
    expect = batch["expect"]
    allowed = tuple(batch["allowed_modes"]) if "allowed_modes" in batch else None
    mode, key = calc.dispatch(config, batch["num_tokens"], batch.get("num_reqs"), batch.get("uniform", False), allowed)
    label = (f"{batch['num_tokens']} tokens, {batch.get('num_reqs')} reqs, "
             f"{'uniform' if batch.get('uniform') else 'mixed'}{', allowed ' + str(list(allowed)) if allowed else ''}")
    found = _differ(f"{label}: mode", expect["mode"], mode)
    found += [f"{label}: {line}" for line in _key_matches(expect.get("key", {}), key)]
    if "key_tokens_at_least" in expect and key["num_tokens"] < expect["key_tokens_at_least"]:
        found.append(f"{label}: key of {key['num_tokens']} tokens cannot hold the batch")
    return found


def _dispatch(calc: Calculator, case: dict) -> list[str]:
    config, found = case["config"], []
    if "expect_keys" in case:
        found += _differ("keys per runtime mode", case["expect_keys"],
                         {m: n for m, n in calc.key_counts(config).items() if m in case["expect_keys"]})
    if "expect_decode_only_sizes" in case:
        sizes = calc.key_sizes(config)
        found += _differ("sizes with only a decode graph", case["expect_decode_only_sizes"],
                         sorted(sizes["FULL"] - sizes["PIECEWISE"]))
    batches = list(case.get("batches", []))
    q = 1 + config.get("num_speculative_tokens", 0)
    sizes = sorted(sizes_of(config.get("capture_sizes")) or ())
    if "uniform_sweep" in case:  # every uniform batch runs FULL at the smallest size that holds it
        for reqs in range(1, case["uniform_sweep"]["max_reqs"] + 1):
            size = min(s for s in sizes if s >= reqs * q)
            batches.append({"num_tokens": reqs * q, "num_reqs": reqs, "uniform": True,
                            "expect": {"mode": "FULL", "key": {"num_tokens": size, "num_reqs": size // q}}})
    if "shorter_query_sweep" in case:  # uniform by shape with fewer than q tokens each: not a decode batch
        sweep = case["shorter_query_sweep"]
        most, stride = sweep["max_reqs"], sweep.get("stride", 1)
        for reqs in sorted(set(range(1, most + 1, stride)) | {most}):
            for query_len in range(1, q):
                uniform = calc.is_uniform_decode([query_len] * reqs, q)
                batches.append({"num_tokens": reqs * query_len, "num_reqs": reqs, "uniform": uniform,
                                "expect": {"mode": "PIECEWISE", "key": {"num_tokens": reqs * query_len,
                                                                        "num_reqs": None, "uniform": False,
                                                                        "num_active_loras": 0}}})
    if "query_len_sweep" in case:  # every request count at every q up to the largest: FULL where a graph has that q
        sweep = case["query_len_sweep"]
        lens = calc.decode_query_lens(config)
        most, stride = sweep["max_reqs"], sweep.get("stride", 1)
        for reqs in sorted(set(range(1, most + 1, stride)) | {most}):
            for query_len in range(1, q + 1):
                tokens, full = reqs * query_len, query_len in sweep["full_for"]
                key = {"num_tokens": tokens, "num_reqs": reqs if full else None, "uniform": full, "num_active_loras": 0}
                batches.append({"num_tokens": tokens, "num_reqs": reqs, "uniform": query_len in lens,
                                "expect": {"mode": "FULL" if full else "PIECEWISE", "key": key}})
    if "expect_decode_query_lens" in case:
        keys = calc.full_decode_keys(config)
        found += _differ("q of the decode graphs", case["expect_decode_query_lens"],
                         sorted({k["num_tokens"] // k["num_reqs"] for k in keys}))
    if case.get("every_decode_key_reachable"):  # each decode graph is what its own batch dispatches to
        keys = sorted(calc.full_decode_keys(config), key=lambda k: (k["num_tokens"], k["num_reqs"]))
        sizes = [k["num_tokens"] for k in keys]
        found += _differ("a size holds decode graphs of several q", True, len(sizes) > len(set(sizes)))
        batches += [{"num_tokens": k["num_tokens"], "num_reqs": k["num_reqs"], "uniform": True,
                     "expect": {"mode": "FULL", "key": k}} for k in keys]
    for batch in batches:
        found += _dispatch_one(calc, config, batch)
        if len(found) > 5:
            return found[:5] + ["(more disagreements left out)"]
    return found


def _capture_order(calc: Calculator, case: dict) -> list[str]:
    order = calc.capture_order(case["config"], case.get("initialized", True))
    found = _differ("capture modes in order", case["expect"]["modes"], [mode for mode, _ in order])
    for mode, keys in order:  # vLLM: largest first, and one kind of key (uniform or not) per mode
        tokens = [k["num_tokens"] for k in keys]
        found += _differ(f"{mode} capture order (largest first)", sorted(tokens, reverse=True), tokens)
        found += _differ(f"{mode} keys of one kind", 1, len({k["uniform"] for k in keys}))
    return found


def _graph_count(calc: Calculator, case: dict) -> list[str]:
    counts = calc.key_counts(case["config"])
    graphs = counts["FULL"] + case["pieces_per_size"] * counts["PIECEWISE"]
    return _differ("graphs captured", case["expect"], graphs)


def _resolve(calc: Calculator, case: dict) -> list[str]:
    expect, found = case["expect"], []
    for request in case["requests"]:
        resolved = calc.resolve(request)
        label = ", ".join(f"{k}={v}" for k, v in request.items())
        if "error" in expect:
            found += _differ(f"{label}: rejected", expect["error"], resolved == "error")
        if "resolved" in expect:
            found += _differ(f"{label}: resolved", expect["resolved"], resolved)
        if "decode" in expect:
            routines = ROUTINES.get(resolved, (None, None))
            found += _differ(f"{label}: decode routine", expect["decode"], routines[0])
            if routines[1] == expect["mixed_not"]:
                found.append(f"{label}: mixed routine is {routines[1]}, which vLLM rules out")
    return found


def _dispatcher_refuses(calc: Calculator, case: dict) -> list[str]:
    return _differ(f"a dispatcher for {case['mode']} without piecewise capture refuses",
                   True, calc.dispatcher_refuses(case["mode"], case["piecewise_capture"]))


def _config_mode(calc: Calculator, case: dict) -> list[str]:
    return _differ("config mode", case["expect"], calc.config_mode(case["inputs"]))


def _defaults(calc: Calculator, case: dict) -> list[str]:
    found = calc.defaults(case["inputs"])
    return [line for field, value in case["expect"].items() for line in _differ(field, value, found[field])]


def _compile_sizes(calc: Calculator, case: dict) -> list[str]:
    expect = case["expect"]
    try:
        sizes = calc.compile_sizes(case["inputs"])
    except ValueError as exc:
        if "error" in expect:
            return _differ("the error says", True, expect["error"] in str(exc))
        return [f"compile_sizes: vLLM accepts them, the calculator refused: {exc}"]
    if "error" in expect:
        return [f"compile_sizes: vLLM refuses them, the calculator answered {sizes}"]
    return _differ("compile sizes", expect["sizes"], sizes)


def _uniform(calc: Calculator, case: dict) -> list[str]:
    return _differ("uniform token count", case["expect"], calc.uniform(case["requests"]))


def _runs_as_decode(calc: Calculator, case: dict) -> list[str]:
    found = {name: calc.runs_as_decode(*request) for name, request in case["prompt_requests"].items()}
    return _differ("prompt steps that run as a decode", case["expect"], found)


def _weakest(calc: Calculator, case: dict) -> list[str]:
    return _differ("the model's support level", case["expect"], calc.weakest(case["levels"]))


def _lmdeploy_sizes(calc, case: dict) -> list[str]:
    return _differ("capture batch sizes", case["expect"]["sizes"], calc.capture_sizes(case["config"]), "LMDeploy")


def _lmdeploy_user_sizes(calc, case: dict) -> list[str]:
    inputs = case["inputs"]
    try:
        sizes = calc.user_sizes(inputs["sizes"], inputs["max_batch_size"])
    except ValueError:
        return [] if case["expect"].get("error") else [f"{inputs}: LMDeploy accepts them, the calculator refused"]
    if case["expect"].get("error"):
        return [f"{inputs}: LMDeploy rejects them, the calculator answered {sizes}"]
    return _differ("capture batch sizes", case["expect"]["sizes"], sizes, "LMDeploy")


def _lmdeploy_dispatch(calc, case: dict) -> list[str]:
    found = []
    for batch in case["batches"]:
        mode, graph = calc.dispatch(case["config"], batch["batch_size"])
        found += _differ(f"{batch['batch_size']} requests: mode", batch["expect"]["mode"], mode, "LMDeploy")
        found += _differ(f"{batch['batch_size']} requests: graph", batch["expect"]["graph"], graph, "LMDeploy")
    return found


def _sglang_prefill(calc, case: dict) -> list[str]:
    found = []
    for batch in case["batches"]:
        mode, graph = calc.prefill(case["graphs"], batch["num_tokens"], batch["num_reqs"])
        label = f"extend batch of {batch['num_tokens']} tokens, {batch['num_reqs']} reqs"
        found += _differ(f"{label}: mode", batch["expect"]["mode"], mode, "SGLang")
        if "graph" in batch["expect"]:
            found += _differ(f"{label}: graph tokens", batch["expect"]["graph"], graph, "SGLang")
    return found


QUESTIONS = {
    "sizes": _sizes, "dispatch": _dispatch, "capture_order": _capture_order, "graph_count": _graph_count,
    "resolve": _resolve, "dispatcher_refuses": _dispatcher_refuses, "config_mode": _config_mode,
    "defaults": _defaults, "compile_sizes": _compile_sizes, "uniform": _uniform,
    "runs_as_decode": _runs_as_decode, "weakest": _weakest,
    "lmdeploy_sizes": _lmdeploy_sizes, "lmdeploy_user_sizes": _lmdeploy_user_sizes,
    "lmdeploy_dispatch": _lmdeploy_dispatch, "sglang_prefill": _sglang_prefill,
}
