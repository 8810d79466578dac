"""scripts/ holds maintained tools only, each with its line in scripts/README.md (a one-off probe
lives beside the report it produced)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def scripts(folder: Path = SCRIPTS) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p != folder / "README.md")


def without_a_line(folder: Path = SCRIPTS) -> list[str]:
    readme = (folder / "README.md").read_text()
    return [name for name in scripts(folder) if f"`{name}`" not in readme]


def test_every_script_has_its_line_in_scripts_readme():
    assert not without_a_line(), "scripts/README.md has no line for these (or move a one-off beside its report)"


def test_the_check_sees_a_script_without_a_line(tmp_path):
    (tmp_path / "lib").mkdir()
    for name in ("install.sh", "lib/probe.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "README.md").write_text("| `install.sh` | installs |\n")
    assert without_a_line(tmp_path) == ["lib/probe.py"]
