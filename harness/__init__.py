"""cudagraph-conformance harness: the pytest plugin, the runtime protocol and independent oracles."""
