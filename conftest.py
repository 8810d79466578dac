# The plugin normally arrives through its `pytest11` entry point once the project is installed;
# from a bare checkout it is loaded here instead, so `pytest` works either way.
from importlib import metadata

pytest_plugins = ["pytester"]
if not any(ep.value == "harness.plugin" for ep in metadata.entry_points(group="pytest11")):
    pytest_plugins.append("harness.plugin")
