"""`cudagraph-conformance [pytest options] [suites/FILE::TEST ...]`: the suites under pytest.

What makes a run from the wheel the same as `pytest suites/ ...` in a checkout:
- the suites' parent directory is pytest's rootdir, so test ids read `suites/test_x.py::...` in
  the output, in the report and in known-failures files, wherever the suites are installed;
- the ini settings are the project's (the wheel carries them as `cudagraph_conformance/pytest.ini`,
  found beside the installed suites; a checkout has them in pyproject.toml);
- the directory you run from is importable (`--runtime mypackage.module:factory`), as with
  `python -m pytest`; pytest's cache, like every cache of a run, goes to a user cache kept per
  directory run from (harness/session/caches.py), neither there nor into site-packages.

Arguments that start with `suites/` name the installed suites (`suites/`, `suites/test_padding.py`,
`--deselect suites/test_x.py::test_y`); without one, every suite runs. Everything else is passed to
pytest as given, so `--known-failures` and `--report-dir` are read relative to where you run.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


PACKAGE = Path(__file__).resolve().parent
SUITES = "suites"
PATH_OPTIONS = ("--ignore", "--ignore-glob")  # paths, read from where you run
NODEID_OPTIONS = ("--deselect",)  # test ids, which pytest reads relative to the rootdir


def suites_root() -> Path:
    """The directory that holds `suites/`: this package in a wheel, the repository in a checkout."""
    for root in (PACKAGE, PACKAGE.parent):
        if (root / SUITES).is_dir():
            return root
    raise FileNotFoundError(f"no {SUITES}/ beside {PACKAGE}: this installation of cudagraph-conformance "
                            "is incomplete; reinstall the wheel")


def _names_suites(arg: str) -> bool:
    # `suites/...` only: a bare word "suites" may be an option's value (-k suites).
    return arg.replace(os.sep, "/").startswith(SUITES + "/")


def _cache_disabled(argv: list[str]) -> bool:
    for index, arg in enumerate(argv):
        if arg == "-p" and argv[index + 1:index + 2] == ["no:cacheprovider"] or arg == "-pno:cacheprovider":
            return True
    return False


def project_cache(cwd: Path) -> Path:
    """harness.session.caches.project_cache, loaded by its path: importing the harness package
    before pytest starts would keep pytest from rewriting its asserts (a warning on every run)."""
    spec = importlib.util.spec_from_file_location("_cudagraph_conformance_caches",
                                                  PACKAGE.parent / "harness" / "session" / "caches.py")
    caches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(caches)
    return caches.project_cache(cwd)


def config_file(root: Path) -> Path:
    """The project's pytest settings beside the suites: the wheel's pytest.ini, a checkout's pyproject.toml."""
    return next(path for path in (root / "pytest.ini", root / "pyproject.toml") if path.is_file())


def pytest_args(argv: list[str], root: Path, cwd: Path) -> list[str]:
    """The arguments pytest gets: the suites' paths made absolute, the rootdir, the settings and the
    cache set. Named explicitly: pytest would look for its settings above every argument that is
    a path, option values included (`--report-dir out`), and might not reach the suites' own."""
    args, positional = [], False
    for index, arg in enumerate(argv):
        option, equals, value = arg.partition("=")
        if equals and option in PATH_OPTIONS and _names_suites(value):
            args.append(f"{option}={root / value}")
        elif _names_suites(arg) and index and argv[index - 1] in NODEID_OPTIONS:
            args.append(arg)  # a test id, already relative to the rootdir
        elif _names_suites(arg):
            args.append(str(root / arg))
            positional |= not index or argv[index - 1] not in PATH_OPTIONS
        else:
            args.append(arg)
    if not positional:  # first: last, it would be read as the value of an option given none (`--runtime`)
        args.insert(0, str(root / SUITES))
    head = ["--rootdir", str(root), "-c", str(config_file(root))]
    if not _cache_disabled(argv):
        head += ["-o", f"cache_dir={project_cache(cwd) / 'pytest'}"]
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
