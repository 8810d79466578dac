"""The numerical anchor in a helper process (harness.expectations.anchor.AnchorProcess): the same
logits, scale and step rows as the Anchor in this process, a clear error when the helper fails,
dies or does not answer, nothing left running after it; and the harness starts one
(harness.session.anchor_helper) only where this process runs the anchor's tests and a core is
spare, and runs those tests last. One helper loads transformers here, in a plain session of the
anchor's suite (a helper costs a process its imports: a few seconds of CPU)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.expectations import anchor as anchor_module
from harness.expectations.presets import checkpoint, preset
from harness.protocol import Request

ROOT = Path(__file__).resolve().parent.parent
SEQUENCE = list(range(1, 40))
REQUESTS = [Request(request_id=7, token_ids=(4, 5), context_len=3)]

class _Probe:
    """Loaded into the plain run below: what the session's helper answers, before it is ended."""

    def __init__(self):
        self.found = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        from harness.plugin import conformance_of

        anchor = conformance_of(session.config).anchor
        self.found = {"anchor": anchor, "pid": getattr(getattr(anchor, "_process", None), "pid", None)}
        if anchor is not None:
            self.found.update(logits=anchor.logits(SEQUENCE), scale=anchor.scale,
                              step=anchor.step(REQUESTS, {7: [1, 2, 3]}))
            with pytest.raises(anchor_module.AnchorProcessError) as failed:
                anchor.logits([10 ** 9])  # past the vocabulary
            self.found.update(bad_request=str(failed.value), after_it=tuple(anchor.logits([1, 2]).shape))


def test_a_session_asked_for_the_helper_computes_the_anchor_there(pytester, monkeypatch):
    """A session with `--anchor-process yes`: the anchor's tests run last and pass against the
    helper process (the Anchor is never built in the tests' process), the helper answers bit for
    bit as the Anchor here (one thread each), a request it cannot answer is reported and it answers
    the next, and it is gone when the session ends."""

    def built_here(*args, **kwargs):
        raise AssertionError("the Anchor was built in the tests' process")

    monkeypatch.setattr(anchor_module.Anchor, "__init__", built_here)
    probe = _Probe()
    result = pytester.runpytest(
        str(ROOT / "suites" / "test_numerical_anchor.py"), str(ROOT / "suites" / "test_dispatch.py"),
        "--runtime", "reference", "-k", "(test_every_step_matches_transformers and NONE) or "
        "test_runtime_mode_is_one_the_config_mode_can_run", "-p", "no:xdist", "-p", "no:cacheprovider",
        "--anchor-process", "yes", "--rootdir", str(ROOT), plugins=[probe])
    monkeypatch.undo()
    passed = [report.nodeid.split("::")[0] for report in result.reprec.getreports("pytest_runtest_logreport")
              if report.when == "call" and report.passed]
    assert passed == ["suites/test_dispatch.py", "suites/test_numerical_anchor.py"], result.stdout.str()[-2000:]
    found = probe.found
    assert isinstance(found["anchor"], anchor_module.AnchorProcess), found
    assert not os.path.exists(f"/proc/{found['pid']}"), "the helper outlived the session"
    assert found["bad_request"].startswith("the numerical anchor's helper process failed: ")
    assert found["after_it"] == (2, preset("tiny").vocab)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the helper computes: the same sums in the same order
    try:
        here = anchor_module.Anchor(str(checkpoint("tiny")))
        assert torch.equal(found["logits"], here.logits(SEQUENCE))
        assert found["scale"] == here.scale
        assert torch.equal(found["step"], here.step(REQUESTS, {7: [1, 2, 3]}))
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


def test_auto_starts_a_helper_in_a_plain_session_on_more_than_two_cores():
    from harness.session.anchor_helper import wanted

    assert wanted("auto", worker=False, nested=False, cores=16)
    assert not wanted("auto", worker=False, nested=False, cores=2)  # the second core is seldom idle
    assert not wanted("auto", worker=False, nested=True, cores=16)  # a session inside a test
    assert not wanted("auto", worker=True, nested=False, cores=16)
    assert wanted("yes", worker=False, nested=True, cores=1)
    assert not wanted("yes", worker=True, nested=False, cores=16)  # every worker collects the anchor's tests
    assert not wanted("no", worker=False, nested=False, cores=16)
