"""A linter for the CI workflow files and the scripts they call (no network: actionlint is not
installable here, so the rules that matter are checked directly)."""
import importlib
import os
import re
import shlex
import shutil
import sys
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPTS = [ROOT / ".ci" / "run", *sorted((ROOT / "scripts").glob("*.sh"))]
EVENTS = {"push", "pull_request", "schedule", "workflow_dispatch", "workflow_call"}
CRON_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def load(path):
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key `on` as the boolean True
        data["on"] = data.pop(True)
    return data


def cron_field_ok(field, low, high):
    for part in field.split(","):
        part = part.split("/")[0]
        if part == "*":
            continue
        bounds = [int(x) for x in part.split("-")] if re.fullmatch(r"\d+(-\d+)?", part) else None
        if bounds is None or not all(low <= b <= high for b in bounds):
            return False
    return True


def test_there_are_a_cpu_and_a_nightly_gpu_workflow():
    names = {p.stem for p in WORKFLOWS}
    assert {"ci", "nightly-gpu"} <= names


def problems(path) -> list[str]:
    """What is wrong with a workflow file, as messages; empty when it is well formed."""
    found = []
    data = load(path)
    if not isinstance(data.get("name"), str):
        found.append("a workflow needs a name")
    trigger = data.get("on", {})
    events = set(trigger) if isinstance(trigger, (dict, list)) else {trigger}
    if not events or not events <= EVENTS:
        found.append(f"unknown or missing events {sorted(map(str, events - EVENTS)) or 'none'}")
    for schedule in (trigger.get("schedule", []) if isinstance(trigger, dict) else []):
        fields = str(schedule.get("cron", "")).split()
        if len(fields) != 5 or not all(cron_field_ok(f, *r) for f, r in zip(fields, CRON_RANGES)):
            found.append(f"bad cron {schedule.get('cron')!r}")
    if not data.get("jobs"):
        found.append("a workflow needs jobs")
    for name, job in (data.get("jobs") or {}).items():
        if "runs-on" not in job:
            found.append(f"job {name} has no runs-on")
        if not isinstance(job.get("timeout-minutes"), int):
            found.append(f"job {name} needs a timeout")
        for step in job.get("steps", []):
            if ("run" in step) == ("uses" in step):
                found.append(f"step {step} needs exactly one of run / uses")
            elif "uses" in step:
                if not re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]):
                    found.append(f"unpinned action {step['uses']}")
            else:
                if "with" in step:
                    found.append(f"`with` belongs to `uses` steps: {step}")
                for script in re.findall(r"((?:\.ci|scripts)/[\w./-]+)", step["run"]):
                    if not (ROOT / script).exists():
                        found.append(f"runs {script}, which does not exist")
    return found


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_well_formed(path):
    assert problems(path) == []


def test_the_linter_finds_mistakes(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\non:\n  schedule:\n    - cron: '61 2 * *'\n  pusher: {}\njobs:\n  j:\n"
        "    steps:\n      - uses: actions/checkout@main\n      - run: bash scripts/missing.sh\n        with: {a: 1}\n"
    )
    found = "\n".join(problems(bad))
    for expected in ("unknown or missing events", "bad cron", "no runs-on", "needs a timeout", "unpinned action",
                     "`with` belongs", "scripts/missing.sh"):
        assert expected in found


def test_cpu_workflow_runs_the_readme_test_command():
    steps = load(ROOT / ".github/workflows/ci.yml")["jobs"]["cpu"]["steps"]
    assert any(step.get("run", "").strip() == "bash .ci/run" for step in steps)
    assert "bash scripts/install.sh && python -m pytest -n 2" in (ROOT / "README.md").read_text()
    assert "python -m pytest -n 2" in (ROOT / ".ci/run").read_text()


def test_nightly_runs_on_a_gpu_runner_and_always_uploads():
    job = load(ROOT / ".github/workflows/nightly-gpu.yml")["jobs"]["gpu"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert any("scripts/nightly_gpu.sh" in step.get("run", "") for step in job["steps"])
    upload = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert upload and upload[0].get("if") == "always()"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ci_fails_when_no_test_runs(tmp_path):
    """A CI run that collects nothing must fail (pytest's exit 5), never pass."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / ".ci/run", tmp_path / ".ci/run")
    (tmp_path / "scripts/install.sh").write_text("exit 0\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(["bash", str(tmp_path / ".ci/run")], capture_output=True, text=True, cwd=tmp_path,
                            timeout=120)
    assert result.returncode == 5, result.stdout[-2000:] + result.stderr[-2000:]
    assert "collected no tests" in result.stdout


BUSY = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3:\n    pass\n"
ORPHAN = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1)\\n' + {BUSY!r}])\n"


def test_the_time_breakdown_script_reads_a_real_run(tmp_path):
    """scripts/time_breakdown.py: wall time, summed test time, the time before the first test and
    after the last, per-file and slowest tests, each also in loop-times (the yardstick loop, timed
    before and after the run); then the CPU time of the run, and of each test in its own process
    and in the processes it waited for (a test that sleeps uses next to none)."""
    (tmp_path / "test_two.py").write_text("import time\n\ndef test_slow():\n    time.sleep(0.2)\n\n"
                                          "def test_fast():\n    pass\n")
    (tmp_path / "test_cpu.py").write_text(
        f"import subprocess, sys\n\ndef test_busy():\n    exec({BUSY!r}, {{}})\n\n"
        f"def test_busy_child():\n    subprocess.run([sys.executable, '-c', {BUSY!r}], check=True)\n\n"
        # A child that starts a busy process and does not wait for it: an orphan, which ends after pytest.
        f"def test_busy_orphan():\n    subprocess.run([sys.executable, '-c', {ORPHAN!r}], check=True)\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "time_breakdown.py"), "--loop-additions", "2000000",
                             str(tmp_path / "test_two.py"), str(tmp_path / "test_cpu.py"), "-p", "no:xdist",
                             "-p", "no:cudagraph_conformance",  # which would end the orphan with the session
                             "--rootdir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert re.match(r"5 passed in ", lines[1])
    # At least the sleep's 0.2 s and the busy tests' 0.3 s each, in the tests and between the first's start and the last's end.
    summed = re.match(r"wall \d+\.\d s \(\d+\.\d loop-times\); summed test time (\d+\.\d) s \(\d+\.\d loop-times\)", lines[2])
    assert summed and float(summed[1]) >= 0.8, lines[2]
    # The run split where its tests start and end (scripts/lib/session_phases.py).
    split = re.match(r"before the first test \d+\.\d s \(.*\); from the first test's start to the last's end "
                     r"(\d+\.\d) s \(\d+\.\d loop-times\); after the last test \d+\.\d s", lines[3])
    assert split and float(split[1]) >= 0.8, lines[3]
    loop = re.match(r"the loop of 20,000,000 additions \(scaled from 2,000,000\) took (\d+\.\d+) s before the run and (\d+\.\d+) s after it", lines[4])
    assert loop and float(loop[1]) > 0 and float(loop[2]) > 0, lines[4]
    slowest = lines.index("slowest tests:")
    [sleeper] = [line for line in lines[slowest + 1:slowest + 5] if line.endswith("test_two.py::test_slow")]
    assert float(sleeper.split()[0]) >= 0.2, sleeper
    cpu = next(i for i, line in enumerate(lines) if line.startswith("CPU "))
    total = re.match(r"CPU (\d+\.\d) s \(\d+\.\d loop-times\) in the run's processes \(every one that ended, (\d+) "
                     r"orphans adopted here among them \((\d+\.\d) s\)\); on \d+ cores its wall time can be no less "
                     r"than \d+\.\d s", lines[cpu])
    assert total and float(total[1]) >= 0.9, lines[cpu]  # the busy tests' 0.3 s each, the orphan's, and pytest's own start
    assert int(total[2]) >= 1 and float(total[3]) >= 0.3, lines[cpu]  # the orphan, reaped by the script
    assert re.match(r"in the tests \d+\.\d s \(.*\) \(\d+\.\d s in their own processes, \d+\.\d s in processes they "
                    r"waited for\); outside them \d+\.\d s", lines[cpu + 1]), lines[cpu + 1]
    by_test = {line.split("::")[-1]: line for line in lines[lines.index("most CPU, by test:") + 1:]}
    own_and_waited = {name: tuple(map(float, re.search(r"\((\d+\.\d) s own, (\d+\.\d) s waited for\)", line).groups()))
                      for name, line in by_test.items()}
    assert own_and_waited["test_busy"][0] >= 0.3 and own_and_waited["test_busy"][1] == 0.0, by_test["test_busy"]
    assert own_and_waited["test_busy_child"][1] >= 0.3, by_test["test_busy_child"]  # in the process it waited for
    assert sum(own_and_waited["test_slow"]) <= 0.1, by_test["test_slow"]  # asleep: its 0.2 s of wall are no CPU
    unusable = subprocess.run([sys.executable, str(ROOT / "scripts" / "time_breakdown.py"), "--profile", "-n", "2"],
                              capture_output=True, text=True, timeout=60)
    assert unusable.returncode == 2 and "leave out -n" in unusable.stderr
    misused = subprocess.run([sys.executable, str(ROOT / "scripts" / "time_breakdown.py"), "--targets", "-n", "2"],
                             capture_output=True, text=True, timeout=60)
    assert misused.returncode == 2 and "give no pytest arguments" in misused.stderr


def scripts(name: str):
    """A module of scripts/ (not a package: each script puts its neighbours on the path as it runs)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module(name)


def timed_loop(before: float, after: float):
    """A time_breakdown.Yardstick whose loop took `before` and `after` seconds, without timing it."""
    yardstick_type = scripts("time_breakdown").Yardstick
    yardstick = yardstick_type.__new__(yardstick_type)
    yardstick.before, yardstick.after = before, after
    return yardstick


def test_a_targets_line_is_read_back_by_the_figures(tmp_path):
    """time_breakdown.py --targets writes one line a run (targets.txt); scripts/figures.py reads the
    loop-times, the target and the verdict back from it for the README's table."""
    figures, time_breakdown = scripts("figures"), scripts("time_breakdown")
    yardstick = timed_loop(1.0, 1.2)
    lines = [time_breakdown.run_line(1, "first-command", "342 passed, 49 skipped in 9.23s", 9.9, 17.6, 2, yardstick, 4.5,
                                     "NOT MET"),
             time_breakdown.run_line(2, "first-command", "342 passed, 49 skipped in 4.1s", 4.4, 8.8, 2, yardstick, 4.5, "met")]
    assert "17.6 s CPU (on 2 cores at least 8.0 loop-times)" in lines[0]  # 17.6 s over 2 cores, in loop-times of 1.1 s
    (tmp_path / "targets.txt").write_text("2 CPU cores\n" + "\n".join(lines) + "\n")
    assert figures.cpu_targets(tmp_path) == {"first-command": [(9.0, 4.5, False), (4.0, 4.5, True)]}
    assert figures.cpu_targets(tmp_path / "nowhere") == {}


def test_the_startup_floor_is_set_against_the_targets_cpu():
    """startup_floor.py's last line: the start-up, the fork server and what transformers adds to
    torch (each the least reading), in loop-times of CPU, against what the target allows on the
    machine's cores, and what is left for the tests."""
    floor = scripts("startup_floor")
    yardstick = timed_loop(1.5, 2.5)  # a loop-time of 2 s
    least = {floor.START_UP: 6.0, floor.FORK_SERVER: 2.0, floor.WITH_LLAMA: 5.0, floor.TORCH: 2.0}
    line = floor.floor_line(least, yardstick, 2, 4.5)
    assert line.startswith("floor: start-up 3.0 + fork server 1.0 + transformers over torch 1.5 = 5.5 loop-times")
    assert "allow 9.0, leaving 3.5 loop-times of CPU (7.0 s)" in line and "a loop-time is 2.00 s" in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_the_step_breakdown_script_says_it_needs_a_gpu():
    """scripts/step_breakdown.py times the device; without one it says so (no traceback)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "step_breakdown.py"), "--batch", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "needs a CUDA device" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_the_policy_comparison_loads_its_engines(tmp_path):
    """scripts/policy_compare.py: the default engines (the bucket engine among them, loaded through
    harness.runtime.registry) and a bad --engine, which is one line and exit 2."""
    script = str(ROOT / "scripts" / "policy_compare.py")
    result = subprocess.run([sys.executable, script, "--seqs", "8", "--q", "1", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = (tmp_path / "README.md").read_text()
    assert "- **bucket engine**: its own code" in summary and "| bucket engine |" in summary, summary[:3000]
    bad = subprocess.run([sys.executable, script, "--only-given", "--engine", "mine=no_such_module:make",
                          "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "--engine no_such_module:make: module 'no_such_module' failed to import" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("dont_write", ["1", None])
def test_the_gpu_scripts_keep_compiled_bytecode_where_the_machine_would_not(tmp_path, dont_write):
    """scripts/lib/bytecode_cache.sh: where PYTHONDONTWRITEBYTECODE is set, Python writes its
    bytecode under a cache of the scripts' own (and reads it back in the next process); where it
    is not, Python's own behaviour is left alone."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path)
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = dont_write
    (tmp_path / "probe_module.py").write_text("VALUE = 1\n")
    show = "import sys, probe_module; print(sys.flags.dont_write_bytecode, sys.pycache_prefix, sep=chr(10))"
    command = (f"source scripts/lib/bytecode_cache.sh && cd {shlex.quote(str(tmp_path))} && "
               f"{shlex.quote(sys.executable)} -c {shlex.quote(show)}")
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    cache = tmp_path / ".cache" / "cudagraph-conformance" / "pycache"
    if dont_write:
        assert result.stdout.splitlines() == ["0", str(cache)]
        assert list(cache.rglob("probe_module.*.pyc")), "the imported module's bytecode is in the cache"
    else:
        assert result.stdout.splitlines() == ["0", "None"]
        assert not cache.exists()


def test_the_fresh_machine_check_runs_the_readmes_two_commands_cpu():
    """scripts/fresh_machine.py takes the README's set-up commands from the README itself: the first
    runs the suites and writes a report, the second is CI's (test_cpu_workflow_runs_the_readme_test_command
    ties it to .ci/run); a README without two is refused."""
    fresh_machine = scripts("fresh_machine")
    first, second = fresh_machine.setup_commands((ROOT / "README.md").read_text())
    assert "suites/" in first and "--report-dir" in first
    assert second == "bash scripts/install.sh && python -m pytest -n 2"
    with pytest.raises(ValueError, match="two set-up commands"):
        fresh_machine.setup_commands("```sh\nbash scripts/install.sh && python -m pytest\n```\n")
