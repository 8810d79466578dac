"""Hooks the harness adds to pytest (registered with `pytest_addhooks`)."""
from __future__ import annotations


def pytest_cudagraph_runtimes():
    """Return a mapping of runtime names to factories that this plugin or conftest provides.

    A factory is called with no arguments and returns an object that follows
    `harness.protocol.Runtime`. Every implementation's mapping is merged; a name given
    twice is an error. Runtimes can also come from the `cudagraph_conformance.runtimes`
    entry-point group, or from `--runtime package.module:factory`.

    Runnable example, in a `conftest.py` next to your tests or in an installed plugin::

        from harness.protocol import Capabilities

        class Constant:
            name, version = "constant", "0.1"
            capabilities = Capabilities(capture_sizes=True)
            def capture_sizes(self, config):
                return [1, 2, 4, 8]
            def padded_size(self, config, num_tokens):
                return next((s for s in (1, 2, 4, 8) if s >= num_tokens), None)

        def pytest_cudagraph_runtimes():
            return {"constant": Constant}

    then ``pytest suites/ --runtime constant`` runs every suite whose needs `Constant`
    declares, and skips the rest with a reason.
    """


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "pytest_cudagraph_runtimes",
]
