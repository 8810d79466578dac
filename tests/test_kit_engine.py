"""The engine kit (harness/kit/) on stand-ins, no GPU and no engine: the event log and its timer,
the process-state guard, the config checks, policy delegation, and the scheduled-engine base
whose step fails loudly where a stand-in engine runs something other than what was asked."""
import os
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

from harness import protocol as p
from harness.kit import guard
from harness.kit.block_book import BlockBook
from harness.kit.checks import check_mode, check_one_gpu_config
from harness.kit.delegate import PolicyDelegate
from harness.kit.events import EventLog
from harness.kit.scheduled import ScheduledEngine
from harness.protocol import Request


# -- events --------------------------------------------------------------------------------------
def test_events_go_to_the_file_the_variable_names_and_a_failed_stage_says_so(tmp_path, monkeypatch):
    path = tmp_path / "events.log"
    monkeypatch.setenv("KIT_TEST_EVENTS", str(path))
    log = EventLog("kit_test", "KIT_TEST_EVENTS")
    with log.timed("build"):
        pass
    with pytest.raises(KeyError), log.timed("capture"):
        raise KeyError("boom")
    lines = path.read_text().splitlines()
    assert lines[0].endswith("build: 0.0s") and "FAILED capture after" in lines[1] and "KeyError" in lines[1]


def test_an_events_file_that_cannot_be_written_is_a_line_on_stderr_not_a_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KIT_TEST_EVENTS", str(tmp_path / "missing" / "events.log"))
    EventLog("kit_test", "KIT_TEST_EVENTS").event("built")
    assert "kit_test: cannot append to" in capsys.readouterr().err


# -- guard ---------------------------------------------------------------------------------------
def test_the_environment_is_put_back_after_a_call_that_changes_it(monkeypatch):
    monkeypatch.setenv("KIT_TEST_KEPT", "before")
    monkeypatch.delenv("KIT_TEST_ADDED", raising=False)
    with guard.environment_restored():
        os.environ["KIT_TEST_KEPT"] = "changed"
        os.environ["KIT_TEST_ADDED"] = "1"
    assert os.environ["KIT_TEST_KEPT"] == "before" and "KIT_TEST_ADDED" not in os.environ


def test_apply_environment_sets_defaults_and_a_variable_already_set_wins(monkeypatch):
    monkeypatch.setenv("KIT_TEST_SET", "mine")
    monkeypatch.delenv("KIT_TEST_DEFAULT", raising=False)
    guard.apply_environment({"KIT_TEST_SET": "default", "KIT_TEST_DEFAULT": "default"})
    assert (os.environ["KIT_TEST_SET"], os.environ["KIT_TEST_DEFAULT"]) == ("mine", "default")
    monkeypatch.delenv("KIT_TEST_DEFAULT")


def test_draws_inside_a_forked_call_leave_the_callers_generator_as_it_was():
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    with guard.random_forked():
        torch.rand(100)
    assert torch.equal(torch.rand(4), expected)


def test_an_engines_own_stream_goes_on_between_calls_and_the_callers_is_untouched():
    rng = guard.EngineRandom(seed=7, device=None)
    torch.manual_seed(1)
    caller = torch.get_rng_state()
    with guard.own_random(rng):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), caller)
    with guard.own_random(rng):
        second = torch.rand(3)
    one_stream = torch.Generator().manual_seed(7)
    assert torch.equal(torch.cat([first, second]), torch.rand(6, generator=one_stream))


@pytest.mark.parametrize("own", [False, True])
def test_process_state_restored_puts_back_the_environment_and_the_callers_generator(own, monkeypatch):
    monkeypatch.delenv("KIT_TEST_ADDED", raising=False)
    monkeypatch.setenv("KIT_TEST_CHANGED", "before")
    rng = guard.EngineRandom(seed=7, device=None) if own else None
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    with guard.process_state_restored(rng):
        os.environ["KIT_TEST_ADDED"], os.environ["KIT_TEST_CHANGED"] = "1", "after"
        drawn = torch.rand(3)
    assert "KIT_TEST_ADDED" not in os.environ and os.environ["KIT_TEST_CHANGED"] == "before"
    assert torch.equal(torch.rand(4), expected)
    if own:  # the engine's draws came from its own stream
        assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(7)))


def test_engines_share_one_stream_a_device(monkeypatch):
    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: made.append(device) or f"stream of {device}")
    streams = {}
    assert guard.shared_stream(streams, 0) == guard.shared_stream(streams, 0) == "stream of 0"
    assert guard.shared_stream(streams, 1) == "stream of 1" and made == [0, 1]


# -- checks --------------------------------------------------------------------------------------
def config(**changes):
    base = p.EngineConfig(preset="tiny", dtype="float32", device="cuda", graph_backend="cuda",
                          policy=p.PolicyConfig(), attention_backends=("TRITON",), checkpoint="/models/tiny")
    return replace(base, **changes)


@pytest.mark.parametrize("changes,message", [
    ({"graph_backend": "emulated"}, "runs CUDA graphs on a GPU"),
    ({"device": "cpu"}, "runs CUDA graphs on a GPU"),
    ({"checkpoint": None}, "loads a Hugging Face checkpoint"),
    ({"data_parallel": object()}, "runs one rank"),
    ({"attention_backends": ("FLASH",)}, "runs the Triton backend only; asked for ['FLASH']"),
])
def test_a_config_this_runtime_cannot_run_is_one_clear_line(changes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_one_gpu_config(config(**changes), "stand-in", "TRITON", "the Triton backend")


def test_a_config_it_can_run_passes_and_no_attention_named_means_its_own():
    check_one_gpu_config(config(), "stand-in", "TRITON", "the Triton backend")
    check_one_gpu_config(config(attention_backends=()), "stand-in", "TRITON", "the Triton backend")
    with pytest.raises(ValueError, match="unknown config mode 'FAST'"):
        check_mode(config(policy=p.PolicyConfig(mode="FAST")))


# -- delegate ------------------------------------------------------------------------------------
def test_the_four_policy_questions_reach_the_policy_object():
    asked = []

    class Policy:
        def __getattr__(self, name):
            return lambda *args: asked.append((name, args)) or name

    runtime = PolicyDelegate()
    runtime.policy = Policy()
    cfg = p.PolicyConfig()
    answers = (runtime.capture_sizes(cfg), runtime.padded_size(cfg, 3), runtime.dispatch(cfg, 3, 2, True),
               runtime.resolve_mode("request"))
    assert answers == ("capture_sizes", "padded_size", "dispatch", "resolve_mode")
    assert asked[2] == ("dispatch", (cfg, 3, 2, True, 0))


# -- the scheduled-engine base, on a stand-in engine ---------------------------------------------
@dataclass
class Placed:
    request_id: int
    context_len: int
    new_tokens: tuple
    num_new: int


class Book(BlockBook):
    def placed(self, request, live, tokens):
        return Placed(request.request_id, request.context_len, tokens, len(tokens))


class Observer:
    def start(self, eager_size=None, fill=None):
        self.record = SimpleNamespace(path="FULL", eager_size=eager_size, fill=fill)
        return self.record

    def stop(self):
        self.stopped = True


class StandInError(RuntimeError):
    pass


class StandIn(ScheduledEngine):
    """Pads every step to a multiple of 4 and reports it; `lie` makes it report another size."""

    engine_name = "the stand-in"
    own_errors = (StandInError,)

    def __init__(self, lie=0, fail=None):
        self.requests, self.observer = Book(9, 16, 256, 128, 4, 64), Observer()
        self.label, self.steps, self.last, self.lie, self.fail = "stand-in #1", 0, None, lie, fail

    def forward(self, planned, prepared):
        if self.fail:
            raise self.fail
        num_real_tokens = sum(q.num_new for q in planned)
        return torch.zeros(num_real_tokens, 8), -(-num_real_tokens // 4) * 4 + self.lie

    def check_step(self, record, planned, prepared, ran):
        padded = ran[1]
        if padded % 4:
            raise StandInError(f"the stand-in ran at {padded} tokens, not a multiple of 4")
        return padded


def test_a_step_is_planned_run_checked_and_committed():
    engine = StandIn()
    out = engine.step([Request(1, (3, 4, 5), 0)])
    assert (out.runtime_mode, out.num_real_tokens, out.num_padded_tokens) == ("FULL", 3, 4)
    assert engine.requests.live[1].tokens == [3, 4, 5] and engine.steps == 1 and engine.last is engine.observer.record


def test_a_step_the_engine_misreports_fails_and_is_not_the_last_record():
    engine = StandIn(lie=1)
    with pytest.raises(StandInError, match="not a multiple of 4"):
        engine.step([Request(1, (3,), 0)])
    assert engine.last is None


def test_an_engine_failure_names_the_engine_and_the_step_and_stops_the_observer():
    engine = StandIn(fail=IndexError("row 9"))
    with pytest.raises(RuntimeError, match=r"the stand-in failed on a step of 1 requests \(2 tokens\): IndexError"):
        engine.step([Request(1, (3, 4), 0)])
    assert engine.observer.stopped and engine.steps == 0 and 1 in engine.requests.live
    with pytest.raises(StandInError):  # the engine's own errors pass unwrapped
        StandIn(fail=StandInError("mine")).step([Request(1, (3,), 0)])


def test_a_padding_fill_it_cannot_write_is_refused():
    with pytest.raises(ValueError, match="not 'nan'"):
        StandIn().step([Request(1, (3,), 0)], padding_fill="nan")


def test_collected_warnings_keep_each_warning_naming_the_word_once_and_only_while_active():
    import logging

    from harness.kit.events import collected_warnings

    engine_log = logging.getLogger("kit_test_engine")
    with collected_warnings("kit_test_engine", "cudagraph") as messages:
        engine_log.warning("CUDAGraph mode FULL is not supported; using PIECEWISE")
        engine_log.warning("CUDAGraph mode FULL is not supported; using PIECEWISE")
        engine_log.warning("the tokenizer is slow")
        engine_log.info("cudagraph capture took 2 s")  # below WARNING
    engine_log.warning("cudagraph after the block")
    assert messages == ["CUDAGraph mode FULL is not supported; using PIECEWISE"]


def test_collected_warnings_hear_an_engine_logger_set_above_warning_and_leave_its_level_as_it_was():
    """VLLM_LOGGING_LEVEL=ERROR sets vLLM's logger above WARNING: its downgrade warnings must still be heard."""
    import logging

    from harness.kit.events import collected_warnings

    engine_log = logging.getLogger("kit_test_quiet_engine")
    engine_log.setLevel(logging.ERROR)
    with collected_warnings("kit_test_quiet_engine", "cudagraph") as messages:
        engine_log.warning("cudagraph mode FULL overridden to PIECEWISE")
    assert messages == ["cudagraph mode FULL overridden to PIECEWISE"]
    assert engine_log.level == logging.ERROR
