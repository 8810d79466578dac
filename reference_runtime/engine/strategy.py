"""The run strategy: how a planned step is staged and run, and what the capture phase records.

`CapturedGraphs` is vLLM's way and the default: graphs captured up front (`capture`), then each
step stages its plan and runs it eagerly (NONE), as PIECEWISE pieces with attention eager between
them, or as one FULL graph's replay, and returns the real rows as a `StepResult`. A strategy is
built with the runner and reads the runner's parts (`model`, `stager`, `backends`, `graphs`,
`planner`, `dispatcher`); another strategy (plugins/torch-compile) or a wrapper around this one
(`seams.Wrapped`) replaces how steps run without touching the plan or the staging.
"""
from __future__ import annotations

import time

import torch

from harness.protocol import CaptureReport, Descriptor, StepResult

from ..policy import CUDAGraphMode
from .plan import FULL, PIECEWISE, StepPlan


def piece_key(key) -> int | tuple[int, int]:
    """Where a PIECEWISE key's pieces are kept: by padded size, and by adapter count where it has
    adapters (a size's pieces with the LoRA op are other graphs than those without)."""
    return key.num_padded_tokens if not key.num_active_loras else (key.num_padded_tokens, key.num_active_loras)


class CapturedGraphs:
    """Capture every key of the dispatcher up front; replay the one a plan names."""

    def __init__(self, runner):
        self.runner = runner
        self.full_graphs: dict = {}  # BatchDescriptor -> graph
        self.piece_graphs: dict[int, list] = {}  # padded size -> its pieces' graphs

    # -- a step -----------------------------------------------------------------------------
    def run(self, plan: StepPlan, eager: bool = False) -> StepResult:
        """Stage the plan and run it; `eager`: a reference step (its plan's mode is NONE already)."""
        stager = self.runner.stager
        if plan.mode is FULL:
            stager.stage(plan)  # the graph's first nodes copy it in
        else:
            stager.transfer(stager.stage(plan))
        return self._output(plan, self._logits(plan))

    def _logits(self, plan: StepPlan) -> torch.Tensor:
        if plan.mode is FULL:
            graph = self.full_graphs[plan.key]
            graph.replay(self.runner.graph_inputs)  # built only when the addresses are checked
            return graph.output
        if plan.mode is PIECEWISE:
            return self._replay_pieces(plan)
        return self.forward(self.runner.stager.metadata(plan), plan.num_active_loras)

    @staticmethod
    def _output(plan: StepPlan, logits: torch.Tensor) -> StepResult:
        """The real rows, copied: a graph's output buffer is overwritten by its next replay."""
        num_real_tokens, key = plan.num_real_tokens, plan.key
        ran = None if key is None else Descriptor(key.num_padded_tokens, key.num_padded_rows, key.uniform, key.has_lora,
                                                  key.num_active_loras)
        return StepResult(logits[:num_real_tokens].clone(), plan.mode.name, num_real_tokens, plan.num_padded_tokens, ran)

    # The eager paths build no autograd state. A FULL replay runs no torch op on the host, so a
    # step does not enter the mode itself (a few microseconds of a step at batch 1).
    @torch.inference_mode()
    def forward(self, meta, num_active_loras: int = 0) -> torch.Tensor:
        """The eager forward over the static buffers at the metadata's padded size, with the LoRA op
        where the step has adapters."""
        runner, num_padded_tokens = self.runner, meta.num_padded_tokens
        stager, lora = runner.stager, runner.lora(num_active_loras)
        return runner.model.forward(stager.input_ids[:num_padded_tokens], stager.positions[:num_padded_tokens],
                                    runner.attention(meta), **({} if lora is None else {"lora": lora}))

    @torch.inference_mode()
    def _replay_pieces(self, plan: StepPlan) -> torch.Tensor:
        """Replay each piece; attention runs eagerly in between, into the static attention buffer."""
        runner, num_padded_tokens = self.runner, plan.num_padded_tokens
        graphs, meta = self.piece_graphs[piece_key(plan.key)], runner.stager.metadata(plan)
        inputs = lambda: runner.graph_inputs(with_attention=True)  # noqa: E731 - built only when checked, as FULL's
        graphs[0].replay(inputs)
        for layer, graph in enumerate(graphs[1:]):
            _, q, k, v = graphs[layer].output
            runner.attn_buffer[:num_padded_tokens].copy_(runner.backends[layer](layer, q, k, v, meta))
            graph.replay(inputs)
        return graphs[-1].output

    # -- capture ----------------------------------------------------------------------------
    def capture(self) -> CaptureReport:
        """Every key of the dispatcher, PIECEWISE before FULL, largest first, in one capture phase."""
        runner, order = self.runner, []
        start = time.perf_counter()
        with runner.capture_phase():
            for mode, keys in runner.dispatcher.capture_keys():
                for key in keys:
                    self.record(mode, key, self.capture_key(mode, key, runner.graphs))
                    order.append((mode.name, key.num_padded_tokens))
        runner.graphs.close_capture_phase()
        seconds = time.perf_counter() - start
        counts = {"FULL": len(self.full_graphs), "PIECEWISE": sum(len(g) for g in self.piece_graphs.values())}
        # What the graphs' pools hold. Not free device memory before minus after (vLLM's figure):
        # the driver can hand back a block it kept, and free memory then does not move.
        return CaptureReport(counts, seconds, runner.graphs.pool_stats()["bytes"], tuple(order))

    def record(self, mode: CUDAGraphMode, key, graphs: list) -> None:
        """Keep one key's graphs for the steps that replay it."""
        if mode is PIECEWISE:
            self.piece_graphs[piece_key(key)] = graphs
        else:
            self.full_graphs[key] = graphs[0]

    def capture_key(self, mode: CUDAGraphMode, key, graphs) -> list:
        """The graphs of one key, captured with `graphs` after an eager warm-up on a batch of
        padding rows: the pieces of a PIECEWISE size, or one FULL graph."""
        runner = self.runner
        plan = runner.planner.dummy(mode, key)
        runner.stager.transfer(runner.stager.stage(plan))
        meta = runner.stager.metadata(plan)
        self.forward(meta, key.num_active_loras)  # warm-up
        if mode is PIECEWISE:
            return self._capture_pieces(plan, graphs)
        return [self._capture_full(plan, meta, graphs)]

    def _capture_pieces(self, plan: StepPlan, graphs) -> list:
        runner, num_padded_tokens = self.runner, plan.num_padded_tokens
        pieces, stager = runner.model, runner.stager
        ids, pos = stager.input_ids[:num_padded_tokens], stager.positions[:num_padded_tokens]
        attn = runner.attn_buffer[:num_padded_tokens]
        inputs = runner.graph_inputs(with_attention=True)
        lora = runner.lora(plan.key.num_active_loras)
        adapters = {} if lora is None else {"lora": lora}  # a model without LoRA need not take it
        name = f"PIECEWISE n={num_padded_tokens} piece" + (f" loras={plan.key.num_active_loras}" if lora else "")
        captured = [graphs.capture(lambda: pieces.first_piece(ids, pos, **adapters), static_inputs=inputs,
                                   name=f"{name} 0")]
        for index in range(1, pieces.num_layers):
            hidden = captured[-1].output[0]
            captured.append(graphs.capture(lambda i=index, h=hidden: pieces.middle_piece(i, h, attn, pos, **adapters),
                                           static_inputs=inputs, name=f"{name} {index}"))
        hidden = captured[-1].output[0]
        captured.append(graphs.capture(lambda: pieces.last_piece(hidden, attn), static_inputs=inputs,
                                       name=f"{name} {pieces.num_layers}"))
        return captured

    def _capture_full(self, plan: StepPlan, meta, graphs):
        stager = self.runner.stager
        staged = stager.stage(plan)

        def step():  # the graph copies its inputs in itself (buffers.py)
            stager.transfer(staged)
            return self.forward(meta, plan.key.num_active_loras)
        return graphs.capture(step, static_inputs=self.runner.graph_inputs(), name=f"FULL {plan.key}")
