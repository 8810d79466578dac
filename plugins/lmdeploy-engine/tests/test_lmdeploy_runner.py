"""The observer on LMDeploy's own CUDAGraphRunner, where LMDeploy imports: `__call__`,
`_should_use_full_graph`, `_forward_full_graph`, `get_graph_key`, `_get_capture_tokens` and
`get_capture_batch_sizes` run as LMDeploy wrote them, so the wrappers meet its real call
signatures and the keys it really computes. Stand-ins: the model, the captured graphs and the
capture itself (their CUDA work cannot run on a CPU); the runner is made without `__init__`,
which allocates a CUDA graph pool."""
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from cudagraph_lmdeploy_engine.observer import GraphRunnerObserver  # noqa: E402


class StandInModel:
    """What CUDAGraphRunner calls on its model: the forward, its output buffers, its extra key,
    and the graph-buffer fill (CudaGraphMixin)."""

    def __call__(self, input_ids, **kwargs):
        return torch.zeros(1, input_ids.size(-1), 4)

    def make_output_buffers(self, output):
        return dict(hidden_states=output)

    def get_cudagraph_extra_key(self, **kwargs):
        return ()

    def fill_buffers_cudagraph(self, graph_meta, input_ids, **kwargs):
        return kwargs


class StandInGraph:
    def __init__(self, model, capacity):
        self.model = model
        self.meta = SimpleNamespace(max_tokens=capacity, max_batchs=capacity, input_buffers={})

    def forward(self, **kwargs):
        self.model.fill_buffers_cudagraph(self.meta, **kwargs)
        return {"hidden_states": torch.ones(1, kwargs["input_ids"].size(-1), 4)}


@pytest.fixture
def lmdeploy_runner(lmdeploy_code):
    from lmdeploy.pytorch.backends.graph_runner import GraphRunnerMeta

    runner = lmdeploy_code.CUDAGraphRunner.__new__(lmdeploy_code.CUDAGraphRunner)
    context = SimpleNamespace(decoding=True, enable_microbatch=False)
    context.global_is_decoding = lambda: context.decoding
    runner.model, runner.context = StandInModel(), context
    runner.ctx_mgr = SimpleNamespace(current_context=lambda: context)
    runner.cache_config = SimpleNamespace(cudagraph_capture_batch_sizes=None, max_batches=8)
    runner.backend_config = SimpleNamespace(eager_mode=False)
    runner._runner_meta, runner._full_graph_runners, runner._piecewise_graph_manager = GraphRunnerMeta(), {}, None
    runner.enable_graph = lambda **kwargs: True  # CudaGraphMixin.support_cuda_graph: the step is decoding

    def capture(graph_key, kwargs):  # stands in for CUDASingleGraphRunner's capture (CUDA)
        runner._full_graph_runners[graph_key] = StandInGraph(runner.model, graph_key[0])
        return {"hidden_states": torch.zeros(1, kwargs["input_ids"].size(-1), 4)}

    runner._capture_full_graph = capture
    return runner


def call(runner, tokens: int, decoding: bool):
    """One forward as LMDeploy's model_forward makes it: inside its step-context manager."""
    from lmdeploy.pytorch.model_inputs import step_ctx_manager

    runner.context.decoding = decoding
    requests = tokens if decoding else 2
    meta = SimpleNamespace(block_offsets=torch.zeros(requests, 1, dtype=torch.int32),
                           q_seqlens=torch.ones(requests, dtype=torch.long))
    with step_ctx_manager(runner.ctx_mgr):
        return runner(input_ids=torch.ones(1, tokens, dtype=torch.long), position_ids=torch.zeros(1, tokens),
                      past_key_values=[], attn_metadata=meta, inputs_embeds=None)


def test_the_observer_reads_lmdeploys_own_dispatch_keys_and_paths(lmdeploy_runner):
    eager_sizes = []
    observer = GraphRunnerObserver(lmdeploy_runner, lambda size: eager_sizes.append(size) or (lambda **kw: {}), 256, 128)
    record = observer.start()
    call(lmdeploy_runner, 3, decoding=True)  # before capture: LMDeploy offers its graph, this runtime declines
    assert (record.offered, record.declined, record.path, record.padded) == (True, "before capture()", "NONE", 3)
    observer.capturing = True
    for size in (8, 4, 2, 1):  # BaseModelAgent.warmup: every capture batch size, largest first
        call(lmdeploy_runner, size, decoding=True)
    observer.capturing, observer.graphs_allowed = False, True
    assert observer.capture_order == [(8, True, False, 1), (4, True, False, 1), (2, True, False, 1), (1, True, False, 1)]
    record = observer.start()
    call(lmdeploy_runner, 3, decoding=True)  # LMDeploy pads 3 requests to its graph of 4
    assert (record.key, record.replayed_key, record.path, record.padded) == ((4, True, False, 1),) * 2 + ("FULL", 4)
    record = observer.start()
    call(lmdeploy_runner, 5, decoding=False)  # a prefill step: eager, unpadded
    assert (record.offered, record.path, record.padded, record.key) == (False, "NONE", 5, None)
    record = observer.start(eager_size=4)
    call(lmdeploy_runner, 3, decoding=True)  # an eager reference at the graph's shape
    assert (record.declined, record.path, record.padded, eager_sizes) == ("eager_step", "NONE", 4, [4])
    assert observer.captures_in_service == 0
