"""The wheel an engine team installs: it carries the harness, the reference runtime and the suites,
and in a fresh environment, from a directory that is not this repository, `cudagraph-conformance`
runs the suites against an installed runtime exactly as `pytest suites/` does in a checkout: the
same tests, the same outcomes, the same suites digest in the report.

The build and the environment are made once for a test run: an sdist from the tree, a wheel from
the sdist (what `python -m build` does, offline: `--no-build-isolation` uses the installed
setuptools), and a virtual environment holding the wheel and the example engine, which sees the
packages of the environment running the tests behind its own (torch, transformers, pytest and
hypothesis; no network).
"""
from __future__ import annotations

import configparser
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import harness
from cudagraph_conformance import run
from harness.session import caches
from tests import catching

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGED = ("harness", "reference_runtime", "cudagraph_conformance")
BUILD_INPUTS = ("pyproject.toml", "README.md", *PACKAGED, "suites", "examples/bucket_engine")


def tree_packages() -> set[str]:
    return {".".join(init.parent.relative_to(ROOT).parts) for top in PACKAGED for init in (ROOT / top).rglob("__init__.py")}


def expected_wheel_files(root: Path = ROOT) -> set[str]:
    """What the suites need from the wheel: every module of the packages, every suite, the ini."""
    files = {path.relative_to(root).as_posix() for top in PACKAGED for path in (root / top).rglob("*.py")
             if "__pycache__" not in path.parts}
    files |= {f"cudagraph_conformance/suites/{path.name}" for path in (root / "suites").glob("*.py")}
    return files | {"cudagraph_conformance/pytest.ini"}


def missing_from_wheel(wheel: Path, root: Path = ROOT) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return sorted(expected_wheel_files(root) - set(archive.namelist()))


def clean_env(**extra) -> dict:
    """This process's environment without what points Python or pytest at this checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYTEST_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def check_run(command: list[str], cwd: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


# -- cheap checks of the packaging itself ---------------------------------------------------------
def test_pyproject_lists_every_package_in_the_tree():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    expected = tree_packages() | {"cudagraph_conformance.suites"}
    assert listed == expected, (f"pyproject.toml [tool.setuptools] packages: add {sorted(expected - listed)}, "
                                f"remove {sorted(listed - expected)}")


def test_the_installed_suites_are_configured_as_in_a_checkout():
    """cudagraph_conformance/pytest.ini is pyproject.toml's pytest settings, less testpaths, plus the
    reproduction command that works from any directory."""
    ini = configparser.ConfigParser()
    ini.read(ROOT / "cudagraph_conformance" / "pytest.ini")
    installed = dict(ini["pytest"])
    project = {key: str(value).lower() if isinstance(value, bool) else " ".join(value) if isinstance(value, list)
               else str(value) for key, value in PYPROJECT["tool"]["pytest"]["ini_options"].items()}
    del project["testpaths"]
    assert installed.pop("reproduce_command") == "cudagraph-conformance"
    assert installed == project


def test_a_wheel_missing_a_file_the_suites_need_is_caught(tmp_path):
    """The check below, shown failing: a wheel of the tree's files less one module."""
    wheel = tmp_path / "cudagraph_conformance-0-py3-none-any.whl"
    wanted = expected_wheel_files()
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in sorted(wanted - {"harness/scenarios/batches.py", "cudagraph_conformance/suites/test_padding.py"}):
            archive.writestr(name, "")
    assert missing_from_wheel(wheel) == ["cudagraph_conformance/suites/test_padding.py", "harness/scenarios/batches.py"]


@pytest.mark.parametrize("argv, expected_tail", [
    (["--runtime", "x"], ["{root}/suites", "--runtime", "x"]),
    (["suites/test_padding.py::test_a[x]", "-q"], ["{root}/suites/test_padding.py::test_a[x]", "-q"]),
    (["suites/", "--known-failures", "suites.toml"], ["{root}/suites", "--known-failures", "suites.toml"]),
    (["--deselect", "suites/test_dispatch.py::t", "-k", "suites"], ["{root}/suites", "--deselect",
                                                                    "suites/test_dispatch.py::t", "-k", "suites"]),
    (["--ignore", "suites/test_serving.py", "--ignore-glob=suites/*step*"],
     ["{root}/suites", "--ignore", "{root}/suites/test_serving.py", "--ignore-glob={root}/suites/*step*"]),
])
def test_arguments_that_name_suites_name_the_installed_ones(tmp_path, argv, expected_tail):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    args = run.pytest_args(argv, tmp_path, Path("/work"))
    assert args[:6] == ["--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "-o",
                         f"cache_dir={caches.project_cache(Path('/work')) / 'pytest'}"]
    assert args[6:] == [a.replace("{root}", str(tmp_path)) for a in expected_tail]
    assert "-o" not in run.pytest_args(["-p", "no:cacheprovider"], tmp_path, Path("/work"))
    assert run.pytest_args([], ROOT, Path("/work"))[3] == str(ROOT / "pyproject.toml")  # in a checkout


def test_a_run_writes_nothing_into_the_directory_it_runs_from_but_its_report(tmp_path):
    """pytest-benchmark's storage and hypothesis's directory (database, constants) go to the user
    cache (harness/session/caches.py), not into the engine's repository the suites run from."""
    work, cache = tmp_path / "engine-repo", tmp_path / "cache"
    work.mkdir()
    check_run([sys.executable, "-m", "pytest", str(ROOT / "suites" / "test_padding.py"), str(ROOT / "suites" / "test_dispatch.py"),
               "--runtime", "reference", "-p", "no:xdist", "-q", "--report-dir", "out"], cwd=work,
              PYTHONPATH=str(ROOT), CUDAGRAPH_CONFORMANCE_CACHE=str(cache))
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    [project] = cache.iterdir()
    assert project.name.startswith("engine-repo-") and (project / "hypothesis").is_dir(), list(project.iterdir())


# -- the wheel, built and installed ----------------------------------------------------------------
def build(base: Path) -> dict[str, str]:
    """An sdist of the tree and a wheel built from that sdist, as `python -m build` makes them."""
    tree = base / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in BUILD_INPUTS:
        source = ROOT / name
        (shutil.copytree(source, tree / name, ignore=ignore) if source.is_dir()
         else (tree / name).parent.mkdir(parents=True, exist_ok=True) or shutil.copy(source, tree / name))
    dist = base / "dist"
    sdist = check_run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                       "print(b.build_sdist(sys.argv[1]))", str(dist)], cwd=tree).stdout.split()[-1]
    with tarfile.open(dist / sdist) as archive:
        # Our own sdist, just built; the "data" filter where this Python has it (3.12 warns without one).
        archive.extractall(base / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    source = next((base / "unpacked").iterdir())
    check_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
               "-w", str(dist), str(source)], cwd=base)
    return {"sdist": str(dist / sdist), "wheel": str(next(dist.glob("*.whl"))),
            "example": str(tree / "examples" / "bucket_engine")}


def make_venv(built: dict[str, Path], base: Path) -> str:
    """A fresh environment with the wheel and the example engine, and behind its own packages this
    environment's: its site directories, added by a .pth file as the interpreter adds its own (their
    .pth files run too). `--system-site-packages` would add the base interpreter's instead, which
    lack torch and pytest where the tests run in a virtual environment, as a newcomer's do."""
    env = base / "env"
    check_run([sys.executable, "-m", "venv", "--without-pip", str(env)], cwd=base)
    python = env / "bin" / "python"
    own = check_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=base).stdout
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(own.strip()) / "tests-environment.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in ours if Path(path).is_dir()))
    check_run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
               "--no-build-isolation", "--ignore-installed", "-q", str(built["wheel"]), str(built["example"])],
              cwd=base)
    return str(env)


# Made once a test run, by whichever xdist worker asks first (tests.catching.once_per_run): the
# tests of this module go to whichever worker is free, and each would otherwise build its own.
@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    return {name: Path(path) for name, path in catching.once_per_run(tmp_path_factory, "wheel", build).items()}


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    return Path(catching.once_per_run(tmp_path_factory, "venv", lambda base: make_venv(built, base)))


def test_the_sdist_and_the_wheel_carry_every_file_the_suites_need(built):
    assert missing_from_wheel(built["wheel"]) == []
    with tarfile.open(built["sdist"]) as archive:
        suites = {Path(name).name for name in archive.getnames() if Path(name).parent.name == "suites"}
    assert suites == {path.name for path in (ROOT / "suites").glob("*.py")}


def test_the_installed_suites_run_from_any_directory_as_in_a_checkout(venv, tmp_path, request):
    """The example engine's suites from the wheel, in a temporary directory, and from this checkout
    (the session tests/test_broken_example_engines.py reads too, run once): the same tests with the
    same outcomes, the same suites digest, the same harness version; the commit only where the
    harness is this project's own checkout. The checkout's session is asked for after the wheel's
    has run: under xdist another worker is running it meanwhile (tests/conftest.py: FIRST)."""
    work = tmp_path / "engine-repo"
    work.mkdir()
    where = check_run([str(venv / "bin" / "python"), "-c", "import harness, cudagraph_conformance.run as r; "
                       "print(harness.__file__); print(r.suites_root())"], cwd=work).stdout.splitlines()
    assert all(Path(path).is_relative_to(venv) for path in where), where  # not this checkout

    check_run([str(venv / "bin" / "cudagraph-conformance"), *catching.CHECKOUT_OPTIONS, "--report-dir", "reports"],
              cwd=work)
    from_wheel = json.loads((work / "reports" / "conformance-bucket-engine.json").read_text())
    assert sorted(p.name for p in work.iterdir()) == ["reports"], "the run wrote into the engine's repository"

    checkout = request.getfixturevalue("bucket_engine_in_the_checkout")
    assert checkout["ret"] == 0, checkout["output"]
    from_repo = checkout["report"]

    outcomes = {run_: {t["nodeid"]: t["outcome"] for t in r["tests"]}
                for run_, r in (("wheel", from_wheel), ("repo", from_repo))}
    assert outcomes["wheel"] == outcomes["repo"]
    assert from_wheel["summary"] == from_repo["summary"] and set(from_wheel["summary"]) == {"passed", "skipped"}
    assert from_wheel["suites_digest"] == from_repo["suites_digest"]
    assert from_wheel["suite_files"].keys() == {f"suites/{p.name}" for p in (ROOT / "suites").glob("test_*.py")}
    assert from_wheel["harness_version"] == from_repo["harness_version"] == harness.__version__
    assert from_wheel["git_commit"] == "unknown"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert from_repo["git_commit"] == (head.stdout.strip() if head.returncode == 0 else "unknown")


def test_an_engine_repository_runs_its_own_runtime_with_its_own_known_failures(venv, tmp_path):
    """`python -m cudagraph_conformance`, from the engine's directory: its runtime by
    module:factory, its known-failures file (a bounded entry, and the harness versions it was
    written for), its report directory; failures reproduce with the installed command."""
    work = tmp_path / "engine-repo"
    work.mkdir()
    (work / "my_engine.py").write_text(
        "from bucket_engine.runtime import BucketRuntime\n\n\n"
        "class MyEngine(BucketRuntime):\n"
        "    name = 'my-engine'\n\n"
        "    def padded_size(self, config, num_real_tokens):  # clamps a batch above the user's largest size\n"
        "        sizes = self.capture_sizes(config)\n"
        "        if config.capture_sizes == (3, 7, 30) and sizes and num_real_tokens > sizes[-1]:\n"
        "            return sizes[-1]\n"
        "        return super().padded_size(config, num_real_tokens)\n")
    (work / "ci").mkdir()
    (work / "ci" / "known_failures.toml").write_text(
        'harness_versions = "<0.0.1"\n\n[[failure]]\n'
        'test = "suites/test_padding.py::test_above_the_max_runs_eager_and_at_the_max_pads_nothing[my-engine-user-sizes]"\n'
        'category = "notyet"\nreason = "clamps batches above the largest user size; my-engine#1"\n'
        'match = "holds every real token"\n')
    command = [str(venv / "bin" / "python"), "-m", "cudagraph_conformance", "suites/test_padding.py", "--runtime",
               "my_engine:MyEngine", "--known-failures", "ci/known_failures.toml", "--report-dir", "out", "-p", "no:xdist"]
    result = check_run(command, cwd=work)
    assert "stale known failures" in result.stdout and "written for harness versions <0.0.1" in result.stdout
    report = json.loads((work / "out" / "conformance-my-engine.json").read_text())
    assert report["summary"] == {"passed": 18, "xfailed": 1, "skipped": 2}, report["summary"]
    [known] = report["known_failures_files"]
    assert known["path"] == "ci/known_failures.toml" and known["stale"].startswith("written for harness versions <0.0.1")
    assert known["covered"] == {"ci/known_failures.toml:failure #1": 1}

    (work / "ci" / "known_failures.toml").write_text("")  # without the entry the slip fails, with its reproduction
    failed = subprocess.run(command, cwd=work, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1
    assert ("reproduce: cudagraph-conformance 'suites/test_padding.py::test_above_the_max_runs_eager_and_at_the_max_"
            "pads_nothing[my-engine-user-sizes]' --runtime my_engine:MyEngine") in failed.stdout


def test_the_docs_install_the_wheel_this_version_builds():
    """A wheel named in the docs' commands is the one `pip wheel` makes of this version: an older name
    is a file that does not exist (README.md named 0.3.0's until 0.5.0)."""
    import re

    root = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/authoring.md"):
        named = set(re.findall(r"cudagraph_conformance-([\w.]+)-py3-none-any\.whl", (root / doc).read_text()))
        assert named <= {harness.__version__}, f"{doc} installs wheels of versions {sorted(named)}"
