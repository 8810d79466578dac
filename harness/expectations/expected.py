"""Where the execution suites get what an engine should have done, and which source said so.

Never from the engine under test: under vLLM's rules (`vllm_rules`) from the spec and the oracle; otherwise
from the runtime's own declared policy (`resolve_mode()`, `dispatch()`, `capture_sizes()`),
checked against what its engine did. Only where a runtime declares no policy at all is the
engine's own report used, and then the source says so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from harness.expectations import oracle
from harness.protocol import Descriptor, PolicyConfig, ResolveRequest
from harness.vocabulary import (ORACLE, OWN_POLICY, RUNTIME_WORD, SPEC, SPEC_RELEASE, SUPPORT_LEVELS, VLLM_RELEASES, rules_name,
                                expected_resolution, weakest)


@dataclass(frozen=True)
class Expected:
    value: object
    source: str


def vllm_rules(runtime, config: PolicyConfig) -> PolicyConfig:
    """A vLLM case as the runtime's declared rules answer it: in its release (Capabilities.rules, "vllm-RELEASE"),
    and, where the case names a runner that release is not modelled for here, in its first runner.
    (A written-out case naming such a runner is skipped at collection: plugin.vllm_rules_skip.)"""
    release = runtime.capabilities.vllm_release
    runners = runtime.capabilities.vllm_runners or VLLM_RELEASES[release].runners
    runner = config.vllm_runner if config.vllm_runner in runners else runners[0]
    return replace(config, rules=rules_name("vllm", release, runner))


def by_release(runtime, spec_value, per_release: dict | None = None, config: PolicyConfig | None = None):
    """A spec value written for vLLM 0.33, or the one the spec gives the runtime's declared release
    where that release differs (docs/spec.md section 11). Given the case's config (as vllm_rules
    answers it), a value under "RELEASE/RUNNER" ("0.25/v1") is that runner's, before the release's."""
    release = runtime.capabilities.vllm_release
    if release == SPEC_RELEASE:
        return spec_value
    values = per_release or {}
    value = values.get(f"{release}/{config.vllm_runner}") if config is not None else None
    value = values.get(release) if value is None else value
    return spec_value if value is None else value


def support_of(runtime, attention: tuple[str, ...]) -> str | None:
    """The weakest declared support level among the named backends; None if any is undeclared."""
    declared = dict(runtime.capabilities.attention_backends)
    if not attention or not all(name in declared for name in attention):
        return None
    return weakest(declared[name] for name in attention)


def resolution(runtime, mode: str, attention: tuple[str, ...], spec: int, engine=None) -> Expected:
    """The config mode an engine built with these backends should resolve to ("error": rejected)."""
    support = support_of(runtime, attention)
    caps = runtime.capabilities
    if support is not None and caps.has("vllm_rules"):
        cell = expected_resolution(mode, support, num_speculative_tokens=spec)
        return Expected("error" if cell.error else cell.resolved, SPEC)
    if support is not None and caps.mode_resolution:
        try:
            return Expected(runtime.resolve_mode(ResolveRequest(mode, support, spec)).resolved, OWN_POLICY)
        except ValueError:
            return Expected("error", OWN_POLICY)
    if engine is None:
        return Expected(None, RUNTIME_WORD)
    return Expected(engine.resolution.resolved, RUNTIME_WORD)


def graph_keys(runtime, policy: PolicyConfig) -> Expected | None:
    """{"FULL": set of keys, "PIECEWISE": set of keys} for a resolved policy; None if unknowable."""
    if runtime.capabilities.has("vllm_rules"):
        return Expected(oracle.graph_keys(policy), ORACLE)
    if not (runtime.capabilities.dispatch and runtime.capabilities.capture_sizes):
        return None
    return Expected(dispatched_keys(runtime, policy), OWN_POLICY)


def dispatched_keys(runtime, policy: PolicyConfig) -> dict[str, set[Descriptor]]:
    """Every distinct graph key the runtime's own dispatch() returns for batches up to its largest
    size: uniform ones (q tokens a request) and mixed ones of every request count."""
    keys: dict[str, set[Descriptor]] = {"FULL": set(), "PIECEWISE": set()}
    sizes = runtime.capture_sizes(policy)
    q, seqs = policy.query_len, policy.max_num_seqs
    for tokens in range(1, max(sizes, default=0) + 1):
        batches = [(tokens, reqs, False) for reqs in range(1, min(tokens, seqs) + 1)]
        if tokens % q == 0 and tokens // q <= seqs:
            batches.append((tokens, tokens // q, True))
        for n, reqs, uniform in batches:
            answer = runtime.dispatch(policy, n, reqs, uniform)
            if answer.runtime_mode != "NONE":
                keys[answer.runtime_mode].add(answer.descriptor)
    return keys


def pieces_per_size(report) -> int | None:
    """PIECEWISE graphs per captured key, from a capture report; None if it has none, or if its
    count does not divide evenly among its keys. A size has a key per LoRA case (each listed in the
    capture order), so keys, not distinct sizes, share the count."""
    sizes = [n for mode, n in report.order if mode == "PIECEWISE"]
    pieces = report.graphs.get("PIECEWISE", 0)
    return pieces // len(sizes) if sizes and pieces % len(sizes) == 0 else None


def graph_launches(runtime_mode: str, pieces: int | None) -> int | None:
    """Graph launches a step of this runtime mode makes: none eager, one FULL, one per piece
    PIECEWISE (None: the piece count is unknown, and two or more is all that can be said)."""
    return {"NONE": 0, "FULL": 1, "PIECEWISE": pieces}[runtime_mode]


def launches_problem(runtime_mode: str, pieces: int | None, seen: int) -> str | None:
    """What is wrong with a step reported as `runtime_mode` after which the harness counted `seen`
    graph launches (None: nothing). The one rule for steps of any engine, ranks' included."""
    launches = graph_launches(runtime_mode, pieces)
    if launches is None:
        return None if seen >= 2 else "a PIECEWISE step launches one graph per piece (two or more)"
    return None if seen == launches else f"a step reported as {runtime_mode} must launch {launches} graph(s)"


def eager_step_problem(runtime_mode: str, padded: int, asked: int, seen: int) -> str | None:
    """What is wrong with an eager_step(num_padded_tokens=asked) that reported `runtime_mode` at
    `padded` after `seen` graph launches (None: nothing): it must run eager, at that size, no graph."""
    if (runtime_mode, padded, seen) == ("NONE", asked, 0):
        return None
    return (f"eager_step(num_padded_tokens={asked}) must run eager at that size: it ran {runtime_mode} at "
            f"{padded} with {seen} graph launches")


def default_attention(runtime) -> tuple[str, ...]:
    """The strongest declared backend (so expectations know its level); () where none is declared."""
    declared = sorted(runtime.capabilities.attention_backends, key=lambda b: SUPPORT_LEVELS.index(b[1]))
    return (declared[0][0],) if declared else ()
