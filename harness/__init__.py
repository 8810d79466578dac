"""cudagraph-conformance harness: the pytest plugin, the runtime protocol and independent oracles."""

# The project's version, read by pyproject.toml (the wheel), the report (harness_version) and
# known-failures files that name the harness versions they were written for.
__version__ = "0.5.0"
