"""A runtime that hangs is noticed once, not once per test.

A hang is a test phase that ran past --test-timeout: SIGALRM failed it, or (blocked in native code)
the watchdog or faulthandler ended its process. Once the runtime has hung in two tests in a row of
one kind (tests that build engines, or policy-only tests), its remaining tests of that kind are
skipped as hanging, naming the tests that hung and the timeout, instead of each waiting out its
own. A test of that kind that ends without hanging clears the count: a runtime that hangs once
recovers and runs the rest. Under xdist a hang that ended a worker is counted by the controller
and handed to the workers it starts next (harness.reliability.workers).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

IN_A_ROW = 2
ENGINE_FIXTURES = {"engines", "engine_factory", "bench_engines"}  # tests that build engines
KIND_ATTRIBUTE = "cudagraph_conformance_kind"  # on a call report whose test ended without hanging
# The name the run report registers under with pytest (harness.reports.report): reliability finds
# it by this name to write hangs and deaths into it, and imports nothing of the reports.
REPORT_PLUGIN = "cudagraph-conformance-report"
KINDS = {"engines": "tests that build engines", "policy": "policy-only tests"}


def kind_of(item) -> str | None:
    """'engines', 'policy', or None for a test that runs no runtime code."""
    names = set(getattr(item, "fixturenames", ()))
    if ENGINE_FIXTURES & names:
        return "engines"
    return "policy" if "runtime" in names else None


@dataclass(frozen=True)
class Hang:
    nodeid: str
    when: str  # setup, call or teardown
    seconds: float  # --test-timeout
    kind: str
    how: str = "SIGALRM failed it"  # or: the watchdog ended the process

    def describe(self) -> str:
        return f"{self.nodeid} ({self.when}; {self.how})"


class HangRecord:
    def __init__(self, seed=()):
        self.in_a_row: dict[str, list[Hang]] = {kind: [] for kind in KINDS}
        for hang in seed:
            self.hung(Hang(**hang))

    def hung(self, hang: Hang) -> None:
        self.in_a_row.setdefault(hang.kind, []).append(hang)

    def ended(self, kind: str | None) -> None:
        """A test of `kind` ended without hanging."""
        if kind in self.in_a_row:
            self.in_a_row[kind].clear()

    def skip_reason(self, kind: str | None, runtime_name: str) -> str | None:
        hangs = self.in_a_row.get(kind, [])
        if kind is None or len(hangs) < IN_A_ROW:
            return None
        return (f"runtime {runtime_name!r} hung in {len(hangs)} {KINDS[kind]} in a row, each past "
                f"--test-timeout={hangs[-1].seconds:g} s: {'; '.join(h.describe() for h in hangs)}. Its remaining "
                f"{KINDS[kind]} are skipped as hanging rather than each waiting out its own timeout "
                "(docs/reliability.md)")

    def as_json(self) -> list[dict]:
        return [asdict(hang) for hangs in self.in_a_row.values() for hang in hangs]
