"""The vllm-engine-v1 runtime's own logic, on any machine (no vLLM, no GPU): verify-step splitting and
the SchedulerOutput it writes (on a stand-in of vLLM's output module), the observer on a stand-in V1
model runner and forward context, the sampled-token check of verify steps, the ngram proposer's
stand-in, the runner switch, and the refusal to start without a GPU."""
import enum
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from harness import protocol as p  # noqa: E402
from harness.protocol import Request  # noqa: E402

from cudagraph_vllm_engine_v1 import ngram_stand_in  # noqa: E402
from cudagraph_vllm_engine.engine import EngineError  # noqa: E402
from cudagraph_vllm_engine.requests import Requests  # noqa: E402
from cudagraph_vllm_engine_v1.engine import VllmV1Engine, verify_split  # noqa: E402
from cudagraph_vllm_engine_v1.observer import V1StepObserver  # noqa: E402
from cudagraph_vllm_engine_v1.runtime import force_v1_runner  # noqa: E402


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Desc:  # vLLM's BatchDescriptor, the fields the observer reads
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0


# -- verify steps ------------------------------------------------------------------------------
def test_a_request_of_k_plus_one_tokens_after_a_context_is_a_verify_step():
    assert verify_split((1, 2, 3, 4, 5, 6), 3, 3, 2) == ((1, 2, 3, 4), (5, 6))
    assert verify_split((1, 2, 3), 0, 3, 2) == ((1, 2, 3), ())  # a prefill of q tokens brings no drafts
    assert verify_split((1, 2, 3, 4), 3, 1, 2) == ((1, 2, 3, 4), ())  # a decode step
    assert verify_split((1, 2, 3, 4, 5, 6), 3, 3, 0) == ((1, 2, 3, 4, 5, 6), ())  # no speculative tokens


@dataclass
class FakeNewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object
    prefill_token_ids: list


@dataclass
class FakeSchedulerOutput:
    scheduled_new_reqs: list = field(default_factory=list)
    scheduled_spec_decode_tokens: dict = field(default_factory=dict)
    num_scheduled_tokens: dict = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    num_common_prefix_blocks: list = field(default_factory=list)
    finished_req_ids: set = field(default_factory=set)

    @classmethod
    def make_empty(cls):
        return cls()


@pytest.fixture
def vllm_output_module(monkeypatch):
    module = types.ModuleType("vllm.v1.core.sched.output")
    module.NewRequestData, module.SchedulerOutput = FakeNewRequestData, FakeSchedulerOutput
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.output", module)


def bare_engine(k=2):
    engine = VllmV1Engine.__new__(VllmV1Engine)
    engine.num_speculative_tokens, engine.sampling = k, object()
    engine.requests = Requests(9, 16, vocab=256, max_len=128, max_seqs=4, max_tokens=64)
    engine.config, engine.kernel_block_size = SimpleNamespace(dtype="float32"), 16
    return engine


def test_the_scheduler_output_hands_drafts_over_as_vllms_scheduler_does(vllm_output_module):
    engine = bare_engine(k=2)
    engine.requests.commit(engine.requests.plan([Request(1, (3, 4, 5), 0), Request(2, (9, 9), 0)]))
    planned = engine.requests.plan([Request(1, (6, 7, 8), 3), Request(2, (1,), 2)])
    out = engine._scheduler_output(planned)
    first, second = out.scheduled_new_reqs
    assert first.prompt_token_ids == [3, 4, 5, 6] and first.num_computed_tokens == 3
    assert out.scheduled_spec_decode_tokens == {first.req_id: [7, 8]}
    assert second.prompt_token_ids == [9, 9, 1] and second.req_id not in out.scheduled_spec_decode_tokens
    assert out.num_scheduled_tokens == {first.req_id: 3, second.req_id: 1} and out.total_num_scheduled_tokens == 4


# -- the observer --------------------------------------------------------------------------------
class FakeRunner:
    def __init__(self, answer):
        self.cudagraph_dispatcher = SimpleNamespace(dispatch=lambda num_tokens, **kw: answer(num_tokens))
        self.forwards = []

    def _model_forward(self, input_ids=None, positions=None, **kwargs):
        self.forwards.append(input_ids.clone())
        return "hidden"


def run_step(observer, runner, context, real, padded, **start):
    observer.expect(real)
    observer.start(**start)
    mode, desc = runner.cudagraph_dispatcher.dispatch(real)
    context.cudagraph_runtime_mode, context.batch_descriptor = mode, desc
    context.slot_mapping = {"layer.0": torch.arange(100, 100 + desc.num_tokens)}
    ids, positions = torch.arange(1, desc.num_tokens + 1), torch.arange(desc.num_tokens)
    runner._model_forward(input_ids=ids[:desc.num_tokens], positions=positions[:desc.num_tokens])
    observer.stop()
    return observer.record


def test_the_observer_reads_mode_and_size_from_the_forward_context_not_from_a_recount():
    context = SimpleNamespace()
    runner = FakeRunner(lambda n: (Mode.FULL, Desc(8, 8, True)))
    observer = V1StepObserver(runner, vocab_size=50, max_model_len=64, forward_context=lambda: context)
    record = run_step(observer, runner, context, real=5, padded=8)
    assert record.path == "FULL" and record.ran == Desc(8, 8, True) and record.forward_tokens == 8
    assert record.dispatched == [(Mode.FULL, Desc(8, 8, True))]
    assert record.slot_mapping.tolist() == list(range(100, 108))
    assert VllmV1Engine._padded(record) == 8


def test_the_observer_copies_the_request_rows_at_the_descriptors_padded_count():
    """The runner's seq_lens and query_start_loc (a CpuGpuBuffer) and the first KV group's block
    table, at the descriptor's num_reqs, copied at forward time."""
    context = SimpleNamespace()
    runner = FakeRunner(lambda n: (Mode.FULL, Desc(8, 4, True)))
    table = torch.arange(24, dtype=torch.int32).reshape(6, 4)
    runner.seq_lens = torch.tensor([5, 9, 0, 0, 7, 7], dtype=torch.int32)
    runner.query_start_loc = SimpleNamespace(gpu=torch.tensor([0, 1, 2, 2, 2, 9, 9], dtype=torch.int32))
    runner.input_batch = SimpleNamespace(num_reqs=2, block_table=[SimpleNamespace(
        get_device_tensor=lambda rows: table[:rows])])
    observer = V1StepObserver(runner, vocab_size=50, max_model_len=64, forward_context=lambda: context)
    record = run_step(observer, runner, context, real=2, padded=8)
    assert record.seq_lens.tolist() == [5, 9, 0, 0] and record.query_start_loc.tolist() == [0, 1, 2, 2, 2]
    assert record.block_tables.tolist() == table[:4].tolist()
    table.fill_(0)
    assert record.block_tables[1].tolist() == [4, 5, 6, 7]


def test_an_eager_step_replaces_the_dispatchers_answer_and_padding_fills_only_padded_rows():
    context = SimpleNamespace()
    runner = FakeRunner(lambda n: (Mode.FULL, Desc(8, 8, True)))
    observer = V1StepObserver(runner, vocab_size=50, max_model_len=64, forward_context=lambda: context)
    record = run_step(observer, runner, context, real=5, padded=8, eager_size=8, fill="zeros")
    assert record.path == "NONE" and record.ran == Desc(8, 8, True)  # the graph's request padding is kept
    assert record.token_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


def test_a_forward_that_disagrees_with_its_descriptor_fails_loudly():
    from cudagraph_vllm_engine_v1.observer import V1StepRecord

    with pytest.raises(EngineError, match="input ids"):
        VllmV1Engine._padded(V1StepRecord(ran=Desc(8), forward_tokens=5, forwards=1))
    with pytest.raises(EngineError, match="one model forward"):
        VllmV1Engine._padded(V1StepRecord(ran=Desc(8), forward_tokens=8, forwards=2))
    engine = bare_engine()
    record = V1StepRecord(dispatched=[(Mode.FULL, Desc(8))], ran=Desc(8), path="PIECEWISE", forwards=1)
    with pytest.raises(EngineError, match="dispatcher last chose FULL"):
        engine._check(record, 8, [], None, None, None)


# -- verify steps: what vLLM sampled ------------------------------------------------------------------
def test_verify_tokens_are_checked_row_by_row_against_the_drafts_handed_over(vllm_output_module):
    engine = bare_engine(k=2)
    engine.requests.commit(engine.requests.plan([Request(1, (3, 4, 5), 0)]))
    planned = engine.requests.plan([Request(1, (6, 7, 8), 3)])
    output = engine._scheduler_output(planned)  # drafts 7, 8 as scheduled_spec_decode_tokens
    record = SimpleNamespace(slot_mapping=torch.tensor([engine.requests.slot(1, 3 + j) for j in range(3)]))
    logits = torch.zeros(3, 10)
    logits[0, 7] = logits[1, 2] = logits[2, 4] = 1.0  # greedy: accept draft 7, reject draft 8 (row 1 wants 2)
    rows = [(planned[0], range(0, 3))]

    def check(tokens):
        return engine._check_rows(record, rows, logits, SimpleNamespace(req_ids=["req-1"], sampled_token_ids=[tokens]),
                                  output)

    assert check([7, 2]) == {1: 1}
    with pytest.raises(EngineError, match="not the maximum"):
        check([7, 3])  # a token that is no row's argmax
    with pytest.raises(EngineError, match="verify request"):
        check([7, 2, 4, 4])  # more than k + 1
    record.slot_mapping = torch.tensor([0, 1, 2])
    with pytest.raises(EngineError, match="other KV slots"):
        check([7, 2])


# -- the ngram proposer, the runner switch, no GPU -------------------------------------------------
def test_the_ngram_stand_in_goes_in_only_where_numba_is_missing():
    modules = {}
    said = ngram_stand_in.install(find_spec=lambda name: None, modules=modules)
    assert "stand-in" in said and modules[ngram_stand_in.MODULE].STAND_IN
    proposer = modules[ngram_stand_in.MODULE].NgramProposer(
        SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=2)))
    assert proposer.propose(2, [[1], [2]]) == [[], []]
    assert "own" in ngram_stand_in.install(find_spec=lambda name: object(), modules={})


def test_the_runner_switch_is_set_to_v1_and_an_explicit_v2_is_refused():
    environ = {}
    force_v1_runner(environ)
    assert environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    with pytest.raises(p.RuntimeUnavailable, match="asks for V2"):
        force_v1_runner({"VLLM_USE_V2_MODEL_RUNNER": "1"})


def test_the_runtime_refuses_to_start_without_a_gpu(monkeypatch):
    from cudagraph_vllm_engine_v1.runtime import VllmEngineV1Runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(p.RuntimeUnavailable, match="no"):
        VllmEngineV1Runtime()


def test_v1_has_its_own_known_failures_none_of_them_inherited_from_v2():
    from harness.session import known_failures

    from cudagraph_vllm_engine import runtime
    from cudagraph_vllm_engine_v1 import runtime as v1_runtime

    assert v1_runtime.VllmEngineV1Runtime.known_failures != runtime.VllmEngineRuntime.known_failures
    entries = known_failures.load(v1_runtime.VllmEngineV1Runtime.known_failures)
    assert entries and all("vllm-engine-v1" in entry.test for entry in entries)
    # Each is bounded: by a message it must match, and where a difference is its finding, by its size.
    assert all(entry.match for entry in entries)
    assert all(entry.max_difference for entry in entries if "differs" in entry.reason or "differed" in entry.reason)


def test_v1_keys_and_answers_are_read_off_vllms_dispatcher_not_rewritten():
    from cudagraph_vllm_engine_v1.policy import as_dispatch, v1_graph_keys

    dispatcher = SimpleNamespace(cudagraph_keys={Mode.FULL: {Desc(8, 8, True), Desc(4, 4, True)},
                                                 Mode.PIECEWISE: {Desc(16)}, Mode.NONE: set()})
    assert v1_graph_keys(dispatcher) == {"FULL": ((4, 4, True, 0), (8, 8, True, 0)), "PIECEWISE": ((16, 0, False, 0),)}
    assert as_dispatch(Mode.FULL, Desc(8, 8, True, True, 1)) == p.Dispatch("FULL", p.Descriptor(8, 8, True, True, 1))


def test_both_v1_runtimes_declare_vllm_025s_v1_rules_and_the_policy_one_is_registered():
    import tomllib
    from pathlib import Path

    from harness.protocol import Capabilities

    from cudagraph_vllm_engine_v1 import runtime as v1_runtime

    caps = Capabilities(rules=v1_runtime.RULES)
    assert (caps.vllm_release, caps.vllm_runners) == ("0.25", ("v1",))
    project = tomllib.loads((Path(v1_runtime.__file__).parents[1] / "pyproject.toml").read_text())
    registered = project["project"]["entry-points"]["cudagraph_conformance.runtimes"]
    assert registered["vllm-engine-v1-policy"] == "cudagraph_vllm_engine_v1.runtime:VllmEngineV1PolicyRuntime"
    assert v1_runtime.VllmEngineV1PolicyRuntime.name == "vllm-engine-v1-policy"


def test_the_v1_policy_runtime_sets_the_runner_switch_before_vllm_is_imported(monkeypatch):
    from cudagraph_vllm_engine_v1.runtime import VllmEngineV1PolicyRuntime

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(p.RuntimeUnavailable, match="asks for V2"):
        VllmEngineV1PolicyRuntime()
