"""The numerical anchor in a helper process, where a plain run has a core to spare.

transformers' import and the model's load take seconds, which the anchor's first test would
otherwise spend waiting. Where this process runs the anchor's tests itself (not an xdist worker,
whose peers keep the other cores busy, nor a session inside a test, pytester's) and the machine
has a second core, the anchor starts in a helper process as soon as the tests are known
(harness.expectations.anchor.AnchorProcess), and the anchor's tests go last, so that it loads
while the other tests run. It is ended when the session finishes.
"""
from __future__ import annotations

import os

import pytest

from harness.session import machine


def uses_the_anchor(item) -> bool:
    return "anchor" in getattr(item, "fixturenames", ())


def runs_the_anchor(items) -> bool:
    """Whether a test among `items` that is not skipped outright uses the anchor."""
    return any(uses_the_anchor(item) and item.get_closest_marker("skip") is None for item in items)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected, and the harness has marked its skips
def pytest_collection_modifyitems(session, config, items) -> None:
    from harness.plugin import conformance_of

    c = conformance_of(config)
    if (c.graph_backend is None or not runs_the_anchor(items) or machine.cores() < 2
            or hasattr(config, "workerinput") or "PYTEST_CURRENT_TEST" in os.environ):
        return
    from harness.expectations.anchor import AnchorProcess

    c.anchor = AnchorProcess(config.getoption("preset"))
    items.sort(key=uses_the_anchor)  # stable: the anchor's tests last, each group in its own order


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    from harness.plugin import CONFORMANCE

    c = session.config.stash.get(CONFORMANCE, None)
    if c is not None and c.anchor is not None:
        c.anchor.close()
        c.anchor = None
