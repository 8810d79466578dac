"""docs/api.md is the public API: every name it lists imports, each listed module's `__all__` is
exactly what the page lists, no other harness module declares an `__all__` unlisted, and every
0.1.0 path that moved still imports with a DeprecationWarning naming the new path."""
from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

import harness
from harness import moved

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "api.md").read_text()
SECTION = re.compile(r"^## `(?P<module>harness[\w.]*)`\n(?P<body>.*?)(?=^## )", re.S | re.M)


def documented(page: str = PAGE) -> dict[str, set[str]]:
    """{module: the names listed under it}: every backticked name on a bullet line of its section."""
    found = {}
    for match in SECTION.finditer(page):
        bullets = re.findall(r"^(?:- |  )(.*)$", match.group("body"), re.M)
        found[match.group("module")] = {name for line in bullets
                                        for name in re.findall(r"`([A-Za-z_]\w*)`", line.split(": ")[0])}
    return found


def undocumented(page: str = PAGE) -> list[str]:
    """Each mismatch between the page and the modules' `__all__`, one line each."""
    problems = []
    for module_name, names in documented(page).items():
        module = importlib.import_module(module_name)
        public = set(getattr(module, "__all__", ())) | ({"__version__"} if module is harness else set())
        problems += [f"{module_name}.{n} is in __all__ but not in docs/api.md" for n in sorted(public - names)]
        problems += [f"{module_name}.{n} is in docs/api.md but not in __all__" for n in sorted(names - public)]
        problems += [f"{module_name}.{n} does not import" for n in sorted(names) if not hasattr(module, n)]
    return problems


def test_every_documented_name_imports_and_every_public_name_is_documented():
    assert documented().keys() >= {"harness", "harness.protocol", "harness.graphs", "harness.hookspecs",
                                   "harness.runtime.registry", "harness.expectations.presets",
                                   "harness.session.known_failures", "harness.reports.records"}
    assert not undocumented(), "\n".join(undocumented())


def test_the_check_fails_on_an_undocumented_public_name(monkeypatch):
    monkeypatch.setattr(harness.protocol, "__all__", [*harness.protocol.__all__, "NewThing"], raising=True)
    monkeypatch.setattr(harness.protocol, "NewThing", object(), raising=False)
    assert undocumented() == ["harness.protocol.NewThing is in __all__ but not in docs/api.md"]


def test_the_check_fails_on_a_documented_name_that_went_away():
    page = PAGE.replace("`UnsupportedCheckpoint`", "`UnsupportedCheckpoint`, `GoneName`", 1)
    assert "harness.protocol.GoneName is in docs/api.md but not in __all__" in undocumented(page)


def test_no_harness_module_declares_a_public_surface_the_page_leaves_out():
    listed = documented().keys()
    declaring = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if re.search(r"^__all__ = ", path.read_text(), re.M) and name not in listed:
            declaring.append(name)
    assert not declaring, f"{declaring} declare __all__ but docs/api.md does not list them"


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_a_moved_module_imports_at_its_old_path_with_a_deprecation_naming_the_new(old, monkeypatch):
    monkeypatch.setattr(moved, "IMPORTED", [])  # this process's later headers stay the runtime's own
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(old)  # as an `import` statement does, so the warning names this file
    module = sys.modules[old]
    assert module is importlib.import_module(moved.MOVED[old])
    assert [w.category for w in caught] == [DeprecationWarning]
    assert f"moved to {moved.MOVED[old]}" in str(caught[0].message)
    assert caught[0].filename == __file__  # blamed on the importer, not on the shim
    assert f"`{old}`" in PAGE or f"`harness.{old.split('.')[1]}`" in PAGE
    assert moved.header_lines() == [f"deprecated: {moved.message(old)}"]


def test_the_version_is_semantic_and_the_changelog_has_it():
    assert re.fullmatch(r"\d+\.\d+\.\d+", harness.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{harness.__version__}]" in changelog
    for old in moved.MOVED:
        assert f"`{old}`" in changelog, f"CHANGELOG.md does not name the move of {old}"


def test_the_block_books_old_module_still_gives_its_names_with_a_deprecation():
    """0.2.0's harness.block_book (BlockBook, Live) moved to harness.kit.block_book in 0.3.0."""
    from harness.kit import block_book as kit_book

    sys.modules.pop("harness.block_book", None)
    with pytest.warns(DeprecationWarning, match="harness.kit.block_book"):
        old = importlib.import_module("harness.block_book")
    assert old.BlockBook is kit_book.BlockBook and old.Live is kit_book.Live


@pytest.mark.parametrize("old", sorted(moved.RENAMED))
def test_a_renamed_protocol_name_still_reads_and_constructs_with_a_deprecation_naming_the_new(old):
    """0.3.0's size names (one name per size since): each still reads the new field and is taken as a
    constructor keyword, warning with the new name; docs/api.md and the changes list it."""
    from harness import protocol

    owner, old_name = old.split(".")
    new_name = moved.RENAMED[old].split(".")[1]
    cls = getattr(protocol, owner)
    required = {f.name: 7 for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING and f.name != new_name}
    with pytest.warns(DeprecationWarning, match=f"use {owner}.{new_name}") as caught:
        value = cls(**required, **{old_name: 5})
    assert caught[0].filename == __file__  # blamed on the caller
    assert getattr(value, new_name) == 5
    with pytest.warns(DeprecationWarning, match=f"use {owner}.{new_name}"):
        assert getattr(value, old_name) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(value, new_name) == 5  # the new name is silent
    assert f"`{old}`" in PAGE or f"`{owner}.{old_name}`" in PAGE


@pytest.mark.parametrize("old,value,new,expected", [
    ("vllm_policy", True, "rules", "vllm-0.33"),
    ("vllm_version", "0.25", "rules", None),  # a release alone declares no rules (vllm_policy did)
    ("random_padding_ids", True, "declarations", {"random_padding_ids": True}),
])
def test_0_3_0_capabilities_still_construct_and_read_with_a_deprecation_naming_the_replacement(old, value, new, expected):
    from harness.protocol import Capabilities

    with pytest.warns(DeprecationWarning, match=f"Capabilities.{old} is deprecated: use Capabilities.{new}"):
        caps = Capabilities(**{old: value})
    assert getattr(caps, new) == expected
    with pytest.warns(DeprecationWarning, match=f"Capabilities.{old} is deprecated"):
        getattr(caps, old)
    assert f"`Capabilities.{old}`" in PAGE and f"Capabilities.{old}" in moved.REPLACED


def test_0_3_0_policy_config_runner_and_release_become_one_rules_name():
    from harness.protocol import Capabilities, PolicyConfig

    with pytest.warns(DeprecationWarning, match="is deprecated: use PolicyConfig.rules") as caught:
        config = PolicyConfig(runner="v1", vllm_version="0.25")
    assert sorted(str(w.message).split(" is ")[0] for w in caught) == ["PolicyConfig.runner", "PolicyConfig.vllm_version"]
    assert config.rules == "vllm-0.25/v1" and (config.vllm_release, config.vllm_runner) == ("0.25", "v1")
    with pytest.warns(DeprecationWarning, match="use PolicyConfig.vllm_runner"):
        assert config.runner == "v1"
    with pytest.warns(DeprecationWarning, match="use has\\('vllm_rules'\\)"):
        assert Capabilities(rules="vllm-0.33").has("vllm_policy")
    for old in ("PolicyConfig.runner", "PolicyConfig.vllm_version"):
        assert f"`{old}`" in PAGE and old in moved.REPLACED


def test_a_name_that_moved_module_still_reads_at_its_old_path_with_a_deprecation_naming_the_new():
    """0.3.0 had the engine factory in harness.runtime.observe; 0.4.0 moved it to harness.runtime.factory.
    Each old name is the new object, warning with the new path; an unknown name is still an AttributeError."""
    importlib.import_module("harness.runtime.observe")
    assert moved.NAMES_MOVED, "no moved names registered"
    for old, new in sorted(moved.NAMES_MOVED.items()):
        old_module, _, name = old.rpartition(".")
        new_module = new.rpartition(".")[0]
        with pytest.warns(DeprecationWarning, match=re.escape(new)):
            value = getattr(importlib.import_module(old_module), name)
        assert value is getattr(importlib.import_module(new_module), name)
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        importlib.import_module("harness.runtime.observe").NotAName


def test_a_plugins_moved_module_is_its_new_module_with_a_deprecation(tmp_path, monkeypatch):
    """harness.moved.module_moved, as a plugin's shim at an old path calls it (plugins/vllm-engine's
    v1_* modules are such shims; plugins/vllm-engine-v1/tests/test_old_paths.py holds them to it)."""
    (tmp_path / "new_home_mod.py").write_text("VALUE = 42\n")
    (tmp_path / "old_home_mod.py").write_text(
        "from harness.moved import module_moved\n\nmodule_moved(__name__, 'new_home_mod', since='9.9.0')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import old_home_mod  # noqa: F401 - the shim's import is the test
    assert sys.modules["old_home_mod"] is importlib.import_module("new_home_mod")
    assert sys.modules["old_home_mod"].VALUE == 42
    assert [w.category for w in caught] == [DeprecationWarning]
    message = str(caught[0].message)
    assert "old_home_mod moved to new_home_mod in 9.9.0" in message and moved.NAMES_REMOVED_IN in message
    assert caught[0].filename == __file__  # blamed on the importer
    assert moved.MODULES_MOVED.pop("old_home_mod") == ("new_home_mod", "9.9.0")
    for name in ("old_home_mod", "new_home_mod"):
        sys.modules.pop(name, None)
