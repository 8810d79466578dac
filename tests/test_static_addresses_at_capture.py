"""Static buffers at capture: an engine may allocate a graph's inputs when it captures that graph
(LMDeploy's CUDASingleGraphRunner does, one set per batch size), so capture may add buffers; it
may never move one that existed before it. Two variants of the minimal example engine, each
changing one thing, run test_addresses_survive_capture_replays_and_steps."""
import pytest
import torch

from examples.minimal_runtime import MinimalEngine, MinimalRuntime

from .catching import failure_text, run_suites

TEST = "test_static_addresses.py::test_addresses_survive_capture_replays_and_steps"


class _MovesAnInput(MinimalEngine):
    def capture(self):
        self.token_ids = self.token_ids.clone()  # a new tensor: the graphs are captured reading another address
        return super().capture()


class _AddsGraphInputs(MinimalEngine):
    def capture(self):
        report = super().capture()
        self.graph_inputs = {size: torch.zeros(size, device=self.device) for size in self.graphs}
        return report

    def static_buffer_addresses(self):
        own = {f"graph{size}.scratch": t.data_ptr() for size, t in getattr(self, "graph_inputs", {}).items()}
        return {**super().static_buffer_addresses(), **own}


class CaptureMovesAnInput(MinimalRuntime):
    name = "capture-moves-an-input"

    def build(self, config):
        return _MovesAnInput(self, config)


class CaptureAddsGraphInputs(MinimalRuntime):
    name = "capture-adds-graph-inputs"

    def build(self, config):
        return _AddsGraphInputs(self, config)


@pytest.mark.parametrize("variant,caught", [("CaptureMovesAnInput", True), ("CaptureAddsGraphInputs", False)])
def test_capture_may_add_static_buffers_but_never_move_one(pytester, variant, caught):
    report = run_suites(pytester, f"tests.test_static_addresses_at_capture:{variant}", [TEST])
    outcomes = [t["outcome"] for t in report["tests"]]
    assert outcomes == (["failed"] if caught else ["passed"]), outcomes
    if caught:
        assert "capture moved (or dropped) a static buffer" in failure_text(report)
