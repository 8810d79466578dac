"""Hooks the harness adds to pytest (registered with `pytest_addhooks`)."""
from __future__ import annotations


def pytest_cudagraph_runtimes():
    """Return a mapping of runtime names to factories that this plugin or conftest provides.

    A factory is called with no arguments and returns an object that follows
    `harness.protocol.Runtime`. Every implementation's mapping is merged; a name given
    twice is an error. Runtimes can also come from the `cudagraph_conformance.runtimes`
    entry-point group, or from `--runtime package.module:factory`.

    Runnable example, in a `conftest.py` at the root of the checkout that holds `suites/` (pytest
    reads the conftests above the tests it runs), in an installed plugin, or, with the installed
    `cudagraph-conformance` command, in a module of the directory you run from loaded with
    ``-p MODULE`` (its suites live in site-packages, so a conftest.py of yours is never read)::

        from harness.protocol import Capabilities

        class Constant:
            name, version = "constant", "0.1"
            capabilities = Capabilities(capture_sizes=True)
            def capture_sizes(self, config):
                if config.mode == "NONE":  # NONE captures nothing
                    return []
                budget = config.max_num_batched_tokens or 8192  # None: the default budget
                return [s for s in (1, 2, 4, 8) if s <= budget]
            def padded_size(self, config, num_real_tokens):
                return next((s for s in self.capture_sizes(config) if s >= num_real_tokens), None)

        def pytest_cudagraph_runtimes():
            return {"constant": Constant}

    then ``pytest suites/ --runtime constant`` (or ``cudagraph-conformance -p MODULE --runtime
    constant``) runs every suite whose needs `Constant` declares, and skips the rest with a reason
    (tests/test_doc_runtimes.py runs this example both ways).
    """


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "pytest_cudagraph_runtimes",
]
