"""Named hypothesis profiles: choose one with --hypothesis-profile (default: ci under CI, else dev)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES = {
    "dev": dict(max_examples=30),
    "ci": dict(max_examples=100, print_blob=True),
    "nightly": dict(max_examples=1000, print_blob=True),
}


def default_profile() -> str:
    """The profile a run gets without --hypothesis-profile: ci under CI, else dev."""
    return "ci" if os.environ.get("CI") else "dev"


def register_profiles() -> None:
    # The suites' function-scoped fixtures (check, record, runtime) hold no state between examples.
    suppressed = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
    for name, options in PROFILES.items():
        # derandomize=False: under CI hypothesis's own defaults derandomize, which would make the
        # seed the harness prints (and puts in every reproduction command) change nothing.
        settings.register_profile(
            name, deadline=None, derandomize=False, suppress_health_check=suppressed, **options
        )
