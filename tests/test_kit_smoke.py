"""The shared generation scenario (harness/scenarios/generation.py) on a stand-in engine, and the
one smoke driver (`python -m harness.smoke`) on the reference runtime with the CPU graph emulator."""
from types import SimpleNamespace

import pytest

from harness import smoke
from harness.protocol import Request
from harness.scenarios.batches import prompt, token
from harness.scenarios.generation import generation, numbered


class Recorder:
    def __init__(self):
        self.steps, self.released = [], []

    def step(self, requests):
        self.steps.append(list(requests))
        return SimpleNamespace(num_real_tokens=sum(len(r.token_ids) for r in requests))

    def release(self, request_id):
        self.released.append(request_id)


def test_requests_join_decode_and_leave_the_longest_running_first():
    engine = Recorder()
    joins = numbered({0: [3, 2], 2: [4]}, first_id=100)
    list(generation(engine, None, joins, leaves={1: 1}, steps=4))
    assert [[r.request_id for r in step] for step in engine.steps] == [[100, 101], [100, 101], [101, 120], [101, 120]]
    assert engine.steps[0][0] == Request(100, prompt(100, 3), 0)
    assert engine.steps[1][0] == Request(100, (token(100, 3),), 3)  # no anchor: the scenario's own next token
    assert engine.released == [100, 101, 120]


def test_with_an_anchor_each_request_continues_with_its_greedy_token_and_q_minus_1_drafts():
    import torch

    class Anchor:
        def step(self, requests, history):
            rows = sum(len(r.token_ids) for r in requests)
            logits = torch.zeros(rows, 50)
            logits[:, 42] = 1.0
            return logits

    engine = Recorder()
    list(generation(engine, Anchor(), {0: [(7, 3)]}, steps=2, q=2))
    assert engine.steps[1] == [Request(7, (42, 1 + (42 + 1) % 200), 3)]


def test_the_smoke_driver_builds_through_the_suites_factory_and_runs_the_scenario(capsys):
    assert smoke.main(["--runtime", "reference", "--graph-backend", "emulated", "--presets", "tiny",
                       "--modes", "NONE,FULL"]) == 0
    out = capsys.readouterr().out
    assert "preset=tiny mode=FULL summary: ran ['NONE@19', 'FULL@4'" in out and "failed: none" in out
    assert out.count("eager at the same shape: bit-equal") == 2 * smoke.STEPS


def test_an_unknown_runtime_is_one_line_and_exit_status_2(capsys):
    assert smoke.main(["--runtime", "no-such-runtime"]) == 2
    assert capsys.readouterr().err.startswith("harness.smoke: unknown runtime 'no-such-runtime'")


def test_a_step_that_fails_is_reported_and_the_exit_status_is_1(capsys, monkeypatch):
    def broken_generation(*args, **kwargs):
        raise RuntimeError("the stand-in engine stopped")
        yield

    monkeypatch.setattr(smoke, "generation", broken_generation)
    assert smoke.main(["--runtime", "reference", "--graph-backend", "emulated", "--presets", "tiny",
                       "--modes", "NONE"]) == 1
    assert "mode=NONE FAILED: RuntimeError: the stand-in engine stopped" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["cudagraph_vllm_engine.smoke", "cudagraph_lmdeploy_engine.smoke"])
def test_each_real_engine_plugins_smoke_is_the_kits_driver_with_the_suites_configs(module):
    """A plugin's smoke module is its defaults for the kit's driver; the config an engine is built with
    has one home, harness.smoke.engine_config (the suites' factory), not a copy per plugin."""
    import importlib

    plugin = importlib.import_module(module)
    assert callable(plugin.main) and not hasattr(plugin, "engine_config")


def test_a_plugins_smoke_is_the_driver_with_its_runtime_defaults_options_and_stages(capsys):
    seen = []

    def before(runtime, log, args):
        seen.append(("before", runtime.name, args.k))
        log("policy", "policy: asked before the modes")

    def after(runtime, log, args):
        seen.append(("after", args.k))
        return smoke.stage(log, "own stage", lambda: 1 / 0)

    status = smoke.main(["--graph-backend", "emulated", "--k", "3"], runtime="reference", modes=("NONE",),
                        presets=("tiny",), arguments=lambda parser: parser.add_argument("--k", type=int, default=2),
                        before=before, after=after, steps=2)
    out = capsys.readouterr().out
    assert status == 1 and seen == [("before", "reference", 3), ("after", 3)]
    assert "SMOKE policy: asked before the modes" in out and "preset=tiny mode=NONE summary: ran ['NONE@19', 'NONE@3']" in out
    assert "SMOKE own stage FAILED" in out and "ZeroDivisionError" in out and "failed: ['own stage']" in out


@pytest.mark.parametrize("module, option", [("cudagraph_vllm_engine.smoke", "--modes"),
                                            ("cudagraph_vllm_engine_v1.smoke", "--k"),
                                            ("cudagraph_lmdeploy_engine.smoke", "--presets")])
def test_each_plugins_smoke_module_sets_its_environment_then_runs_the_one_driver(module, option, monkeypatch, capsys):
    import importlib

    plugin = importlib.import_module(module)
    applied = []
    monkeypatch.setattr(plugin.settings, "apply_environment", lambda: applied.append(True))
    with pytest.raises(SystemExit) as exit_:
        plugin.main(["--help"])
    assert exit_.value.code == 0 and applied == [True] and option in capsys.readouterr().out


def test_greedy_drafts_are_the_anchors_argmax_continuation():
    import torch

    class Anchor:  # the next token is always the last one plus one
        def step(self, requests, history):
            (request,) = requests
            logits = torch.zeros(len(request.token_ids), 50)
            logits[-1, request.token_ids[-1] + 1] = 1.0
            return logits

    assert smoke.greedy_drafts(Anchor(), [3, 7], 3) == [8, 9, 10]


def test_verify_steps_run_accepted_and_rejected_drafts_against_transformers(capsys):
    from dataclasses import replace

    from harness.expectations import presets
    from harness.expectations.anchor import Anchor
    from harness.runtime.registry import resolve

    runtime = resolve("bucket_engine.runtime:BucketRuntime")
    base = smoke.engine_config(runtime, "FULL", "tiny", "emulated")
    config = replace(base, policy=replace(base.policy, num_speculative_tokens=2))
    smoke.verify_steps(runtime, Anchor(str(presets.checkpoint("tiny")), device="cpu"), config, smoke.Log(), "verify k=2",
                       said=lambda engine: "; the engine's own word")
    lines = [line for line in capsys.readouterr().out.splitlines() if "verify step" in line]
    assert [line.split("(")[1].split(")")[0] for line in lines] == [
        "drafts transformers accepts", "drafts to reject", "drafts transformers accepts"]
    assert all("9 tokens -> ran FULL at 12 (own policy: FULL at 12)" in line and "eager bit-equal True" in line
               and line.endswith("; the engine's own word") for line in lines)
    assert all(float(line.split("transformers| max ")[1].split(";")[0]) < 1e-4 for line in lines)
