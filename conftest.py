"""Registers the plugin and the reference runtime from a bare checkout (no pip install)."""
# The plugin and the reference runtime normally arrive through entry points once the project is
# installed (scripts/install.sh); from a bare checkout they are registered here instead.
from importlib import metadata

pytest_plugins = ["pytester"]
_INSTALLED = any(ep.value == "harness.plugin" for ep in metadata.entry_points(group="pytest11"))
if not _INSTALLED:
    pytest_plugins.append("harness.plugin")

    def pytest_cudagraph_runtimes():
        from reference_runtime.adapter import ReferenceRuntime

        return {"reference": ReferenceRuntime}
