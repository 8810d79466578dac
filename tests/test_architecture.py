"""docs/architecture.md stays true: who may import whom, nothing outside the reference runtime
touches its private names, and every module has its row."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from harness import moved

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


# -- floors inside harness/ -------------------------------------------------------------------------
# harness/'s rooms (a subpackage, or a module at its top), lowest floor first: a room imports its
# own modules and the rooms of the floors below, never a room of its own floor or one above
# (docs/architecture.md, "Floors").
FLOORS = (
    ("ground", ("harness", "harness.vocabulary", "harness.moved", "harness.hookspecs", "harness.reliability")),
    ("protocol", ("harness.protocol",)),
    ("engine tools", ("harness.graphs", "harness.kit")),
    ("expectations and scenarios", ("harness.expectations", "harness.scenarios")),
    ("session", ("harness.session",)),
    ("checks", ("harness.checks",)),
    ("runtime", ("harness.runtime",)),
    ("reports", ("harness.reports",)),
    ("drivers", ("harness.smoke", "harness.supervisor")),
    ("plugin", ("harness.plugin",)),
    ("old paths", ("harness.block_book", *moved.MOVED)),  # shims: each imports harness.moved, or its new module
)

# The only imports of the harness inside a function: each loads a heavy dependency where it is used,
# so a run that never needs it never pays for it. (importer, imported module): why.
IN_FUNCTIONS = {
    ("harness.checks", "harness.expectations.equality"): "torch: a policy-only run compares no tensors",
    ("harness.plugin", "harness.runtime.factory"): "torch: a policy-only run builds no engine",
    ("harness.session.anchor_helper", "harness.expectations.anchor"): "torch: only a session that starts the helper",
    ("harness.session.machine", "harness.graphs.log"): "torch: only a process that shares a GPU",
    ("harness.runtime.ranks", "harness.graphs.log"): "torch: a rank process, which preloads it; never the pool's own",
    ("harness.reports.render", "harness.reports.plots"): "matplotlib: only a report with something to draw",
}


def room(module: str) -> str:
    """The room a harness module lives in: its subpackage below harness/, or the module itself."""
    if module in moved.MOVED:  # a shim at an old path, whatever room it stands in
        return module
    parts = module.split(".")
    return ".".join(parts[:2])


def floor_of(module: str) -> int | None:
    return next((i for i, (_, rooms) in enumerate(FLOORS) if room(module) in rooms), None)


def harness_imports(module: str, source: str, package: bool = False) -> list[tuple[int, str, bool]]:
    """(line, imported harness module, inside a function) for every import of the harness in the
    source; `from a import b` is a.b where b is a module."""
    tree = ast.parse(source)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    in_functions = {id(node) for f in ast.walk(tree) if isinstance(f, functions)
                    for node in ast.walk(f) if isinstance(node, (ast.Import, ast.ImportFrom))}
    base = module if package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                parts = base.split(".")
                target = ".".join(parts[: len(parts) - (node.level - 1)] + ([target] if target else []))
            targets = []
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                path = ROOT / candidate.replace(".", "/")
                targets.append(candidate if path.with_suffix(".py").exists() or path.is_dir() else target)
        else:
            continue
        found += [(node.lineno, t, id(node) in in_functions) for t in dict.fromkeys(targets) if top(t) == "harness"]
    return found


def floor_violations(module: str, source: str, package: bool = False, where: str | None = None) -> list[str]:
    """Each import of the harness in `module` that points at its own floor's other rooms or above,
    or sits in a function without its reason in IN_FUNCTIONS; a room on no floor."""
    where, mine = where or module, floor_of(module)
    if mine is None:
        return [f"{where}: {room(module)} is on no floor (FLOORS in tests/test_architecture.py)"]
    found = []
    for line, target, in_function in harness_imports(module, source, package):
        theirs = floor_of(target)
        if room(target) != room(module) and (theirs is None or theirs >= mine):
            level = "above" if theirs is None or theirs > mine else "beside"
            found.append(f"{where}:{line} imports {target}, {level} it "
                         f"(the {FLOORS[mine][0]} floor imports only the floors below it)")
        if in_function and (module, target) not in IN_FUNCTIONS:
            found.append(f"{where}:{line} imports {target} inside a function (a room on the wrong floor, "
                         "or a heavy dependency to name in IN_FUNCTIONS)")
    return found


def test_each_room_of_the_harness_imports_only_the_floors_below_it():
    found = []
    for path in python_files("harness"):
        found += floor_violations(module_name(path), path.read_text(), path.name == "__init__.py",
                                  str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_floors_are_rooms_that_exist_each_on_one_floor():
    rooms = [r for _, floor in FLOORS for r in floor]
    assert len(rooms) == len(set(rooms)), rooms
    modules = {module_name(p) for p in python_files("harness")}
    assert not [r for r in rooms if r not in modules and not (ROOT / r.replace(".", "/")).is_dir()], rooms
    assert {m for m, _ in IN_FUNCTIONS} <= modules and {m for _, m in IN_FUNCTIONS} <= modules


def test_the_floor_check_fails_on_an_upward_import():
    """The check above, shown to fail: graphs importing the plugin at the top and the runtime in a
    function, the session importing checks (a floor up), scenarios importing expectations (beside
    it, through a relative import), a room on no floor, and an allowed heavy import elsewhere."""
    graphs = "from harness.plugin import CONFORMANCE\n\ndef f():\n    from harness.runtime import observe\n"
    assert floor_violations("harness.graphs.probe", graphs) == [
        "harness.graphs.probe:1 imports harness.plugin, above it "
        "(the engine tools floor imports only the floors below it)",
        "harness.graphs.probe:4 imports harness.runtime.observe, above it "
        "(the engine tools floor imports only the floors below it)",
        "harness.graphs.probe:4 imports harness.runtime.observe inside a function (a room on the wrong floor, "
        "or a heavy dependency to name in IN_FUNCTIONS)",
    ]
    session = "from harness import checks\nfrom harness.expectations import presets\n"
    assert floor_violations("harness.session.probe", session) == [
        "harness.session.probe:1 imports harness.checks, above it "
        "(the session floor imports only the floors below it)"]
    scenarios = "from ..expectations import oracle\nfrom . import batches\nfrom harness.protocol import Request\n"
    assert floor_violations("harness.scenarios.probe", scenarios) == [
        "harness.scenarios.probe:1 imports harness.expectations.oracle, beside it "
        "(the expectations and scenarios floor imports only the floors below it)"]
    assert floor_violations("harness.attic.probe", "import harness\n") == [
        "harness.attic.probe: harness.attic is on no floor (FLOORS in tests/test_architecture.py)"]
    heavy = "def f():\n    from harness.expectations.equality import first_mismatch\n"
    assert floor_violations("harness.checks", heavy) == []
    assert floor_violations("harness.runtime.probe", heavy) == [
        "harness.runtime.probe:2 imports harness.expectations.equality inside a function (a room on the wrong floor, "
        "or a heavy dependency to name in IN_FUNCTIONS)"]


def test_the_architecture_page_lists_the_floors_in_their_order():
    section = DOC.split("### Floors", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in section.splitlines()
            if row.startswith("| ") and not row.startswith("| floor")]
    assert [cells[1] for cells in rows] == [name for name, _ in FLOORS]
    for cells, (name, rooms) in zip(rows, FLOORS[:-1]):  # the old paths' row names moved.py's table
        assert set(re.findall(r"`([\w.]+)`", cells[2])) == set(rooms), name


def test_the_import_check_fails_on_a_forbidden_import(tmp_path):
    """The rules above, shown to fail: an engine module importing harness internals, in a function too."""
    probe = tmp_path / "probe.py"
    probe.write_text("import torch\n\ndef f():\n    from harness.expectations import presets\n")
    found = violations([probe], lambda m: top(m) != "harness" or m.startswith(("harness.protocol", "harness.graphs")))
    assert found == ["probe.py:4 imports harness.expectations", "probe.py:4 imports harness.expectations.presets"]


# -- the engine's seams: what a class outside the reference runtime may override ---------------------
def documented_seams() -> dict[str, set[str]]:
    """Class name -> the methods a replacement may define, from the seams table of the architecture
    page (its third column names the default's class, its fourth the methods)."""
    section = DOC.split("### The runner's seams", 1)[1].split("\n## ", 1)[0]
    seams = {}
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`"):
            default = re.findall(r"`([^`]+)`", cells[2])[0].split(".")[-1]
            seams[default] = set(re.findall(r"`([A-Za-z_]+)`", cells[3])) | {"__init__"}
    return seams


def engine_classes() -> dict[str, tuple[list[str], set[str]]]:
    """Every class of the reference runtime: its bases' names and the methods it defines."""
    classes = {}
    for path in python_files("reference_runtime"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):  # two classes of one name: both count
                bases, methods = classes.get(node.name, ([], set()))
                classes[node.name] = (bases + [base_name(b) for b in node.bases],
                                      methods | {f.name for f in node.body if isinstance(f, ast.FunctionDef)})
    return classes


def base_name(node) -> str | None:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def sources_of(path: Path) -> list[tuple[str, ast.AST]]:
    """A file's syntax tree, and those of the Python programs it holds as strings (a test writes
    them out for pytester) that use the reference runtime."""
    tree = ast.parse(path.read_text())
    found = [(str(path.relative_to(ROOT)), tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "reference_runtime" in node.value \
                and "class " in node.value:
            try:
                found.append((f"{path.relative_to(ROOT)}:{node.lineno} (a program in a string)", ast.parse(node.value)))
            except SyntaxError:
                pass
    return found


def overrides_outside_the_seams(where: str, tree: ast.AST, engine, seams) -> list[str]:
    """Methods that classes in `tree` define over a method of an engine class they derive from,
    where that method is not among the seams of the nearest documented class above them."""
    local = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def engine_bases(name, seen=()) -> set[str]:  # the engine classes a class derives from, through local ones
        if name in local and name not in seen:
            return set().union(*(engine_bases(base_name(b), seen + (name,)) for b in local[name].bases))
        return {name} if name in engine else set()

    def methods(name) -> set[str]:
        bases, own = engine[name]
        return own.union(*(methods(b) for b in bases if b in engine))

    def allowed(name) -> set[str]:  # the nearest documented class's seams; none below an undocumented root
        if name in seams:
            return seams[name]
        return set().union(*(allowed(b) for b in engine[name][0] if b in engine)) or {"__init__"}

    found = []
    for name, node in local.items():
        for engine_class in sorted(set().union(*(engine_bases(base_name(b)) for b in node.bases))):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name in methods(engine_class) \
                        and f.name not in allowed(engine_class):
                    found.append(f"{where}:{f.lineno} {name} overrides {engine_class}.{f.name}, not a seam")
    return found


def test_nothing_outside_overrides_the_engine_beyond_its_seams():
    engine, seams = engine_classes(), documented_seams()
    assert {"Planner", "StaticBuffers", "CapturedGraphs", "ModelRunner", "Backend"} <= set(seams), seams
    found = [line for path in python_files(*OUTSIDE) if path != Path(__file__)
             for where, tree in sources_of(path)
             for line in overrides_outside_the_seams(where, tree, engine, seams)]
    assert not found, "\n".join(found)


def test_the_seam_check_sees_an_override_outside_the_seams():
    """The check above, shown to fail: a planner subclass overriding its layout, a run strategy
    overriding how pieces replay, through a class of its own in between; the seams themselves pass."""
    engine, seams = engine_classes(), documented_seams()
    source = ("class P(Planner):\n    def plan(self, requests, captured): pass\n"
              "    def lay_out(self, *args): pass\n"
              "class Mine(CapturedGraphs):\n    def run(self, plan, eager=False): pass\n"
              "class S(Mine):\n    def _replay_pieces(self, plan): pass\n"
              "class B(StaticBackend):\n    def forward(self, layer, q, meta): pass\n")
    assert overrides_outside_the_seams("probe.py", ast.parse(source), engine, seams) == [
        "probe.py:3 P overrides Planner.lay_out, not a seam",
        "probe.py:7 S overrides CapturedGraphs._replay_pieces, not a seam",
    ]


# -- one name per size (docs/architecture.md, "Sizes") ---------------------------------------------
OLD_SIZE_NAMES = {"num_tokens", "num_reqs", "padded_num_tokens"}  # 0.3.0's, each real here and padded there
# Where the rule holds: the protocol, the reference engine and policy, the plugins' packages, the examples.
SIZE_RULED = ("reference_runtime", "plugins", "examples")
# A line that hands an engine's own API its own names (vLLM's BatchDescriptor says num_tokens) says so.
FOREIGN = "own name"


def size_ruled_files() -> list[Path]:
    return [ROOT / "harness" / "protocol.py"] + [p for p in python_files(*SIZE_RULED) if "tests" not in p.parts]


def size_name_problems(where: str, source: str, *, foreign_attributes: bool) -> list[str]:
    """Old size names where this code names a size: a parameter, a variable, a field, a keyword; an
    attribute read too where no foreign engine's objects are read (`foreign_attributes` False). A bare
    `n` that holds a token count (a parameter of a function over tokens, or a value made of tokens)."""
    lines = source.splitlines()
    found = []

    def flag(node, name, what):
        line = lines[node.lineno - 1]
        if FOREIGN not in line and not line.lstrip().startswith("@renamed("):  # the aliases themselves
            found.append(f"{where}:{node.lineno} {what} {name}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = ast.get_source_segment(source, node) or ""
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                if arg.arg in OLD_SIZE_NAMES:
                    flag(arg, arg.arg, "parameter")
                elif arg.arg == "n" and "token" in body:
                    flag(arg, "n", "parameter holding a token count:")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in OLD_SIZE_NAMES:
            flag(node, node.id, "variable")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in OLD_SIZE_NAMES:
            flag(node, node.target.id, "field")
        elif isinstance(node, ast.keyword) and node.arg in OLD_SIZE_NAMES:
            flag(node.value, node.arg, "keyword")
        elif isinstance(node, ast.Attribute) and node.attr in OLD_SIZE_NAMES and not foreign_attributes:
            flag(node, node.attr, "attribute")
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "n" for t in node.targets) \
                and "token" in (ast.get_source_segment(source, node.value) or ""):
            flag(node, "n", "variable holding a token count:")
    return sorted(set(found), key=lambda line: (line.split(":")[0], int(line.split(":")[1].split()[0]), line))


def test_one_name_per_size_in_the_protocol_the_engine_and_the_plugins():
    found = []
    for path in size_ruled_files():
        where = str(path.relative_to(ROOT))
        # Plugins read their engine's objects (vLLM's BatchDescriptor.num_tokens); a protocol object read
        # under an old name there warns, and the suites' sessions make that warning an error.
        found += size_name_problems(where, path.read_text(), foreign_attributes=where.startswith("plugins/"))
    assert not found, "\n".join(found)


def test_the_size_rule_catches_old_names_and_a_bare_n():
    source = ("def dispatch(config, num_tokens, num_reqs=None):\n"
              "    return Descriptor(num_tokens=num_tokens)\n"
              "def step(self, requests):\n"
              "    n = sum(len(r.token_ids) for r in requests)\n"
              "    return result.padded_num_tokens\n"
              "def forward(self, n):\n"
              "    return self.token_ids[:n]\n"
              "def vllm(desc):\n"
              "    return replace(desc, num_tokens=8)  # vLLM's own name\n"
              "def rows(n):\n"
              "    return [0] * n\n")
    assert size_name_problems("probe.py", source, foreign_attributes=False) == [
        "probe.py:1 parameter num_reqs", "probe.py:1 parameter num_tokens", "probe.py:2 keyword num_tokens",
        "probe.py:4 variable holding a token count: n", "probe.py:5 attribute padded_num_tokens",
        "probe.py:6 parameter holding a token count: n"]
