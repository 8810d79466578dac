"""The reference engine with a real scheduler's seat limit: a step that would leave more requests
live (stepped and not released) than `max_num_seqs` is refused with ValueError, as the engine kit's
BlockBook refuses it for vLLM and LMDeploy. Every suite must run within the seats it is given:
a suite that keeps more requests live passes the reference runtime and fails a real engine."""
from __future__ import annotations

from reference_runtime.adapter import ReferenceRuntime


class SeatedEngine:
    def __init__(self, engine, max_seqs: int):
        self._engine, self._max_seqs, self._live = engine, max_seqs, set()

    def step(self, requests, *args, **kwargs):
        live = self._live | {r.request_id for r in requests}
        if len(live) > self._max_seqs:
            raise ValueError(f"{len(live)} requests would be live; max_num_seqs is {self._max_seqs} "
                             "(release finished requests first)")
        result = self._engine.step(requests, *args, **kwargs)
        self._live = live
        return result

    def release(self, request_id: int) -> None:
        self._live.discard(request_id)
        self._engine.release(request_id)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class SeatedRuntime(ReferenceRuntime):
    name = "seated"

    def build(self, config):
        return SeatedEngine(super().build(config), config.policy.max_num_seqs)
