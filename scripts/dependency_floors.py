"""The suites against the reference runtime with the lowest versions pyproject.toml allows.

    python scripts/dependency_floors.py [--venv DIR] [--log reports/cpu/floors-COMMIT.log]

Reads the ranges of torch, transformers, pytest, hypothesis, pytest-xdist and pytest-benchmark from
pyproject.toml, asks the package index for the lowest release each range admits (a floor such as
`pytest-xdist>=3` may name a release that was never published: 3.0.2 is the first), makes a fresh
virtual environment with exactly those, installs this project into it without its dependencies,
and runs `python -m pytest suites/ --runtime reference -n 2` there. The log (the versions, the
command, pytest's output) goes to reports/cpu/; the exit status is pytest's. Needs the package
index (torch's floor comes from PyPI, its CUDA build; the suites run it on the CPU). Not part of
the README's test command: CI's floors job runs it (scripts/README.md).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORED = ("torch", "transformers", "pytest", "hypothesis", "pytest-xdist", "pytest-benchmark")
# What the suites need besides the floored ones, at whatever version pip picks for them.
OTHERS = ("matplotlib", "pyyaml", "filelock", "safetensors")


def ranges(pyproject: str) -> dict[str, str]:
    """{name: specifier} of the floored packages, as pyproject.toml's dependencies give them."""
    found = {}
    for name, spec in re.findall(r'^\s*"([A-Za-z0-9_.-]+)\s*([<>=!~][^";]*)', pyproject, re.MULTILINE):
        if name.lower() in FLOORED:
            found[name.lower()] = spec.strip()
    missing = set(FLOORED) - found.keys()
    if missing:
        raise SystemExit(f"pyproject.toml gives no range for {sorted(missing)}")
    return found


def lowest(name: str, spec: str, available: list[str]) -> str:
    """The lowest final release (no pre-release, no local build like +cpu) the range admits."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    versions = sorted(Version(v) for v in available if re.fullmatch(r"[\d.]+", v))
    admitted = [v for v in versions if v in SpecifierSet(spec)]
    if not admitted:
        raise SystemExit(f"{name}{spec}: the index has no release in that range")
    return str(admitted[0])


def index_versions(python: str, name: str) -> list[str]:
    out = subprocess.run([python, "-m", "pip", "index", "versions", name], capture_output=True, text=True).stdout
    line = next((line for line in out.splitlines() if line.startswith("Available versions:")), "")
    return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]


def run(command: list[str], log, **kwargs) -> int:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, **kwargs).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default="/tmp/cudagraph-conformance-floors", help="the environment (made if missing)")
    parser.add_argument("--log", help="default: reports/cpu/floors-COMMIT.log")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    log_path = Path(args.log or ROOT / "reports" / "cpu" / f"floors-{commit}.log")
    venv = Path(args.venv)
    python = str(venv / "bin" / "python")
    floors = {name: lowest(name, spec, index_versions(sys.executable, name))
              for name, spec in ranges((ROOT / "pyproject.toml").read_text()).items()}
    started = time.time()
    with open(log_path, "w") as log:
        log.write(f"# dependency floors at {commit}: the lowest releases pyproject.toml allows\n")
        log.write("".join(f"# {name}=={version}\n" for name, version in floors.items()))
        if not venv.exists() and run([sys.executable, "-m", "venv", str(venv)], log):
            return 1
        pins = [f"{name}=={version}" for name, version in floors.items()]
        if run([python, "-m", "pip", "install", "-q", *pins, *OTHERS], log):
            log.write("# a floor could not be installed: raise it in pyproject.toml to the lowest that installs\n")
            return 1
        if run([python, "-m", "pip", "install", "-q", "--no-deps", str(ROOT)], log,
               cwd=venv):
            return 1
        run([python, "-m", "pip", "freeze"], log)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYTEST_")}
        # The installed project, run from the checkout (pytest's rootdir and the suites' paths).
        status = run([python, "-m", "pytest", "suites/", "--runtime", "reference", "-n", "2", "-q",
                      "-p", "no:cacheprovider", "--report-dir", str(venv / "report")], log, cwd=ROOT, env=env)
        log.write(f"# pytest exited {status} after {time.time() - started:.0f} s in all\n")
    print(f"{log_path}: pytest exited {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
