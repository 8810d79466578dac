"""Where a report came from: the harness version, a digest of the suite files that ran, the commit
only where the harness is this project's own checkout; known-failures files that name the
harness versions they were written for; and a first run whose header says what it skips."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.reports import report
from harness.session import known_failures, machine

ROOT = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_tree(path: Path) -> str:
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return git(path, "rev-parse", "HEAD")


@pytest.fixture
def project_tree(tmp_path) -> Path:
    tree = tmp_path / "my project"  # a space, as in many a user's path: git's answer is read by line
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_commit_is_the_projects_own_checkouts(project_tree):
    commit = commit_tree(project_tree)
    assert report.git_commit(project_tree) == commit


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_tree_that_differs_from_its_commit_says_so(project_tree, tmp_path):
    """A working tree copied beside an older .git (a GPU machine's copy of a checkout) must not pass
    for that commit."""
    commit_tree(project_tree)
    assert report.tree_changed(project_tree) is False
    (project_tree / "pyproject.toml").write_text((project_tree / "pyproject.toml").read_text() + "\n# edited\n")
    assert report.tree_changed(project_tree) is True
    assert report.tree_changed(tmp_path / "site-packages") is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_tree_exported_into_another_repository_has_no_commit(tmp_path, project_tree):
    """The issue's case: the enclosing repository's HEAD is not the project's."""
    outer = tmp_path / "engine"
    shutil.copytree(project_tree, outer / "vendor" / "cudagraph-conformance")
    commit_tree(outer)
    assert report.git_commit(outer / "vendor" / "cudagraph-conformance") == "unknown"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_another_projects_checkout_or_an_installed_harness_has_no_commit(tmp_path, project_tree):
    (project_tree / "pyproject.toml").write_text('[project]\nname = "someone-elses-engine"\n')
    commit_tree(project_tree)
    assert report.git_commit(project_tree) == "unknown"
    assert report.git_commit(tmp_path / "site-packages") == "unknown"  # no pyproject: a wheel's install


def test_the_suites_digest_names_the_code_that_ran(tmp_path):
    a = {"suites/test_a.py": "1" * 64, "suites/test_b.py": "2" * 64}
    assert report.suites_digest(a) == report.suites_digest(dict(reversed(a.items())))
    assert report.suites_digest(a) != report.suites_digest({**a, "suites/test_b.py": "3" * 64})
    assert report.suites_digest(a) != report.suites_digest({"suites/test_a.py": "1" * 64})
    (tmp_path / "t.py").write_text("x")
    assert report.file_digest(tmp_path / "t.py") == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    assert report.file_digest(tmp_path / "gone.py").startswith("unreadable")


def test_the_report_carries_its_provenance(pytester):
    pytester.makepyfile(test_one="def test_a():\n    pass\n")
    result = pytester.runpytest("--report-dir", "out", "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret == 0
    data = json.loads((pytester.path / "out" / "conformance-reference.json").read_text())
    assert data["harness_version"] == harness.__version__
    digest = report.file_digest(pytester.path / "test_one.py")
    assert data["suite_files"] == {"test_one.py": digest}
    assert data["suites_digest"] == report.suites_digest({"test_one.py": digest})
    assert data["git_commit"] == report.git_commit()  # the harness's checkout, wherever the run was
    markdown = (pytester.path / "out" / "conformance-reference.md").read_text()
    assert f"- harness: {harness.__version__}, suites {data['suites_digest'][:12]} (1 files)" in markdown
    release, build = machine.torch_version()
    assert (data["torch"], data["torch_build"]) == (release, build) and "+" not in data["torch"]
    assert f"- torch: {release}{f' ({build})' if build else ''}, python" in markdown


@pytest.mark.parametrize("written, expected", [
    ("__version__ = '2.5.1+cu124'", ("2.5.1", "cu124")), ("__version__: str = \"2.4.0\"", ("2.4.0", None)),
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None", ("2.13.0", "cpu")),
], ids=["cuda-wheel", "no-build", "cpu-wheel"])
def test_the_torch_version_is_read_from_torch_itself_and_split(tmp_path, written, expected):
    """Read from torch/version.py, never the wheel's metadata (PyPI's CUDA wheels say "2.5.1" there
    and "2.5.1+cu124" in torch.__version__): the same string whether the run imported torch or not."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('read, never imported')\n")
    (tmp_path / "torch" / "version.py").write_text(written + "\n")
    code = "from harness.session.machine import torch_version; print(torch_version())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""}, check=True)
    assert done.stdout.strip() == repr(expected)


# -- known-failures files and harness versions ------------------------------------------------------
def write(tmp_path, text: str) -> Path:
    path = tmp_path / "known.toml"
    path.write_text(text)
    return path


def test_a_file_names_the_harness_versions_it_was_written_for(tmp_path):
    current = known_failures.read(write(tmp_path, f'harness_versions = "=={harness.__version__}"\n'))
    assert current.harness_versions == f"=={harness.__version__}" and current.version_stale() is None
    older = known_failures.read(write(tmp_path, 'harness_versions = "<0.1"\n'))
    assert older.version_stale("0.1.0") == ("written for harness versions <0.1, and this is 0.1.0: check that its "
                                            "entries still hold, then update harness_versions")
    assert older.version_stale("0.0.9") is None
    assert known_failures.read(write(tmp_path, "")).version_stale() is None  # no versions named: never stale


@pytest.mark.parametrize("value", ['"0.1"', '"latest"', "1", '[">=0.1"]'])
def test_harness_versions_must_be_a_specifier(tmp_path, value):
    with pytest.raises(known_failures.KnownFailuresError, match=r"harness_versions must be a version specifier "
                                                                r"string such as \">=0.1,<0.2\""):
        known_failures.read(write(tmp_path, f"harness_versions = {value}\n"))


def test_a_file_for_other_versions_is_reported_stale_and_still_applies(pytester):
    pytester.makepyfile(test_one="def test_a():\n    assert False, 'wrong'\n")
    pytester.makefile(".toml", known='harness_versions = ">=99"\n[[failure]]\ntest = "test_one.py::test_a"\n'
                                     'category = "notyet"\nreason = "wrong for now"\n')
    result = pytester.runpytest("--known-failures", "known.toml", "--report-dir", "out", "-p", "no:cacheprovider",
                                "-p", "no:xdist")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*stale known failures*", f"known.toml: written for harness versions >=99, and this "
                                 f"is {harness.__version__}: check that its entries still hold*"])
    result.assert_outcomes(xfailed=1)
    [entry] = json.loads((pytester.path / "out" / "conformance-reference.json").read_text())["known_failures_files"]
    assert entry["stale"].startswith("written for harness versions >=99") and entry["covered"] == {"known.toml:failure #1": 1}


# -- the first run: quiet, and its header says what it skips ------------------------------------------
def test_the_first_command_prints_no_library_warning_and_says_what_it_skips():
    """The README's first command on one suite, under xdist as it is run (one worker is enough:
    pytest-benchmark warned in every process)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "suites/test_padding.py", "--runtime", "reference", "-n", "1",
                             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Warning" not in output and "warnings summary" not in output, output[:3000]
    head = output.split("created: ")[0].splitlines()
    assert "skipped: tests that need batch_invariant (runtime 'reference' does not declare them)" in head
    assert ("skipped: the benchmark lane (test_step_latency.py, test_serving.py): benchmarks need CUDA graphs on a "
            "GPU, and this run's graph backend is emulated") in head
