"""Known-failure files: owned by a runtime, they turn expected failures into strict xfails (or, for
a failure that depends on what ran before it, non-strict ones: `strict = false`, bounded).

TOML, one table per entry, and optionally the harness versions the file was written for::

    harness_versions = ">=0.2,<0.3"  # a PEP 440 specifier; another version reports the file as stale

    [[failure]]
    test = "suites/test_replay_equivalence.py::test_*[mycompile-FULL*]"
    category = "notyet"          # notimpl | notyet | never
    reason = "Inductor's fused kernels differ from eager by rounding"
    max_difference = 1e-6        # optional bounds: a failure outside them is not covered
    match = "differs from eager" # a regex searched in the failure text
    raises = "Failed"            # the exception's type name
    graph_backends = ["cuda"]    # optional: only where the suites run on these graph backends
    strict = false               # optional: the failure depends on what ran before it (say which run
                                 # showed it pass); a pass is then "xpassed", not a failure

In `test`, `*` matches any text and `?` one character; everything else, brackets included, is
literal, so a parametrised id `[...]` is written as it appears in the test id.

A file whose `harness_versions` leave out the running harness still applies; it is listed with
the stale entries (the terminal summary and the report's `known_failures_files`), since suites
change between versions and its entries may no longer say what the suites find.
"""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet

import harness
from harness.vocabulary import GRAPH_BACKENDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CATEGORIES = {
    "notimpl": "the runtime does not implement this yet",
    "notyet": "implemented, but wrong for now",
    "never": "by design the runtime will never do this",
}
BOUNDS = ("match", "max_difference", "raises")
DIFFERENCE_KEY = pytest.StashKey[float]()  # the largest numeric deviation a test's checks saw


class KnownFailuresError(ValueError):
    pass


@functools.lru_cache(maxsize=None)  # matched against every collected test
def pattern_regex(pattern: str) -> re.Pattern:
    """`*` is any text, `?` one character, the rest literal."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z",
                      re.DOTALL)


@dataclass(frozen=True)
class KnownFailure:
    test: str
    category: str
    reason: str
    source: str  # file:entry number, for messages
    graph_backends: tuple[str, ...] = ()  # empty: everywhere
    match: str | None = None
    max_difference: float | None = None
    raises: str | None = None
    strict: bool = True  # False: the failure comes and goes with what ran before it; a pass is not an error

    def applies_to(self, graph_backend: str | None) -> bool:
        return not self.graph_backends or graph_backend in self.graph_backends

    def matches(self, nodeid: str) -> bool:
        return bool(pattern_regex(self.test).match(nodeid))

    def file_part_matches(self, nodeid: str) -> bool:
        return bool(pattern_regex(self.test.split("::")[0]).match(nodeid.split("::")[0]))

    def describe(self) -> str:
        return f"known failure [{self.category}] {self.reason} ({self.source})"

    def uncovered(self, exception: BaseException | None, text: str, difference: float | None) -> str | None:
        """Why a failure falls outside this entry's bounds; None when the entry covers it."""
        if self.raises and (exception is None or type(exception).__name__ != self.raises):
            return f"it raised {type(exception).__name__ if exception else 'nothing'}, the entry allows {self.raises}"
        if self.match and not re.search(self.match, text):
            return f"its text does not match {self.match!r}"
        if self.max_difference is not None:
            if difference is None:
                return f"the entry allows differences up to {self.max_difference:g}, and this failure is not one"
            if not difference <= self.max_difference:
                return f"the largest difference {difference:.3g} is above the entry's max_difference {self.max_difference:g}"
        return None

    def likely_cause(self) -> str:
        if "[[]" in self.test or "[]]" in self.test:
            return "it uses fnmatch's escapes '[[]' / '[]]'; brackets are literal here, write '[' and ']'"
        if "[" in self.test:
            return "the part in brackets must equal the test id's parameters, runtime name first"
        return "the test was renamed, or the file moved"


@dataclass(frozen=True)
class KnownFailuresFile:
    path: str
    entries: tuple[KnownFailure, ...]
    harness_versions: str | None = None  # a PEP 440 specifier set; None: any version

    def version_stale(self, version: str = harness.__version__) -> str | None:
        """Why the file may be out of date for this harness version; None when it was written for it."""
        if self.harness_versions is None or SpecifierSet(self.harness_versions).contains(version, prereleases=True):
            return None
        return (f"written for harness versions {self.harness_versions}, and this is {version}: check that its "
                "entries still hold, then update harness_versions")


def read(path: str | Path) -> KnownFailuresFile:
    path = Path(path)
    if not path.is_file():
        raise KnownFailuresError(f"known-failures file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KnownFailuresError(f"known-failures file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"failure", "harness_versions"}
    if unknown:
        raise KnownFailuresError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[failure]] tables "
                                 "and, optionally, harness_versions")
    entries = tuple(_entry(raw, f"{path}:failure #{number}") for number, raw in enumerate(data.get("failure", []), start=1))
    return KnownFailuresFile(str(path), entries, _versions(data.get("harness_versions"), path))


def load(path: str | Path) -> list[KnownFailure]:
    return list(read(path).entries)


def _versions(value, path: Path) -> str | None:
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise InvalidSpecifier(value)
        SpecifierSet(value)
    except InvalidSpecifier:
        raise KnownFailuresError(f"{path}: harness_versions must be a version specifier string such as "
                                 f"\">=0.1,<0.2\" or \"==0.1.*\" (PEP 440), got {value!r}") from None
    return value


def _entry(raw: dict, where: str) -> KnownFailure:
    missing = {"test", "category", "reason"} - set(raw)
    if missing:
        raise KnownFailuresError(f"{where} is missing {sorted(missing)}; each entry needs test, category and reason")
    extra = set(raw) - {"test", "category", "reason", "graph_backends", "strict", *BOUNDS}
    if extra:
        raise KnownFailuresError(f"{where} has unknown keys {sorted(extra)}; allowed besides test, category and "
                                 f"reason: graph_backends, strict, {', '.join(BOUNDS)}")
    strict = raw.get("strict", True)
    if not isinstance(strict, bool):
        raise KnownFailuresError(f"{where}: strict must be true or false, got {strict!r}")
    if not strict and not any(key in raw for key in BOUNDS):
        raise KnownFailuresError(f"{where}: strict = false needs a bound ({', '.join(BOUNDS)}): a failure that may "
                                 "come and go must still be the one the entry describes")
    if raw["category"] not in CATEGORIES:
        raise KnownFailuresError(f"{where} has category {raw['category']!r}; expected one of {', '.join(CATEGORIES)}")
    if not str(raw["reason"]).strip():
        raise KnownFailuresError(f"{where} has an empty reason; say why the runtime fails")
    backends = raw.get("graph_backends", [])
    if not isinstance(backends, list) or not set(backends) <= set(GRAPH_BACKENDS):
        raise KnownFailuresError(f"{where}: graph_backends must be a list of 'cuda' and 'emulated', got {backends!r}")
    if "match" in raw:
        try:
            re.compile(raw["match"])
        except (re.error, TypeError) as exc:
            raise KnownFailuresError(f"{where}: match {raw['match']!r} is not a regular expression ({exc})") from None
    bound = raw.get("max_difference")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound < 0):
        raise KnownFailuresError(f"{where}: max_difference must be a number >= 0, got {bound!r}")
    return KnownFailure(str(raw["test"]), raw["category"], str(raw["reason"]).strip(), where, tuple(backends),
                        raw.get("match"), None if bound is None else float(bound), raw.get("raises"), strict)


def stale(entries: list[KnownFailure], nodeids: list[str]) -> list[KnownFailure]:
    """Entries that match no collected test, among the files this run collected."""
    return [entry for entry in entries
            if not any(entry.matches(n) for n in nodeids) and any(entry.file_part_matches(n) for n in nodeids)]


ENTRY_KEY = pytest.StashKey[list]()  # every entry matching the test, in file order


class KnownFailurePlugin:
    """Marks known failures as strict xfails, holds them to their bounds, and reports stale
    entries and how many tests each entry covered."""

    def __init__(self, entries: list[KnownFailure], files: list[KnownFailuresFile] = ()):
        self.entries = entries
        self.files = list(files)
        self.stale: set[str] = set()
        self.covered: dict[str, int] = {entry.source: 0 for entry in entries}

    @classmethod
    def from_config(cls, config, runtime, graph_backend: str | None) -> "KnownFailurePlugin":
        paths = list(config.getoption("known_failures"))
        own = getattr(runtime, "known_failures", None)
        if own and str(own) not in paths:
            paths.insert(0, str(own))
        files = [read(path) for path in paths]
        entries = [entry for file in files for entry in file.entries]
        return cls([entry for entry in entries if entry.applies_to(graph_backend)], files)

    def as_report(self) -> list[dict]:
        """Each file for the JSON report: its versions, whether they are stale, its stale entries and
        how many tests each entry covered."""
        return [{"path": file.path, "harness_versions": file.harness_versions, "stale": file.version_stale(),
                 "stale_entries": [{"entry": entry.source, "test": entry.test, "likely_cause": entry.likely_cause()}
                                   for entry in file.entries if entry.source in self.stale],
                 "covered": {entry.source: self.covered.get(entry.source, 0) for entry in file.entries}}
                for file in self.files]

    def pytest_collection_modifyitems(self, config, items):
        for item in items:
            if item.get_closest_marker("skip") is not None:
                continue
            matching = [entry for entry in self.entries if entry.matches(item.nodeid)]
            if matching:
                item.stash[ENTRY_KEY] = matching
                item.add_marker(pytest.mark.xfail(strict=matching[0].strict, reason=matching[0].describe()))
        # A run given single node ids (`file.py::test`) leaves the rest of the file out: it cannot
        # tell a stale entry from an unselected test, so it reports none.
        if not any("::" in arg for arg in config.args):
            self.stale = {entry.source for entry in stale(self.entries, [item.nodeid for item in items])}
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller prints the summary
            config.workeroutput["cudagraph_stale_known_failures"] = sorted(self.stale)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        # The controller collects nothing; a worker saw the whole collection, before -k deselected.
        stale_sources = getattr(node, "workeroutput", {}).get("cudagraph_stale_known_failures")
        if stale_sources is not None:
            self.stale = set(stale_sources)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: sees the report after xfail handling
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        matching = item.stash.get(ENTRY_KEY, None)
        if not matching or rep.when != "call":
            return
        if rep.failed and "XPASS(strict)" in str(rep.longrepr):
            entry = matching[0]
            rep.longrepr = f"{rep.longrepr}\nThis test now passes: remove its entry {entry.test!r} from {entry.source}."
            return
        if rep.skipped and hasattr(rep, "wasxfail") and call.excinfo is not None:
            text = str(rep.longrepr)
            reasons = [(entry, entry.uncovered(call.excinfo.value, text, item.stash.get(DIFFERENCE_KEY, None)))
                       for entry in matching]
            covering = next((entry for entry, why in reasons if why is None), None)
            if covering is None:  # no entry's bounds describe this failure: it is a failure
                del rep.wasxfail
                rep.outcome = "failed"
                rep.longrepr = text + "".join(f"\n\nNot covered by known failure {entry.source} ({entry.test!r}): {why}."
                                              for entry, why in reasons)
            else:
                rep.wasxfail = covering.describe()

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.skipped and hasattr(report, "wasxfail"):
            entry = next((e for e in self.entries if e.describe() == report.wasxfail), None)
            if entry is not None:
                self.covered[entry.source] += 1

    def pytest_terminal_summary(self, terminalreporter):
        stale_entries = [e for e in self.entries if e.source in self.stale]
        stale_files = [(file.path, file.version_stale()) for file in self.files if file.version_stale()]
        if stale_entries or stale_files:
            terminalreporter.section("stale known failures")
            for path, why in stale_files:
                terminalreporter.write_line(f"{path}: {why}")
            for entry in stale_entries:
                terminalreporter.write_line(f"{entry.source}: {entry.test!r} matches no test; {entry.likely_cause()}")
        if any(self.covered.values()):
            terminalreporter.section("known failures")
            for entry in self.entries:
                if self.covered[entry.source]:
                    terminalreporter.write_line(f"{self.covered[entry.source]:>4} covered by {entry.source} "
                                                f"[{entry.category}] {entry.reason[:100]}")


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "CATEGORIES", "BOUNDS", "KnownFailuresError", "KnownFailure", "KnownFailuresFile", "read",
    "load", "stale",
]
