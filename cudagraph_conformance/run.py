"""`cudagraph-conformance [pytest options] [suites/FILE::TEST ...]`: the suites under pytest.

What makes a run from the wheel the same as `pytest suites/ ...` in a checkout:
- the suites' parent directory is pytest's rootdir, so test ids read `suites/test_x.py::...` in
  the output, in the report and in known-failures files, wherever the suites are installed;
- the ini settings are the project's (the wheel carries them as `cudagraph_conformance/pytest.ini`,
  found beside the installed suites; a checkout has them in pyproject.toml);
- the directory you run from is importable (`--runtime mypackage.module:factory`), as with
  `python -m pytest`, and pytest's cache is written there, not into site-packages.

Arguments that start with `suites/` name the installed suites (`suites/test_padding.py`,
`--deselect suites/test_x.py::test_y`); without one, every suite runs. Everything else is passed to
pytest as given, so `--known-failures` and `--report-dir` are read relative to where you run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SUITES = "suites"


def suites_root() -> Path:
    """The directory that holds `suites/`: this package in a wheel, the repository in a checkout."""
    for root in (PACKAGE, PACKAGE.parent):
        if (root / SUITES).is_dir():
            return root
    raise FileNotFoundError(f"no {SUITES}/ beside {PACKAGE}: this installation of cudagraph-conformance "
                            "is incomplete; reinstall the wheel")


def _names_suites(arg: str) -> bool:
    path = arg.split("::", 1)[0].replace(os.sep, "/")
    return path == SUITES or path.startswith(SUITES + "/")


def _cache_disabled(argv: list[str]) -> bool:
    for index, arg in enumerate(argv):
        if arg == "-p" and argv[index + 1:index + 2] == ["no:cacheprovider"] or arg == "-pno:cacheprovider":
            return True
    return False


def pytest_args(argv: list[str], root: Path, cwd: Path) -> list[str]:
    """The arguments pytest gets: the suites' paths made absolute, and the rootdir and cache set."""
    args = [str(root / arg) if _names_suites(arg) else arg for arg in argv]
    if not any(_names_suites(arg) for arg in argv):
        args.append(str(root / SUITES))
    head = ["--rootdir", str(root)]
    if not _cache_disabled(argv):
        head += ["-o", f"cache_dir={cwd / '.pytest_cache'}"]
    return head + args


def main(argv: list[str] | None = None) -> int:
    import pytest

    argv = sys.argv[1:] if argv is None else list(argv)
    cwd = Path.cwd()
    if str(cwd) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(cwd))  # as `python -m pytest` does: --runtime mypackage.module:factory
    try:
        root = suites_root()
    except FileNotFoundError as exc:
        print(f"cudagraph-conformance: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)
    return int(pytest.main(pytest_args(argv, root, cwd)))
