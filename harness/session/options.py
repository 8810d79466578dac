"""Every option's value checked before the first test (and before the supervisor forks): a bad
value is one line saying what was wrong and what would be right, pytest's usage error (exit 4).

`CHECKS` maps each option's dest to its check; tests/test_options.py walks every option the
plugin registers with a bad value and fails when one has no row here or in `FREE`.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.expectations.presets import PRESETS
from harness.session.hypothesis_profiles import PROFILES


def _preset(option: str):
    def check(value):
        if value not in PRESETS:
            return f"{option} {value!r}: no such model preset; expected one of {', '.join(PRESETS)}"
    return check


def _non_negative_number(option: str, meaning: str):
    def check(value):
        if value is None or (math.isfinite(value) and value >= 0):
            return None
        return f"{option}={value}: expected a number >= 0 ({meaning})"
    return check


def _hypothesis_profile(value):
    if value is None or value in PROFILES:
        return None
    from hypothesis import settings

    try:
        settings.get_profile(value)  # one a conftest or plugin of yours registered
    except Exception:  # hypothesis raises InvalidArgument for an unknown name
        return f"--hypothesis-profile {value!r}: no such profile; expected one of {', '.join(PROFILES)}"
    return None


def _hypothesis_seed(value):
    if value is None:
        return None
    try:
        int(value)
    except (TypeError, ValueError):
        return f"--hypothesis-seed {value!r}: expected an integer (as printed in a run's header)"
    return None


def _report_dir(value):
    """Created now, so a directory that cannot be is refused before any test runs."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return f"--report-dir {value}: that is a file; name a directory (it is created if missing)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--report-dir {value}: cannot create it ({exc.strerror or exc}); name a directory you can write"
    return None


CHECKS = {
    "preset": _preset("--preset"),
    "bench_preset": _preset("--bench-preset"),
    "test_timeout": _non_negative_number("--test-timeout", "seconds a test phase may run; 0 turns it off"),
    "regression_threshold": _non_negative_number("--regression-threshold",
                                                 "the fraction worse than the baseline that is a regression"),
    "hypothesis_profile": _hypothesis_profile,
    "hypothesis_seed": _hypothesis_seed,
    "report_dir": _report_dir,
}
# Options whose values are checked elsewhere at configure time, or that take no value.
FREE = {
    "known_failures": "read at configure time: a missing or malformed file is a usage error (known_failures)",
    "baseline": "read at configure time: a missing or malformed run is a usage error (reports.render)",
    "runtime": "resolved at configure time: an unknown name lists the runtimes (harness.runtime.registry)",
    "graph_backend": "argparse choices", "anchor_process": "argparse choices",
    "no_plots": "a flag", "fail_on_regression": "a flag", "only_declared": "a flag", "no_supervisor": "a flag",
}


def problems(config) -> list[str]:
    found = []
    for dest, check in CHECKS.items():
        value = config.getoption(dest, None)
        problem = check(value)
        if problem:
            found.append(problem)
    return found


def validate(config) -> None:
    """Raise pytest.UsageError (exit 4, one line, no traceback) for the first bad option."""
    found = problems(config)
    if found:
        raise pytest.UsageError(found[0])
