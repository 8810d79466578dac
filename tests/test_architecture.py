"""docs/architecture.md stays true: who may import whom, nothing outside the reference runtime
touches its private names, and every module has its row."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
RUNTIMES = ("reference_runtime", "cudagraph_", "bucket_engine", "tests")  # what the harness and suites never import


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list((path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names) of every import in the file, function bodies included."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            found.append((node.lineno, module, tuple(alias.name for alias in node.names)))
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module the file imports, `from a import b` counted as a.b where b is a module."""
    modules = []
    for line, module, names in imports(path):
        modules.append((line, module))
        for name in names:
            candidate = f"{module}.{name}"
            if (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists() or (ROOT / candidate.replace(".", "/")).is_dir():
                modules.append((line, candidate))
    return modules


def violations(files, allowed) -> list[str]:
    return [f"{path.name if not path.is_relative_to(ROOT) else path.relative_to(ROOT)}:{line} imports {module}"
            for path in files for line, module in imported_modules(path) if not allowed(module)]


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_policy_is_pure_python():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert not violations(python_files("reference_runtime/policy"),
                          lambda m: top(m) in stdlib or m.startswith("reference_runtime.policy"))


def test_the_engine_imports_only_the_protocol_and_the_graph_api_of_the_harness():
    def allowed(module):
        return top(module) != "harness" or module in ("harness", "harness.protocol") or module.startswith("harness.graphs")
    assert not violations(python_files("reference_runtime/engine"), allowed)


def test_the_adapter_and_calculator_import_only_the_protocol_of_the_harness():
    files = [ROOT / "reference_runtime" / name for name in ("adapter.py", "cli.py", "__main__.py", "__init__.py")]
    assert not violations(files, lambda m: top(m) != "harness" or m in ("harness", "harness.protocol"))


@pytest.mark.parametrize("folder", ["harness", "suites"])
def test_the_harness_and_the_suites_never_import_a_runtime(folder):
    assert not violations(python_files(folder), lambda m: not top(m).startswith(RUNTIMES))


def private_names_of_the_reference_runtime() -> set[str]:
    """Names the reference runtime keeps to itself: its `_functions`, `_methods` and `self._attributes`."""
    names = set()
    for path in python_files("reference_runtime"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and re.fullmatch(r"_[a-z]\w*", node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and re.fullmatch(r"_[a-z]\w*", node.attr):
                names.add(node.attr)
    return names


OUTSIDE = ["tests", "plugins", "examples", "scripts"]


def test_nothing_outside_reaches_a_private_name_of_the_reference_runtime():
    private = private_names_of_the_reference_runtime()
    found = []
    for path in python_files(*OUTSIDE):
        if path == Path(__file__):
            continue
        for line, module, names in imports(path):
            if top(module) == "reference_runtime" and (any(p.startswith("_") and not p.startswith("__")
                                                          for p in module.split(".")[1:])
                                                      or any(n in private for n in names)):
                found.append(f"{path.relative_to(ROOT)}:{line} imports a private name from {module}")
        if "reference_runtime" not in path.read_text():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} touches .{node.attr}")
            elif isinstance(node, ast.FunctionDef) and node.name in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} overrides {node.name}")
    assert not found, "\n".join(found)


def test_the_private_name_check_sees_an_override_and_a_patch(tmp_path):
    """The check above, shown to fail: a runner overriding an underscore method, and a patch."""
    private = private_names_of_the_reference_runtime() | {"_dispatch_memo"}
    source = "class R(ModelRunner):\n    def _dispatch_memo(self): pass\nrunner.cache._keys = []\n"
    touched = {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)} & private
    overrides = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)} & private
    assert touched == {"_keys"} and overrides == {"_dispatch_memo"}


def test_every_module_has_its_row_in_the_architecture_page():
    missing = [str(p.relative_to(ROOT)) for p in python_files("harness", "reference_runtime")
               if p.name != "__init__.py" and f"`{p.stem}`" not in DOC and f"{p.name}`" not in DOC]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_import_check_fails_on_a_forbidden_import(tmp_path):
    """The rules above, shown to fail: an engine module importing harness internals, in a function too."""
    probe = tmp_path / "probe.py"
    probe.write_text("import torch\n\ndef f():\n    from harness.expectations import presets\n")
    found = violations([probe], lambda m: top(m) != "harness" or m.startswith(("harness.protocol", "harness.graphs")))
    assert found == ["probe.py:4 imports harness.expectations", "probe.py:4 imports harness.expectations.presets"]
