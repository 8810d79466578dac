"""Coverage a release took away from an engine, announced once per capability.

A capability added in a release may gate tests an engine ran before under older declarations:
since 0.2.0 the steps of q > 1 tokens need `speculative_steps`, where 0.1.0 ran them for any
engine that declared `speculative` and `execution`. Such an engine would lose those tests with
nothing but skip lines; instead the run says, once per capability, how many tests it no longer
runs and since which release, and the report records it (`coverage_changes`).

GATES is the one table of such capabilities; a release that adds one adds its row here and its
entry in CHANGELOG.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    capability: str  # the new capability that now gates the tests
    since: str  # the harness release that added it
    before: tuple[str, ...]  # what ran those tests in the release before
    gates: str  # what it gates, in words


GATES = (
    Gate("speculative_steps", "0.2.0", ("speculative", "execution"),
         "the execution tests that step with q > 1 tokens (verify batches of speculative decoding)"),
)


def skipped_for(capability: str, tests: list[dict]) -> int:
    """How many tests skipped because the runtime does not declare `capability`."""
    pattern = re.compile(rf"does not declare (?:capability )?[\w, ]*\b{capability}\b")
    return sum(t.get("outcome") == "skipped" and bool(pattern.search(t.get("reason") or "")) for t in tests)


def changes(capabilities, tests: list[dict]) -> list[dict]:
    """For each gate the runtime passed before and not now: the capability, since when, how many."""
    found = []
    for gate in GATES:
        if all(capabilities.has(c) for c in gate.before) and not capabilities.has(gate.capability):
            count = skipped_for(gate.capability, tests)
            if count:
                found.append({"capability": gate.capability, "since": gate.since, "tests": count,
                              "gates": gate.gates, "before": list(gate.before)})
    return found


def describe(runtime_name: str, change: dict) -> str:
    return (f"coverage changed: {change['tests']} tests runtime {runtime_name!r} ran under harness < {change['since']} "
            f"(declaring {' and '.join(change['before'])}) now need {change['capability']} (since {change['since']}): "
            f"{change['gates']}; declare it if your engine does this (CHANGELOG.md)")
