"""What suites measure, as typed records: the `record` fixture takes one of these, the JSON report
stores them under each test, and harness.reports.measurements reads them back.

The report carries `schema_version`. Reports written before records existed (version 1: raw
`properties` named after the kinds below) are converted here, in one place; anything newer
than this code is refused with a message.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, asdict, dataclass, fields
from typing import ClassVar

SCHEMA_VERSION = 2


@dataclass
class Record:
    kind: ClassVar[str]

    def as_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}


@dataclass
class Grid(Record):
    kind = "grid"
    config: str
    sizes: list[int]


@dataclass
class ResolutionCell(Record):
    kind = "resolution"
    variant: str
    requested: str
    support: str
    resolved: str


@dataclass
class Capture(Record):
    kind = "capture"
    mode: str
    preset: str
    graphs: dict
    seconds: float
    memory_bytes: int | None = None  # None where the runtime cannot measure it (CaptureReport)
    graph_backend: str = "cuda"  # emulator figures are the emulator's, not a GPU's
    observed_captures: int | None = None  # graphs the harness saw captured
    unavailable: dict | None = None  # figure -> why the runtime cannot give it


@dataclass
class Launches(Record):
    kind = "launches"
    batch: int
    counts: dict  # runtime mode -> harness.graphs.counting.Submissions as a dict
    graph_backend: str = "cuda"


@dataclass
class Latency(Record):
    kind = "latency"
    mode: str
    batch: int
    padded: int
    runtime_mode: str
    step_ms_median: float
    step_ms_min: float
    step_ms_iqr: float | None = None
    step_ms_cv: float | None = None
    replay_ms_median: float | None = None  # device time of a step's graph replays, steps issued back to back
    pipelined_ms: float | None = None  # per step in a stream of steps: host work overlaps the last step's kernels
    eager_kernel_ms: float | None = None  # summed GPU kernel time of an eager step at the padded shape
    kernel_launches: int | None = None
    graph_launches: int | None = None
    memcpy_calls: int | None = None
    rounds: int | None = None
    host_ref_ms: float | None = None  # harness.reports.timing.host_reference_ms: the median of one before every third timed round
    host_step_ms: float | None = None  # median time until the step returned, before the wait: the host's own part
    unavailable: dict | None = None  # figure -> why the runtime cannot give it (None where it gave them all)


@dataclass
class HarnessCost(Record):
    kind = "harness_cost"
    batch: int
    mode: str
    bare_ms: float  # the engine's own step call, then a device sync
    observed_ms: float  # the same step through the harness's ObservedEngine.step
    harness_ms: float
    fraction: float  # harness_ms / bare_ms
    limit: float  # the fraction the benchmark check allows


@dataclass
class HostProfile(Record):
    """Where the host's time goes in one step: a few steps of the engine's own step call under
    cProfile, after the timed rounds (harness.reports.profile). Rows: `function`, `where` (the
    file relative to its sys.path root, site-packages or the checkout), `line`, `own_ms` and
    `cum_ms` per step, `calls` per step."""
    kind = "host_profile"
    mode: str
    batch: int
    steps: int
    own_ms: float  # per step: every function's own time summed, as the profiler saw it
    profiled_ms: float  # per step: wall time of a profiled step call (the profiler's own cost in it)
    by_own: list  # the top rows by own time
    by_cumulative: list  # the top rows by cumulative time
    host_step_ms: float | None = None  # the same call unprofiled (Latency.host_step_ms of the same test)
    profiler: str = "cProfile"
    unavailable: dict | None = None  # figure -> why it is missing


@dataclass
class Batch1Speedup(Record):
    kind = "batch1_speedup"
    eager_ms: float
    full_ms: float
    speedup: float


@dataclass
class Serving(Record):
    kind = "serving"
    mode: str
    requests: int
    seconds: float
    steps: int
    output_tok_s: float
    total_tok_s: float
    requests_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None


@dataclass
class BatchInvariance(Record):
    kind = "batch_invariance"
    batch: int
    padded: int
    mode: str
    difference: float


@dataclass
class Anchor(Record):
    kind = "anchor"
    mode: str
    dtype: str
    steps: int
    largest_difference: float
    tolerance: float
    tokens_compared: int
    tokens_equal: int


@dataclass
class DataParallelStep(Record):
    kind = "data_parallel_step"
    step: int
    batches: list  # one description per rank
    modes: list[str]  # what each rank ran
    padded: list[int]
    agreed_mode: str
    waste_tokens: int


KINDS: dict[str, type[Record]] = {cls.kind: cls for cls in Record.__subclasses__()}


class ReportFormatError(ValueError):
    """A report this code cannot read; the message says why and what to do."""


def upgrade(run: dict, source: str = "the report") -> dict:
    """The report in the current schema: converted from version 1, refused if newer."""
    version = run.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ReportFormatError(f"{source} has schema_version {version!r}; this harness reads up to "
                                f"{SCHEMA_VERSION}: update cudagraph-conformance to render it")
    if version == SCHEMA_VERSION:
        return run
    tests = []
    for test in run.get("tests", []):
        test = dict(test)
        test["records"] = _records_from_properties(test.pop("properties", None) or {})
        tests.append(test)
    return {**run, "schema_version": SCHEMA_VERSION, "tests": tests, "converted_from": version}


def _records_from_properties(properties: dict) -> list[dict]:
    converted = []
    for name, value in properties.items():
        match = re.fullmatch(r"batch_invariance b=(\d+) pad=(\d+) (\w+)", name)
        if match:  # the oldest form: one scalar property per batch
            converted.append({"kind": "batch_invariance", "batch": int(match[1]), "padded": int(match[2]),
                              "mode": match[3], "difference": value})
        elif name in KINDS:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    converted.append({"kind": name, **item})
    return converted


def check_record(record: Record) -> dict:
    """The record as stored; a suite that records something malformed fails loudly here."""
    if not isinstance(record, Record):
        raise TypeError(f"record() takes a harness.reports.records.Record, got {type(record).__name__}")
    data = record.as_dict()
    missing = [f.name for f in fields(record)  # a field without a default must have a value
               if f.default is MISSING and f.default_factory is MISSING and data.get(f.name) is None]
    if missing:
        raise ValueError(f"record {record.kind!r} is missing {missing}")
    return data


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "SCHEMA_VERSION", "Record", "Grid", "ResolutionCell", "Capture", "Launches", "Latency",
    "Batch1Speedup", "HostProfile", "Serving", "BatchInvariance", "Anchor", "DataParallelStep", "KINDS",
    "ReportFormatError", "upgrade", "check_record",
]
