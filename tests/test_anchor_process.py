"""The numerical anchor in a helper process (harness.expectations.anchor.AnchorProcess): the same
logits, scale and step rows as the Anchor in this process, a clear error when the helper fails,
dies or does not answer, nothing left running after it; and the harness starts one
(harness.session.anchor_helper) only where this process runs the anchor's tests and a core is
spare, and runs those tests last. One helper loads transformers here, in a plain run of the
anchor's suite (a helper costs a process its imports: a few seconds of CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.expectations import anchor as anchor_module
from harness.expectations.presets import checkpoint, preset
from harness.protocol import Request
from harness.session.machine import cores

ROOT = Path(__file__).resolve().parent.parent
SEQUENCE = list(range(1, 40))
REQUESTS = [Request(request_id=7, token_ids=(4, 5), context_len=3)]

# Loaded into the plain run below: before the helper is ended, what it answers, and whether the
# tests' own process ever imported transformers.
PROBE = '''
import json, os, sys
import pytest
import torch
from tests.test_anchor_process import REQUESTS, SEQUENCE

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    from harness.plugin import conformance_of
    anchor = conformance_of(session.config).anchor
    found = {"anchor": type(anchor).__name__, "pid": getattr(getattr(anchor, "_process", None), "pid", None),
             "transformers_here": "transformers" in sys.modules}
    if anchor is not None:
        out = os.environ["ANCHOR_PROBE_OUT"]
        torch.save({"logits": anchor.logits(SEQUENCE), "scale": anchor.scale,
                    "step": anchor.step(REQUESTS, {7: [1, 2, 3]})}, out + ".pt")
        try:
            anchor.logits([10 ** 9])
        except Exception as exc:
            found["bad_request"] = f"{type(exc).__name__}: {exc}"
        found["after_it"] = list(anchor.logits([1, 2]).shape)
    with open(os.environ["ANCHOR_PROBE_OUT"], "w") as out:
        json.dump(found, out)
'''


def test_a_plain_run_of_the_anchor_suite_computes_the_anchor_in_the_helper(tmp_path):
    """A run from the command line, in one process, on a machine with a core to spare: the anchor's
    tests run last and pass against the helper process, transformers never loads in the tests'
    process, the helper answers bit for bit as the Anchor in this process (one thread each), a
    request it cannot answer is reported and it answers the next, and it is gone when the run ends.
    (An xdist worker, or a session inside a test, keeps the anchor in its own process: the rest of
    the self-tests run it that way.)"""
    if cores() < 2:
        pytest.skip("one core: the harness starts no helper")
    (tmp_path / "anchor_probe.py").write_text(PROBE)
    environment = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}
    out = tmp_path / "probe.json"
    environment.update(ANCHOR_PROBE_OUT=str(out),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), environment.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "pytest", "suites/test_numerical_anchor.py", "suites/test_dispatch.py",
                             "--runtime", "reference", "-k", "(test_every_step_matches_transformers and NONE) or "
                             "test_runtime_mode_is_one_the_config_mode_can_run", "-p", "no:xdist", "-v",
                             "-p", "no:cacheprovider", "-p", "anchor_probe"],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    ran = [line.split("::")[0] for line in result.stdout.splitlines() if " PASSED" in line]
    assert ran == ["suites/test_dispatch.py", "suites/test_numerical_anchor.py"], ran  # the anchor's tests last
    probe = json.loads(out.read_text())
    assert probe["anchor"] == "AnchorProcess" and not probe["transformers_here"], probe
    assert not os.path.exists(f"/proc/{probe['pid']}"), "the helper outlived the run"
    assert probe["bad_request"].startswith("AnchorProcessError: the numerical anchor's helper process failed: ")
    assert probe["after_it"] == [2, preset("tiny").vocab]

    answered = torch.load(str(out) + ".pt")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the helper computes: the same sums in the same order
    try:
        here = anchor_module.Anchor(str(checkpoint("tiny")))
        assert torch.equal(answered["logits"], here.logits(SEQUENCE))
        assert answered["scale"] == here.scale
        assert torch.equal(answered["step"], here.step(REQUESTS, {7: [1, 2, 3]}))
    finally:
        torch.set_num_threads(threads)


def test_a_helper_that_died_is_a_clear_error_and_close_leaves_nothing_running():
    process = anchor_module.AnchorProcess("tiny", timeout=60)
    process._process.kill()
    process._process.wait(timeout=10)
    with pytest.raises(anchor_module.AnchorProcessError, match="did not answer 'logits'.*exit status: -9"):
        process.logits([1, 2, 3])
    process.close()

    process = anchor_module.AnchorProcess("tiny", timeout=60)
    pid = process._process.pid
    process.close()
    assert process._process.poll() is not None and not os.path.exists(f"/proc/{pid}")  # ended and reaped


def test_a_helper_that_does_not_answer_in_time_is_ended_and_said_so():
    process = anchor_module.AnchorProcess("tiny", timeout=0.01)  # still importing transformers
    with pytest.raises(anchor_module.AnchorProcessError, match="did not answer 'scale': TimeoutError: no answer within"):
        process.scale
    assert process._process.returncode is not None  # ended: a late answer can never be taken for the next one
    with pytest.raises(anchor_module.AnchorProcessError, match="did not answer 'logits'"):
        process.logits([1])
    process.close()


def test_the_helper_starts_only_for_anchor_tests_that_will_run():
    """harness.session.anchor_helper.runs_the_anchor: a test that uses the anchor and is not skipped
    outright, not one the runtime's missing capabilities skip, nor a test without the anchor."""
    from types import SimpleNamespace

    from harness.session.anchor_helper import runs_the_anchor

    def item(fixtures, skipped=False):
        return SimpleNamespace(fixturenames=fixtures,
                               get_closest_marker=lambda name: object() if skipped and name == "skip" else None)

    assert runs_the_anchor([item(["engines"]), item(["engines", "anchor"])])
    assert not runs_the_anchor([item(["engines"]), item(["engines", "anchor"], skipped=True)])
    assert not runs_the_anchor([])
