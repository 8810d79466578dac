"""The vllm-engine runtime's own logic, on any machine (no vLLM, no GPU): its scheduler state
(requests.py), the observer that reads what vLLM ran (observer.py, on a stand-in model runner),
the checks that fail a step loudly (engine.py), and the runtime's refusal to start without a GPU.
What only a GPU with vLLM can show is in test_vllm_engine_gpu.py."""
import enum
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from harness.protocol import Request  # noqa: E402

from cudagraph_vllm_engine.engine import EngineError, VllmEngine  # noqa: E402
from cudagraph_vllm_engine.observer import StepObserver  # noqa: E402
from cudagraph_vllm_engine.requests import Requests  # noqa: E402


def make_requests(num_blocks=9, block_size=16, max_seqs=4, max_tokens=64):
    return Requests(num_blocks, block_size, vocab=256, max_len=128, max_seqs=max_seqs, max_tokens=max_tokens)


# -- the scheduler state ----------------------------------------------------------------------
def test_blocks_cover_the_tokens_and_block_0_is_never_handed_out():
    state = make_requests()
    planned = state.plan([Request(1, tuple(range(1, 18)), 0), Request(2, (5,), 0)])
    assert [len(p.blocks) for p in planned] == [2, 1]  # 17 tokens need two blocks of 16
    assert 0 not in {b for p in planned for b in p.blocks}
    assert len({b for p in planned for b in p.blocks}) == 3


def test_a_step_rewinds_to_its_context_and_keeps_its_blocks():
    state = make_requests()
    state.commit(state.plan([Request(1, (3, 4, 5), 0)]))
    state.commit(state.plan([Request(1, (6,), 3)]))
    rerun = state.plan([Request(1, (7,), 3)])[0]  # the same position again: an eager step after a graph step
    assert rerun.all_tokens == (3, 4, 5, 7) and rerun.context_len == 3 and rerun.num_new == 1
    assert rerun.blocks == tuple(state.live[1].blocks)


def test_slots_follow_vllms_block_table_expanded_to_kernel_blocks():
    state = make_requests()
    state.plan([Request(1, tuple(range(1, 40)), 0)])
    blocks = state.live[1].blocks
    assert state.slot(1, 0, 16) == blocks[0] * 16
    assert state.slot(1, 17, 16) == blocks[1] * 16 + 1
    # Kernel blocks of 8 inside blocks of 16: block b is kernel blocks 2b and 2b+1.
    assert state.slot(1, 9, 8) == (blocks[0] * 2 + 1) * 8 + 1
    with pytest.raises(ValueError, match="positions"):
        state.slot(1, 48, 16)


def test_release_frees_blocks_and_tells_the_runner_on_the_next_step():
    state = make_requests()
    state.commit(state.plan([Request(1, tuple(range(1, 33)), 0)]))
    free = len(state.free)
    state.release(1)
    assert len(state.free) == free + 2 and state.take_finished() == {"req-1"} and state.take_finished() == set()
    with pytest.raises(ValueError, match="not live"):
        state.slot(1, 0, 16)


# Refused steps and a full KV cache: the block book's own tests (tests/test_kit_block_book.py).


# -- the observer, on a stand-in model runner --------------------------------------------------
class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Desc:  # the fields of vLLM's BatchExecutionDescriptor
    cg_mode: Mode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    num_active_loras: int = 0


class StandInRunner:
    """The four attributes the observer wraps, and the input buffers it reads."""

    def __init__(self, desc):
        self.input_buffers = SimpleNamespace(input_ids=torch.arange(16, dtype=torch.int32),
                                             positions=torch.arange(16, dtype=torch.int64),
                                             seq_lens=torch.tensor([7, 3, 0, 0, 9], dtype=torch.int32),
                                             query_start_loc=torch.tensor([0, 1, 2, 8, 8, 8], dtype=torch.int32))
        self.slots = torch.arange(100, 116).reshape(1, 16)
        self.tables = torch.arange(20, dtype=torch.int32).reshape(5, 4)  # [rows, blocks], one KV group
        self.cudagraph_manager = SimpleNamespace(dispatch=lambda *a, **k: desc, run_fullgraph=lambda d: "full",
                                                 run_pw_graph=lambda model, inputs: "piecewise")
        self.prepare_attn = lambda batch: ((self.tables[:batch.num_reqs_after_padding],),
                                           self.slots[:, :batch.num_tokens_after_padding])

    def execute(self, real, padded, rows=4):
        """What execute_model does with the wrapped attributes, in order."""
        desc = self.cudagraph_manager.dispatch(2, real, None, num_active_loras=0)
        self.prepare_attn(SimpleNamespace(num_tokens=real, num_tokens_after_padding=padded, num_reqs_after_padding=rows))
        if desc.cg_mode is Mode.FULL:
            self.cudagraph_manager.run_fullgraph(desc)
        elif desc.cg_mode is Mode.PIECEWISE:
            self.cudagraph_manager.run_pw_graph(None, {})
        return desc


def test_the_observer_records_the_dispatch_the_path_and_the_inputs():
    runner = StandInRunner(Desc(Mode.FULL, 8, 8))
    observer = StepObserver(runner, vocab_size=256, max_model_len=128)
    record = observer.start()
    runner.execute(5, 8)
    assert (record.path, record.ran.num_tokens, record.dispatched.cg_mode) == ("FULL", 8, Mode.FULL)
    assert record.token_ids.tolist() == list(range(8)) and record.slot_mapping.tolist() == list(range(100, 108))


def test_the_observer_copies_the_request_rows_the_forward_reads():
    """input_buffers.seq_lens and query_start_loc, and the first KV group's block tables, at the
    padded request count, copied: the next step's buffers do not change them."""
    runner = StandInRunner(Desc(Mode.FULL, 8, 4))
    observer = StepObserver(runner, vocab_size=256, max_model_len=128)
    record = observer.start()
    runner.execute(2, 8, rows=4)
    assert record.seq_lens.tolist() == [7, 3, 0, 0] and record.query_start_loc.tolist() == [0, 1, 2, 8, 8]
    assert record.block_tables.tolist() == runner.tables[:4].tolist()
    runner.input_buffers.seq_lens.fill_(5)
    runner.tables.fill_(1)
    assert record.seq_lens.tolist() == [7, 3, 0, 0] and record.block_tables[0].tolist() == [0, 1, 2, 3]


def test_an_eager_step_runs_eager_at_the_asked_size_with_the_graphs_request_padding():
    runner = StandInRunner(Desc(Mode.FULL, 8, 8, uniform_token_count=1))
    observer = StepObserver(runner, vocab_size=256, max_model_len=128)
    record = observer.start(eager_size=8)
    runner.execute(5, 8)
    assert record.path == "NONE" and record.ran == Desc(Mode.NONE, 8, 8)
    record = observer.start(eager_size=16)  # another size than the graph's: no request padding
    runner.execute(5, 16)
    assert record.ran == Desc(Mode.NONE, 16, None)


@pytest.mark.parametrize("fill", ["zeros", "random"])
def test_a_fill_reaches_the_padded_rows_only(fill):
    runner = StandInRunner(Desc(Mode.PIECEWISE, 8, None))
    observer = StepObserver(runner, vocab_size=256, max_model_len=128)
    record = observer.start(fill=fill)
    runner.execute(5, 8)
    assert record.token_ids[:5].tolist() == [0, 1, 2, 3, 4] and record.positions[:5].tolist() == [0, 1, 2, 3, 4]
    assert record.token_ids[5:].tolist() != [5, 6, 7] and bool((record.token_ids[5:] < 256).all())
    assert bool((record.positions[5:] < 128).all())
    observer.stop()
    record = observer.start()
    runner.execute(5, 8)  # no fill asked: the rows stay as they are
    assert record.token_ids[5:].tolist() == runner.input_buffers.input_ids[5:8].tolist()


# -- the checks that fail a step loudly ---------------------------------------------------------
def checked_engine():
    engine = VllmEngine.__new__(VllmEngine)
    engine.requests, engine.kernel_block_size = make_requests(), 16
    engine.config = SimpleNamespace(dtype="float32")
    return engine


NO_DRAFTS = SimpleNamespace(scheduled_spec_decode_tokens={})  # a SchedulerOutput's part the check reads


def step_parts(engine, logits, sampled_tokens, slots=None, path="FULL"):
    planned = engine.requests.plan([Request(1, (1, 2, 3), 0), Request(2, (4,), 0)])
    batch = SimpleNamespace(req_ids=["req-2", "req-1"], query_start_loc_np=[0, 1, 4, 4])  # V2: fewest tokens first
    rows = engine._rows(SimpleNamespace(input_batch=batch), planned)
    real = [engine.requests.slot(1, j, 16) for j in range(3)]
    record = SimpleNamespace(ran=Desc(Mode.FULL, 8, 8), path=path, slot_mapping=torch.tensor(
        slots if slots is not None else [engine.requests.slot(2, 0, 16)] + real + [-1] * 4))
    sampled = SimpleNamespace(req_ids=["req-2", "req-1"], sampled_token_ids=[[sampled_tokens[1]], [sampled_tokens[0]]])
    return record, planned, rows, logits, sampled


def test_rows_are_read_back_in_request_order():
    engine = checked_engine()
    _, _, rows, _, _ = step_parts(engine, None, (0, 0))
    assert [(q.request_id, list(span)) for q, span in rows] == [(1, [1, 2, 3]), (2, [0])]


def test_a_consistent_step_passes_the_checks():
    engine = checked_engine()
    logits = torch.zeros(4, 256)
    logits[2, 7] = logits[3, 9] = 1.0  # request 1's last row is row 2 (request order), request 2's is row 3
    record, planned, rows, logits, sampled = step_parts(engine, logits, (7, 9))
    engine._check(record, 8, rows, logits, sampled, NO_DRAFTS)


@pytest.mark.parametrize("broken", ["misread-rows", "wrong-slots", "other-path"])
def test_a_step_that_is_not_what_vllm_ran_fails_loudly(broken):
    engine = checked_engine()
    logits = torch.zeros(4, 256)
    logits[2, 7] = logits[3, 9] = 1.0
    sampled = (9, 7) if broken == "misread-rows" else (7, 9)
    slots = [0] * 8 if broken == "wrong-slots" else None
    path = "PIECEWISE" if broken == "other-path" else "FULL"
    record, planned, rows, logits, sampled_output = step_parts(engine, logits, sampled, slots, path)
    with pytest.raises(EngineError, match={"misread-rows": "misread", "wrong-slots": "KV slots",
                                           "other-path": "took the PIECEWISE path"}[broken]):
        engine._check(record, 8, rows, logits, sampled_output, NO_DRAFTS)


# -- without a GPU -------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_the_runtime_says_why_it_cannot_start(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("--runtime", "cudagraph_vllm_engine.runtime:VllmEngineRuntime", "-p", "no:xdist",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cannot start here*CUDA GPU*torch sees none*"])
    assert "Traceback" not in result.stderr.str()  # a refusal, not a bug: the reason alone


def test_what_vllm_changes_for_the_process_is_put_back(monkeypatch):
    """vLLM draws from torch's global generator and sets TORCHINDUCTOR_CACHE_DIR (found on the H200):
    the runtime puts both back, and any other variable a call adds, changes or removes."""
    import os

    from cudagraph_vllm_engine import settings

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("CUDAGRAPH_TEST_KEPT", "1")
    before = torch.get_rng_state()
    with settings.process_state_restored():
        torch.rand(3)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/elsewhere"
        os.environ["CUDAGRAPH_TEST_KEPT"] = "2"
    assert torch.equal(torch.get_rng_state(), before)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and os.environ["CUDAGRAPH_TEST_KEPT"] == "1"
    with settings.process_state_restored():
        del os.environ["CUDAGRAPH_TEST_KEPT"]
    assert os.environ["CUDAGRAPH_TEST_KEPT"] == "1"


# -- giving an engine back (release.py), on stand-ins for vLLM's modules ------------------------
class Compiled(torch.nn.Module):
    """Stands in for vLLM's TorchCompileWithNoGuardsWrapper: a module registered with dynamo."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def cleanup(self):
        self.calls.append(("cleanup", type(self).__name__))

    def original_code_object(self):
        return type(self).forward.__code__

    def forward(self):
        pass


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """vLLM's modules that release.py imports, standing in; returns the list of calls made."""
    import sys
    from types import ModuleType

    calls = []
    wrapper = ModuleType("vllm.compilation.wrapper")
    wrapper.TorchCompileWithNoGuardsWrapper = Compiled
    workspace = ModuleType("vllm.v1.worker.workspace")
    workspace.initialized = True
    workspace.is_workspace_manager_initialized = lambda: workspace.initialized
    workspace.init_workspace_manager = lambda device: calls.append(("init_workspace_manager", device))
    distributed = ModuleType("vllm.distributed")
    distributed.cleanup_dist_env_and_memory = lambda: calls.append(("cleanup_dist_env_and_memory",))
    worker = ModuleType("vllm.v1.worker")
    worker.workspace = workspace
    for name, module in {"vllm": ModuleType("vllm"), "vllm.compilation": ModuleType("vllm.compilation"),
                         "vllm.compilation.wrapper": wrapper, "vllm.v1": ModuleType("vllm.v1"),
                         "vllm.v1.worker": worker, "vllm.v1.worker.workspace": workspace,
                         "vllm.distributed": distributed}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch._dynamo.eval_frame, "remove_from_cache", lambda code: calls.append(("uncache", code)))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append(("dynamo_reset",)))

    def shutdown():  # the worker's shutdown resets the workspace manager (gpu/shutdown.py)
        calls.append(("shutdown",))
        workspace.initialized = False
    return calls, shutdown, workspace


@pytest.mark.parametrize("others_alive", [True, False])
def test_an_engine_gives_back_its_compiled_modules_before_the_worker_shuts_down(stand_in_vllm, others_alive):
    from cudagraph_vllm_engine import release

    calls, shutdown, _ = stand_in_vllm
    model = torch.nn.Sequential(Compiled(calls), torch.nn.Linear(2, 2))
    runner = SimpleNamespace(model=model, device="cuda:0")
    release.release_engine(SimpleNamespace(shutdown=shutdown), runner, others_alive=others_alive)
    assert calls[:2] == [("cleanup", "Compiled"), ("shutdown",)]  # the global hook first: it holds the weights
    assert calls[2] == ("uncache", Compiled.forward.__code__)  # dynamo's entry, whose function holds them too
    # The workspace manager the live engines' workers made is put back; with none left it stays reset.
    assert (("init_workspace_manager", "cuda:0") in calls) == others_alive


def test_the_process_is_released_as_vllms_tests_do(stand_in_vllm):
    from cudagraph_vllm_engine import release

    calls, _, _ = stand_in_vllm
    release.release_process()
    assert calls == [("cleanup_dist_env_and_memory",), ("dynamo_reset",)]  # vLLM's tests/conftest.py, in its order


def test_only_the_last_engine_to_close_releases_the_process(monkeypatch):
    import contextlib
    import weakref

    from cudagraph_vllm_engine import release

    calls = []
    monkeypatch.setattr(release, "release_engine", lambda executor, runner, others_alive: calls.append(
        ("engine", executor, others_alive)))
    monkeypatch.setattr(release, "release_process", lambda: calls.append(("process",)))
    live = weakref.WeakSet()
    engines = []
    for name in ("a", "b"):
        engine = VllmEngine.__new__(VllmEngine)
        engine.live, engine.label, engine.vllm_config = live, name, None
        engine.executor, engine.runner = f"executor-{name}", f"runner-{name}"
        engine._set_config = lambda config: contextlib.nullcontext()
        live.add(engine)
        engines.append(engine)
    engines[0].close()
    assert calls == [("engine", "executor-a", True)]
    engines[0].close()  # once only
    engines[1].close()
    assert calls == [("engine", "executor-a", True), ("engine", "executor-b", False), ("process",)]
    assert engines[1].runner is None and not live


# -- declarations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value,declared", [(None, "tf32"), ("ieee", "ieee"), ("IEEE", "ieee"), ("tf32", "tf32")])
def test_the_declared_precision_is_how_triton_will_compile_float32_dots(monkeypatch, value, declared):
    from cudagraph_vllm_engine.runtime import PRECISION_WHY, precision

    if value is None:
        monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    else:
        monkeypatch.setenv("TRITON_F32_DEFAULT", value)
    assert precision() == declared and declared in PRECISION_WHY


@pytest.mark.parametrize("version,ok", [("0.25.0", True), ("0.25.1", True), ("0.33.0", False), ("0.2", False)])
def test_the_runtime_declares_vllm_025_only_where_vllm_025_answers(version, ok):
    from cudagraph_vllm_engine.policy import check_version

    if ok:
        check_version(version)
    else:
        with pytest.raises(RuntimeError, match=f"declares vLLM 0.25's graph policy.*vLLM {version} is installed"):
            check_version(version)


# -- every build is checked against the policy's answer -------------------------------------------
def test_an_engine_that_is_not_what_the_policy_answers_is_closed_and_refused(monkeypatch):
    """The policy questions are answered for the engine vLLM builds: where the built engine's resolved
    mode, capture sizes or graph descriptors differ from the policy's answer for its config, build()
    closes it and says what each was."""
    import weakref

    from harness.protocol import EngineConfig, PolicyConfig
    from cudagraph_vllm_engine import engine as engine_module
    from cudagraph_vllm_engine import runtime as runtime_module
    from cudagraph_vllm_engine.policy import Answer

    closed = []

    class Built:
        resolved, build_warnings = "FULL_AND_PIECEWISE", ()

        def __init__(self, config, label, live):
            self.label = label

        def capture_sizes(self):
            return [1, 2, 4, 8, 16]

        def graph_descriptors(self):
            return {"PIECEWISE": ("desc(16)", "desc(8)")}

        def close(self):
            closed.append(self.label)

    answered = Answer((1, 2, 4, 8), "FULL_AND_PIECEWISE", (), SimpleNamespace(_capture_descs={}))
    monkeypatch.setattr(engine_module, "VllmEngine", Built)
    runtime = runtime_module.VllmEngineRuntime.__new__(runtime_module.VllmEngineRuntime)
    runtime.policy = SimpleNamespace(answer=lambda policy: answered)
    runtime.engines_built, runtime.live = 0, weakref.WeakSet()
    config = EngineConfig(preset="small", device="cuda", graph_backend="cuda", checkpoint="/checkpoint",
                          policy=PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64))
    with pytest.raises(RuntimeError, match=r"capture sizes \[1, 2, 4, 8, 16\].*answers FULL_AND_PIECEWISE, \[1, 2, 4, 8\]"):
        runtime.build(config)
    assert closed == ["engine #1 FULL_AND_PIECEWISE float32 seqs=8 tokens=64"]


def attention_trace_probe():
    """The probe beside the report it produced (reports/h200/vllm/attention_trace_probe.py)."""
    import importlib.util

    path = Path(__file__).parents[3] / "reports" / "h200" / "vllm" / "attention_trace_probe.py"
    spec = importlib.util.spec_from_file_location("attention_trace_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_attention_trace_restates_vllms_kernel_rule_and_is_off_unless_asked(monkeypatch):
    """The split (3D) kernel only for decode batches of at most `threshold` sequences with its
    buffers allocated (vLLM 0.25's use_3d); without the variable nothing is wrapped."""
    attention_trace = attention_trace_probe()
    assert attention_trace.kernel(4, 1, 8, True) == "3d"
    assert attention_trace.kernel(8, 1, 8, True) == "3d"
    assert attention_trace.kernel(9, 1, 8, True) == "2d"  # more sequences than the threshold
    assert attention_trace.kernel(4, 2, 8, True) == "2d"  # a query longer than one token
    assert attention_trace.kernel(4, 1, None, True) == "2d"  # no threshold
    assert attention_trace.kernel(4, 1, 8, False) == "2d"  # no segment buffers
    monkeypatch.delenv(attention_trace.VARIABLE, raising=False)
    assert attention_trace.install() is False


def test_the_attention_trace_logs_each_call_of_the_named_test_with_its_kernel(monkeypatch, tmp_path):
    """With the variable set, the Triton backend's unified_attention is wrapped (the kit's trace_calls):
    each call during a test it names is one line of the events file, and the call goes through."""
    import sys
    from types import ModuleType

    attention_trace = attention_trace_probe()

    backend = ModuleType("vllm.v1.attention.backends.triton_attn")
    backend.unified_attention = lambda **kwargs: "ran"
    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, backend.__name__, backend)
    for parent, child in zip(names, names[1:] + [backend.__name__]):
        monkeypatch.setattr(sys.modules[parent], child.rpartition(".")[2], sys.modules[child], raising=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    events = tmp_path / "events.log"
    monkeypatch.setenv("CUDAGRAPH_VLLM_EVENTS", str(events))
    monkeypatch.setenv(attention_trace.VARIABLE, "test_traced")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "suites/test_x.py::test_traced[FULL] (call)")
    assert attention_trace.install() is True
    buffers = dict.fromkeys(attention_trace.SEGMENT_BUFFERS, 1)
    assert backend.unified_attention(seqused_k=[5, 6], max_seqlen_q=1, max_seqlen_k=6, seq_threshold_3D=8,
                                     **buffers) == "ran"
    line = events.read_text().split(" ", 1)[1]
    assert line.startswith("attention suites/test_x.py::test_traced[FULL] capturing=False num_seqs=2 max_seqlen_q=1 "
                           "max_seqlen_k=6 threshold=8 kernel=3d matmul_precision=")
