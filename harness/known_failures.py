"""Known-failure files: owned by a runtime, they turn expected failures into strict xfails.

TOML, one table per entry::

    [[failure]]
    test = "suites/test_padding.py::test_padded_rows_write_no_kv_slot*"
    category = "notyet"      # notimpl | notyet | never
    reason = "padded rows write slot 0; fix tracked in engine#123"
    graph_backends = ["cuda"]  # optional: only where the suites run on these graph backends
"""
from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CATEGORIES = {
    "notimpl": "the runtime does not implement this yet",
    "notyet": "implemented, but wrong for now",
    "never": "by design the runtime will never do this",
}


class KnownFailuresError(ValueError):
    pass


@dataclass(frozen=True)
class KnownFailure:
    test: str  # node-id pattern (fnmatch)
    category: str
    reason: str
    source: str  # file:entry number, for messages
    graph_backends: tuple[str, ...] = ()  # empty: everywhere

    def applies_to(self, graph_backend: str) -> bool:
        return not self.graph_backends or graph_backend in self.graph_backends

    def matches(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.test) or nodeid == self.test

    def file_part_matches(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid.split("::")[0], self.test.split("::")[0])

    def describe(self) -> str:
        return f"known failure [{self.category}] {self.reason} ({self.source})"


def load(path: str | Path) -> list[KnownFailure]:
    path = Path(path)
    if not path.is_file():
        raise KnownFailuresError(f"known-failures file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise KnownFailuresError(f"known-failures file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"failure"}
    if unknown:
        raise KnownFailuresError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[failure]] tables")
    entries = []
    for number, raw in enumerate(data.get("failure", []), start=1):
        where = f"{path}:failure #{number}"
        missing = {"test", "category", "reason"} - set(raw)
        if missing:
            raise KnownFailuresError(f"{where} is missing {sorted(missing)}; each entry needs test, category and reason")
        if raw["category"] not in CATEGORIES:
            raise KnownFailuresError(
                f"{where} has category {raw['category']!r}; expected one of {', '.join(CATEGORIES)}"
            )
        if not str(raw["reason"]).strip():
            raise KnownFailuresError(f"{where} has an empty reason; say why the runtime fails")
        backends = raw.get("graph_backends", [])
        if not isinstance(backends, list) or not set(backends) <= {"cuda", "emulated"}:
            raise KnownFailuresError(f"{where}: graph_backends must be a list of 'cuda' and 'emulated', got {backends!r}")
        entries.append(KnownFailure(str(raw["test"]), raw["category"], str(raw["reason"]).strip(), where,
                                    tuple(backends)))
    return entries


def first_match(entries: list[KnownFailure], nodeid: str) -> KnownFailure | None:
    return next((entry for entry in entries if entry.matches(nodeid)), None)


def stale(entries: list[KnownFailure], nodeids: list[str]) -> list[KnownFailure]:
    """Entries that match no collected test, among the files this run collected."""
    return [
        entry
        for entry in entries
        if not any(entry.matches(n) for n in nodeids) and any(entry.file_part_matches(n) for n in nodeids)
    ]
