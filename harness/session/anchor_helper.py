"""The numerical anchor in a helper process, where a plain run has a core to spare.

transformers' import and the model's load take seconds, which the anchor's first test would
otherwise spend waiting. With `--anchor-process yes`, or by default (auto) where this process runs
the anchor's tests itself (not a session inside a test, pytester's) on a machine with more than two
cores (on two, the second is seldom idle: an xdist peer, the machine's own work), the anchor starts
in a helper process as soon as the tests are known (harness.expectations.anchor.AnchorProcess), and
the anchor's tests go last, so that it loads while the other tests run. Never in an xdist worker:
every worker collects the anchor's tests, and one runs them. The helper is ended when the session
finishes.
"""
from __future__ import annotations

import os

import pytest

from harness.session import machine
from harness.session.stash import CONFORMANCE, conformance_of


def uses_the_anchor(item) -> bool:
    return "anchor" in getattr(item, "fixturenames", ())


def wanted(option: str, worker: bool, nested: bool, cores: int) -> bool:
    """Whether this session starts a helper (`--anchor-process`): as asked, except in an xdist
    worker; auto, where the session is not inside a test and the machine has more than two cores."""
    if worker or option == "no":
        return False
    return option == "yes" or (not nested and cores > 2)


def runs_the_anchor(items) -> bool:
    """Whether a test among `items` that is not skipped outright uses the anchor."""
    return any(uses_the_anchor(item) and item.get_closest_marker("skip") is None for item in items)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected, and the harness has marked its skips
def pytest_collection_modifyitems(session, config, items) -> None:
    c = conformance_of(config)
    if (c.graph_backend is None or not runs_the_anchor(items)
            or not wanted(config.getoption("anchor_process"), worker=hasattr(config, "workerinput"),
                          nested="PYTEST_CURRENT_TEST" in os.environ, cores=machine.cores())):
        return
    from harness.expectations.anchor import AnchorProcess

    c.anchor = AnchorProcess(config.getoption("preset"))
    items.sort(key=uses_the_anchor)  # stable: the anchor's tests last, each group in its own order


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    c = session.config.stash.get(CONFORMANCE, None)
    if c is not None and c.anchor is not None:
        c.anchor.close()
        c.anchor = None
