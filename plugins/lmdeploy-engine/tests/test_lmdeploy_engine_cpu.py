"""The lmdeploy-engine runtime's own logic, on any machine (no LMDeploy, no GPU): its scheduler
state (requests.py), the observer that reads what LMDeploy's graph runner ran (observer.py, on a
stand-in runner that calls its methods as CUDAGraphRunner.__call__ does), the slots read from
LMDeploy's buffers (seen.py), the checks that fail a step loudly (engine.py), the random streams
and environment kept around calls (settings.py), the model folder (model_dir.py), and the
runtime's refusal to start without a GPU. What only a GPU with LMDeploy can show is in
test_lmdeploy_engine_gpu.py."""
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from harness.protocol import Request  # noqa: E402

from cudagraph_lmdeploy_engine import settings  # noqa: E402
from cudagraph_lmdeploy_engine.engine import EngineError, LmdeployEngine  # noqa: E402
from cudagraph_lmdeploy_engine.observer import EagerShapeError, GraphRunnerObserver, StepRecord  # noqa: E402
from cudagraph_lmdeploy_engine.requests import PADDING_SLOT, Requests, is_decoding  # noqa: E402
from cudagraph_lmdeploy_engine.seen import Seen, from_graph  # noqa: E402

BLOCK = 16


def make_requests(num_blocks=9, max_seqs=4, max_tokens=64):
    return Requests(num_blocks, BLOCK, vocab=256, max_len=128, max_seqs=max_seqs, max_tokens=max_tokens)


# -- the scheduler state ----------------------------------------------------------------------
def test_blocks_cover_the_tokens_and_lmdeploys_reserved_block_is_never_handed_out():
    state = make_requests()
    planned = state.plan([Request(1, tuple(range(1, 18)), 0), Request(2, (5,), 0)])
    assert [len(q.blocks) for q in planned] == [2, 1]  # 17 tokens need two blocks of 16
    assert 0 not in {b for q in planned for b in q.blocks} and len({b for q in planned for b in q.blocks}) == 3


def test_slots_leave_the_reserved_block_out_and_a_step_rewinds_to_its_context():
    state = make_requests()
    state.commit(state.plan([Request(1, tuple(range(1, 20)), 0)]))
    blocks = state.live[1].blocks
    assert state.slot(1, 0) == (blocks[0] - 1) * BLOCK and state.slot(1, 17) == (blocks[1] - 1) * BLOCK + 1
    rerun = state.plan([Request(1, (7,), 3)])[0]  # position 3 again: an eager step after a graph step
    assert (rerun.context_len, rerun.new_tokens, rerun.blocks) == (3, (7,), tuple(blocks))
    state.commit([rerun])
    assert state.live[1].tokens == [1, 2, 3, 7]
    with pytest.raises(ValueError, match="positions"):
        state.slot(1, 48)


def test_release_frees_blocks():
    state = make_requests()
    state.commit(state.plan([Request(1, tuple(range(1, 33)), 0)]))
    free = len(state.free)
    state.release(1)
    assert len(state.free) == free + 2
    with pytest.raises(ValueError, match="not live"):
        state.slot(1, 0)


# Refused steps and a full KV cache: the block book's own tests (tests/test_kit_block_book.py).


def test_a_step_is_decoding_when_every_request_brings_one_token():
    state = make_requests()
    assert is_decoding(state.plan([Request(1, (3,), 0), Request(2, (4,), 0)]))
    assert not is_decoding(state.plan([Request(1, (3,), 0), Request(2, (4, 5), 0)]))


# -- the observer, on a stand-in of LMDeploy's CUDAGraphRunner --------------------------------
def buffers(capacity, blocks=4):
    return {"input_ids": torch.full((1, capacity), 99), "position_ids": torch.full((1, capacity), 77),
            "qkv_lens": torch.zeros(3, capacity, dtype=torch.int32),
            "block_offsets": torch.zeros(capacity, blocks, dtype=torch.int32)}


def fill(graph_meta, input_ids, position_ids, attn_metadata, **kwargs):
    """CudaGraphMixin.fill_buffers_cudagraph's effect: real rows copied, padded rows q_len 1,
    kv_len 1, block 0 (fill_graph_common_inputs); padded ids drawn at random (LMDeploy's random_)."""
    b, n = graph_meta.input_buffers, input_ids.size(-1)
    b["input_ids"][0].random_(0, 256)
    b["input_ids"][0, :n], b["position_ids"][0, :n] = input_ids[0], position_ids[0]
    b["qkv_lens"][1].fill_(1)
    b["qkv_lens"][2].fill_(1)
    b["qkv_lens"][1, :n], b["qkv_lens"][2, :n] = attn_metadata.q_seqlens, attn_metadata.kv_seqlens
    b["block_offsets"].zero_()
    b["block_offsets"][:n, :attn_metadata.block_offsets.size(1)] = attn_metadata.block_offsets
    return kwargs


class Graph:
    """CUDASingleGraphRunner: its meta and buffers, filled by the model before every replay."""

    def __init__(self, model, capacity):
        self.model, self.meta = model, SimpleNamespace(max_tokens=capacity, max_batchs=capacity, input_buffers=buffers(capacity))

    def forward(self, **kwargs):
        self.model.fill_buffers_cudagraph(self.meta, **kwargs)
        return "replayed"


class StandInRunner:
    """The methods the observer wraps, called in CUDAGraphRunner.__call__'s order."""

    def __init__(self, sizes=(1, 2, 4, 8)):
        self.sizes, self._full_graph_runners = sizes, {}
        self.model = SimpleNamespace(fill_buffers_cudagraph=fill)

    def _should_use_full_graph(self, step_context, model_inputs):
        return step_context.global_is_decoding()

    def get_graph_key(self, input_ids, **kwargs):
        return (min(s for s in self.sizes if s >= input_ids.size(-1)), True, False, 1)

    def _capture_full_graph(self, graph_key, kwargs):
        self._full_graph_runners[graph_key] = graph = Graph(self.model, graph_key[0])
        graph.model.fill_buffers_cudagraph(graph.meta, **kwargs)
        return "captured"

    def _forward_eager(self, **kwargs):
        return "eager"

    def __call__(self, decoding, **kwargs):
        if self._should_use_full_graph(SimpleNamespace(global_is_decoding=lambda: decoding), kwargs):
            key = self.get_graph_key(**kwargs)
            graph = self._full_graph_runners.get(key)
            return graph.forward(**kwargs) if graph else self._capture_full_graph(key, kwargs)
        return self._forward_eager(**kwargs)


def forward_kwargs(contexts, blocks):
    """A decode step's forward arguments: one token a request at the end of its context."""
    n = len(contexts)
    meta = SimpleNamespace(q_seqlens=torch.ones(n, dtype=torch.int32), kv_seqlens=torch.tensor(contexts) + 1,
                           block_offsets=torch.tensor(blocks, dtype=torch.int32))
    return dict(input_ids=torch.arange(1, n + 1)[None], position_ids=torch.tensor(contexts)[None], attn_metadata=meta)


def observed(**kw):
    runner, eager_sizes = StandInRunner(), []

    def eager_runner(size):
        eager_sizes.append(size)
        return lambda **kwargs: "eager at a padded size"
    return runner, GraphRunnerObserver(runner, eager_runner, vocab_size=256, max_model_len=128), eager_sizes


def captured(observer, runner):
    observer.capturing = True
    for size in (8, 4, 2, 1):  # LMDeploy's warm-up: every size, largest first
        runner(True, **forward_kwargs([0] * size, [[0]] * size))
    observer.capturing, observer.graphs_allowed = False, True


def test_before_capture_a_decode_step_runs_eager_and_the_decline_is_recorded():
    runner, observer, _ = observed()
    record = observer.start()
    assert runner(True, **forward_kwargs([3, 5, 2], [[1], [2], [3]])) == "eager"
    assert (record.path, record.padded, record.offered, record.declined) == ("NONE", 3, True, "before capture()")
    assert not runner._full_graph_runners and observer.capture_order == []


def test_after_capture_a_decode_step_replays_the_padded_graph_and_its_inputs_are_staged():
    runner, observer, _ = observed()
    captured(observer, runner)
    assert observer.capture_order == [(8, True, False, 1), (4, True, False, 1), (2, True, False, 1), (1, True, False, 1)]
    record = observer.start()
    assert runner(True, **forward_kwargs([3, 5, 2], [[1], [2], [3]])) == "replayed"
    assert (record.path, record.padded, record.key, record.replayed_key) == ("FULL", 4, (4, True, False, 1),
                                                                              (4, True, False, 1))
    seen = from_graph(record.graph_inputs[0], BLOCK)
    assert seen.token_ids[:3].tolist() == [1, 2, 3] and seen.positions[:3].tolist() == [3, 5, 2]
    assert seen.slot_mapping() == [3, 16 + 5, 32 + 2, PADDING_SLOT]  # the padded row writes LMDeploy's sink
    cut = from_graph(record.graph_inputs[0], BLOCK, cut=True)  # the step check's read: only the block columns kv reaches
    assert cut.slot_mapping() == seen.slot_mapping() and len(cut.block_offsets[0]) == 1 < len(seen.block_offsets[0])
    rows = seen.request_rows()  # numbered as slot_of(): LMDeploy's blocks less the reserved one
    assert rows["seq_lens"].tolist() == [4, 6, 3, 1] and rows["padding_block"] == -1
    assert rows["block_tables"][:, 0].tolist() == [0, 1, 2, -1] and "query_start_loc" in rows["not_exposed"]
    assert observer.captures_in_service == 0


def test_a_capture_while_serving_is_counted():
    runner, observer, _ = observed()
    observer.graphs_allowed = True  # graphs allowed, none captured: the first decode step captures lazily
    record = observer.start()
    assert runner(True, **forward_kwargs([3], [[1]])) == "captured"
    assert (record.path, record.captured, observer.captures_in_service) == ("NONE", [(1, True, False, 1)], 1)


def test_an_eager_reference_runs_lmdeploys_eager_runner_at_the_padded_size():
    runner, observer, eager_sizes = observed()
    captured(observer, runner)
    record = observer.start(eager_size=4)
    assert runner(True, **forward_kwargs([3, 5, 2], [[1], [2], [3]])) == "eager at a padded size"
    assert (record.path, record.padded, record.declined, eager_sizes) == ("NONE", 4, "eager_step", [4])
    record = observer.start(eager_size=3)  # at the unpadded size: LMDeploy's own eager forward
    assert runner(True, **forward_kwargs([3, 5, 2], [[1], [2], [3]])) == "eager" and record.padded == 3
    observer.start(eager_size=8)
    with pytest.raises(EagerShapeError, match="pads only decode steps"):
        runner(False, **forward_kwargs([3, 5, 2], [[1], [2], [3]]))


@pytest.mark.parametrize("fill_kind", ["zeros", "random"])
def test_a_fill_reaches_the_padded_rows_only(fill_kind):
    runner, observer, _ = observed()
    captured(observer, runner)
    record = observer.start(fill=fill_kind)
    runner(True, **forward_kwargs([3, 5, 2, 9, 4], [[1], [2], [3], [4], [5]]))
    seen = from_graph(record.graph_inputs[0], BLOCK)
    assert seen.token_ids[:5].tolist() == [1, 2, 3, 4, 5] and seen.positions[:5].tolist() == [3, 5, 2, 9, 4]
    padded_positions = seen.positions[5:].tolist()
    if fill_kind == "zeros":
        assert seen.token_ids[5:].tolist() == [0, 0, 0] and padded_positions == [0, 0, 0]
    else:
        assert padded_positions != [77, 77, 77] and all(0 <= p < 128 for p in padded_positions)


# -- the checks that fail a step loudly ---------------------------------------------------------
def checked_engine():
    engine = LmdeployEngine.__new__(LmdeployEngine)
    engine.requests, engine.block_size, engine.label = make_requests(), BLOCK, "engine #0"
    return engine


def step_record(engine, slots_from=None, path="FULL", key=(4, True, False, 1), replayed=(4, True, False, 1),
                decoding=True, offered=True):
    planned = engine.requests.plan([Request(1, (1,), 0), Request(2, (4,), 0), Request(3, (6,), 0)])
    blocks = [list(q.blocks) for q in planned] + [[0]]
    kv_len = [1, 1, 1, 1]
    seen = Seen(torch.zeros(4), torch.zeros(4), [1, 1, 1, 1], kv_len, slots_from or blocks, BLOCK)
    record = StepRecord(decoding=decoding, offered=offered, key=key, path=path, replayed_key=replayed,
                        padded=4 if path == "FULL" else 3)
    record.graph_inputs = "stand-in"
    return record, planned, seen


@pytest.mark.parametrize("broken", [None, "wrong-slots", "other-key", "prefill-seen-as-decoding", "graph-not-taken"])
def test_a_step_that_is_not_what_lmdeploy_ran_fails_loudly(monkeypatch, broken):
    engine = checked_engine()
    record, planned, seen = step_record(engine)
    if broken == "wrong-slots":
        record, planned, seen = step_record(checked_engine(), slots_from=[[5], [6], [7], [0]])
    elif broken == "other-key":
        record.replayed_key = (8, True, False, 1)
    elif broken == "prefill-seen-as-decoding":
        record.decoding = False
    elif broken == "graph-not-taken":
        record.path = "NONE"
    monkeypatch.setattr("cudagraph_lmdeploy_engine.engine.from_record", lambda record, block_size, cut=False: seen)
    if broken is None:
        engine._check(record, planned, True)
        return
    with pytest.raises(EngineError, match={"wrong-slots": "block bookkeeping", "other-key": "replayed the graph",
                                           "prefill-seen-as-decoding": "saw a prefill step",
                                           "graph-not-taken": "took the eager path"}[broken]):
        engine._check(record, planned, True)


# -- what stays as it was around a call into LMDeploy ------------------------------------------
def test_lmdeploys_draws_go_on_as_one_stream_and_the_callers_generator_and_environment_are_restored(monkeypatch):
    monkeypatch.setenv("CUDAGRAPH_TEST_KEPT", "1")
    rng, before = settings.EngineRandom(seed=5, device=None), torch.get_rng_state()
    with settings.process_state_restored(rng):
        first = torch.rand(3)
        os.environ["CUDAGRAPH_TEST_KEPT"] = "2"
        os.environ["CUDAGRAPH_TEST_ADDED"] = "x"
    with settings.process_state_restored(rng):
        second = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert os.environ["CUDAGRAPH_TEST_KEPT"] == "1" and "CUDAGRAPH_TEST_ADDED" not in os.environ
    stream = torch.Generator().manual_seed(5)
    assert torch.equal(torch.cat([first, second]), torch.rand(6, generator=stream))


def test_the_model_folder_links_the_checkpoint_and_has_a_tokenizer_over_its_vocabulary(tmp_path):
    from harness.expectations import presets
    from transformers import AutoTokenizer

    from cudagraph_lmdeploy_engine.model_dir import model_dir

    checkpoint = presets.checkpoint("tiny")
    folder = model_dir(checkpoint, root=tmp_path)
    assert (folder / "config.json").resolve() == (checkpoint / "config.json").resolve()
    assert model_dir(checkpoint, root=tmp_path) == folder  # written once
    assert len(AutoTokenizer.from_pretrained(folder)) == presets.preset("tiny").vocab
    with pytest.raises(ValueError, match="no config.json"):
        model_dir(tmp_path / "nothing", root=tmp_path)


def test_a_checkpoint_of_heads_narrower_than_lmdeploys_kernels_take_is_refused_as_one_verdict(tmp_path):
    import json

    from harness import protocol as p
    from harness.expectations import presets

    from cudagraph_lmdeploy_engine.model_dir import MIN_HEAD_DIM, head_dim
    from cudagraph_lmdeploy_engine.runtime import LmdeployEngineRuntime

    runtime = object.__new__(LmdeployEngineRuntime)  # its constructor needs a GPU and LMDeploy
    checkpoint = presets.checkpoint("tiny")
    assert head_dim(checkpoint) == presets.preset("tiny").head_dim < MIN_HEAD_DIM
    config = p.EngineConfig(preset="tiny", checkpoint=str(checkpoint), device="cpu", graph_backend="emulated")
    with pytest.raises(p.UnsupportedCheckpoint, match=f"8 wide: .* needs them {MIN_HEAD_DIM} wide or more"):
        runtime.build(config)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 512, "num_attention_heads": 8}))
    assert head_dim(tmp_path) == 64
    with pytest.raises(Exception) as raised:  # past the checkpoint: refused for this machine's device instead
        runtime.build(p.EngineConfig(preset="small", checkpoint=str(tmp_path), device="cpu", graph_backend="emulated"))
    assert not isinstance(raised.value, p.UnsupportedCheckpoint)


# -- without a GPU -------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_the_runtime_says_why_it_cannot_start(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("--runtime", "lmdeploy-engine", "-p", "no:xdist", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot start here*CUDA GPU*torch sees none*"])
    assert "Traceback" not in result.stderr.str()  # a refusal, not a bug: the reason alone


def test_an_eager_step_is_padded_only_where_lmdeploy_pads_and_within_its_token_limit():
    engine = LmdeployEngine.__new__(LmdeployEngine)
    engine.requests = SimpleNamespace(max_tokens=8, TOKEN_LIMIT="max_num_batched_tokens")
    with pytest.raises(ValueError, match="LMDeploy pads only a decode step"):
        engine.eager_step([Request(1, (5, 6, 7), 0)], 4)  # a prefill padded
    with pytest.raises(ValueError, match="static buffers of max_num_batched_tokens=8"):
        engine.eager_step([Request(1, (5,), 3), Request(2, (6,), 3)], 16)  # a decode step past the limit
