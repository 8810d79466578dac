"""What a newcomer meets: the README's two set-up commands, as the README writes them, in a fresh
clone with a fresh virtual environment, so that pip takes the newest releases the project's
ranges allow. CI's machine keeps what it has installed and does not see a new release of a
dependency (pytest, hypothesis, pytest-benchmark, transformers) break a test; this does. The clone
sits in a deep folder with a space in its name and the environment in the clone's `.venv`, as a
newcomer's may: a test that splits a path on spaces, puts one in a shell command unquoted, or
matches a command line cut to its two ends for a message meets one that breaks it.

    python scripts/fresh_machine.py OUT [--ref REF] [--python PYTHON]

Writes OUT/command-1.log and OUT/command-2.log (each the command, its output, exit status and
wall time), OUT/versions.txt (what pip installed) and OUT/summary.txt; exits 1 when a command
failed. Needs the network (pip) and a few minutes (the first command downloads torch).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "bash scripts/install.sh && "


def setup_commands(readme: str) -> list[str]:
    """The README's set-up commands: every line of a sh block that installs, then runs."""
    blocks = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines() if line.startswith(INSTALL)]
    if len(commands) != 2:
        raise ValueError(f"the README should have two set-up commands (sh lines starting {INSTALL!r}), "
                         f"found {len(commands)}: {commands}")
    return commands


def fresh_environment(python: str, venv: Path) -> dict:
    """The environment of a shell with the new virtual environment activated, and nothing of ours."""
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHON")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command: str, cwd: Path, env: dict, log: Path) -> tuple[int, float]:
    start = time.perf_counter()
    with log.open("w") as out:
        out.write(f"$ {command}\n")
        out.flush()
        status = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - start
        out.write(f"exit {status}, {seconds:.1f} s wall\n")
    return status, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the logs")
    parser.add_argument("--ref", default="HEAD", help="the commit to check out (default HEAD)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the environment is made from")
    args = parser.parse_args(argv)
    try:
        commit = subprocess.run(["git", "rev-parse", "--verify", f"{args.ref}^{{commit}}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError:
        print(f"fresh_machine: {args.ref!r} is not a commit of {ROOT}; give --ref a commit, branch or tag",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fresh-machine-"))
    try:
        checkout = work / "home" / "a newcomer" / "projects" / "cudagraph-conformance"
        checkout.parent.mkdir(parents=True)
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(checkout)], check=True)
        subprocess.run(["git", "checkout", "--quiet", commit], cwd=checkout, check=True)
        commands = setup_commands((checkout / "README.md").read_text())
        venv = checkout / ".venv"
        env = fresh_environment(args.python, venv)
        lines = [f"commit {commit}, a fresh clone and virtual environment ({args.python})"]
        failed = False
        for number, command in enumerate(commands, 1):
            status, seconds = run(command, checkout, env, args.out / f"command-{number}.log")
            lines.append(f"command {number}: {command}: exit {status}, {seconds:.1f} s wall")
            failed |= status != 0
        freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all", "--exclude-editable"],
                                env=env, capture_output=True, text=True).stdout
        (args.out / "versions.txt").write_text(freeze)
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
