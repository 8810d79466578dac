"""The vllm-engine-v1 runtime's LoRA logic, on any machine (no vLLM, no GPU): the EngineArgs fields of an
engine with the harness's adapters, the checks of the adapter folders, each request's LoRARequest on the
SchedulerOutput it writes (a stand-in of vLLM's output module), the key a step reports, and the refusals
that name what was refused. What needs vLLM (its LoRA manager loading the adapter, the punica kernels,
the keys it dispatches to) runs on the GPU lane only."""
import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from harness import protocol as p  # noqa: E402
from harness.expectations import lora_adapters  # noqa: E402
from harness.protocol import Request  # noqa: E402

from cudagraph_vllm_engine_v1 import lora as v1_lora  # noqa: E402
from cudagraph_vllm_engine_v1.engine import VllmV1Engine  # noqa: E402

from test_vllm_engine_v1_cpu import bare_engine, vllm_output_module  # noqa: E402,F401 (a fixture)


@dataclass(frozen=True)
class FakeLoRARequest:  # vLLM's LoRARequest, the fields this runtime sets
    lora_name: str
    lora_int_id: int
    lora_path: str


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return lora_adapters.adapters("tiny", 2, root=tmp_path_factory.mktemp("adapters"))


def test_lora_args_enable_lora_with_a_rank_vllm_lists(adapters):
    policy = p.PolicyConfig(max_loras=2, specialize_active_loras=True)
    args = v1_lora.lora_args(policy, adapters)
    assert args == dict(enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2, specialize_active_lora=True)
    assert v1_lora.lora_args(p.PolicyConfig(max_loras=1), adapters)["max_cpu_loras"] == 2  # every adapter cached
    assert v1_lora.lora_args(p.PolicyConfig(), ()) == {}
    assert v1_lora.max_lora_rank([{"r": 12}]) == 16 and v1_lora.max_lora_rank([]) == 8


def test_adapters_without_max_loras_are_refused_by_name(adapters):
    with pytest.raises(ValueError, match="max_loras=0"):
        v1_lora.lora_args(p.PolicyConfig(), adapters)


def test_an_adapter_vllms_llama_cannot_take_is_refused_naming_it(tmp_path, adapters):
    folder = tmp_path / "embeddings"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"")
    config = lora_adapters.adapter_config("tiny")
    (folder / "adapter_config.json").write_text(json.dumps(dict(config, target_modules=["embed_tokens"])))
    with pytest.raises(v1_lora.AdapterRefused, match=r"embeddings.*target_modules \['embed_tokens'\]"):
        v1_lora.lora_args(p.PolicyConfig(max_loras=1), (str(folder),))
    with pytest.raises(v1_lora.AdapterRefused, match="no adapter_config.json"):
        v1_lora.lora_args(p.PolicyConfig(max_loras=1), (str(tmp_path),))
    with pytest.raises(v1_lora.AdapterRefused, match="above vLLM's largest"):
        v1_lora.max_lora_rank([{"r": 1024}])


def test_adapter_ids_from_one_name_the_folders_in_order(adapters):
    made = v1_lora.lora_requests(adapters, FakeLoRARequest)
    assert {i: (r.lora_int_id, r.lora_path) for i, r in made.items()} == {1: (1, adapters[0]), 2: (2, adapters[1])}
    assert v1_lora.request_lora(7, None, made) is None
    with pytest.raises(ValueError, match="request 7 names LoRA adapter 3; .* adapters \\[1, 2\\]"):
        v1_lora.request_lora(7, 3, made)


def test_the_scheduler_output_carries_each_requests_lora_request(vllm_output_module, adapters):  # noqa: F811
    engine = bare_engine(k=0)
    engine.adapters = v1_lora.lora_requests(adapters, FakeLoRARequest)
    planned = engine.requests.plan([Request(1, (3, 4), 0, lora=2), Request(2, (5,), 0), Request(3, (6,), 0, lora=1)])
    first, second, third = engine._scheduler_output(planned).scheduled_new_reqs
    assert (first.lora_request.lora_int_id, second.lora_request, third.lora_request.lora_int_id) == (2, None, 1)
    assert first.lora_request.lora_path == adapters[1]


def test_load_each_names_the_adapter_vllm_refused(adapters):
    made = v1_lora.lora_requests(adapters, FakeLoRARequest)

    class Manager:
        removed = False

        def add_adapter(self, request):
            if request.lora_int_id == 2:
                raise ValueError("While loading ..., expected target modules in [...] but received [...]")

        def remove_all_adapters(self):
            self.removed = True

    with pytest.raises(v1_lora.AdapterRefused, match=f"vLLM refused LoRA adapter 2 \\({adapters[1]}\\): ValueError"):
        v1_lora.load_each(Manager(), made)
    manager = Manager()
    v1_lora.load_each(manager, {1: made[1]})
    assert manager.removed  # capture runs with vLLM's dummy adapters only


def test_a_step_reports_the_key_its_forward_ran_under():
    engine = VllmV1Engine.__new__(VllmV1Engine)
    ran = SimpleNamespace(num_tokens=8, num_reqs=8, uniform=True, has_lora=True, num_active_loras=2)
    assert engine.key_of(SimpleNamespace(ran=ran)) == p.Descriptor(8, 8, True, True, 2)
    assert engine.key_of(SimpleNamespace(ran=None)) is None


def test_adapters_in_a_dtype_vllms_lora_kernels_refuse_are_refused_before_building(adapters):
    policy = p.PolicyConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=2)
    with pytest.raises(ValueError, match="float32: vLLM 0.25's LoRA kernels take bfloat16 or float16 only"):
        v1_lora.lora_args(policy, adapters, "float32")
    assert v1_lora.lora_args(policy, adapters, "bfloat16")["enable_lora"] is True


def test_a_live_request_cannot_change_its_adapter_as_vllm_keeps_the_first():
    from cudagraph_vllm_engine.requests import Requests

    book = Requests(num_blocks=16, block_size=4, vocab=100, max_len=64, max_seqs=4, max_tokens=32)
    book.commit(book.plan([Request(1, (5, 6), 0, lora=1), Request(2, (7,), 0)]))
    book.commit(book.plan([Request(1, (8,), 2, lora=1), Request(2, (9,), 1)]))  # the same adapters: fine
    with pytest.raises(ValueError, match=r"request 1 was admitted with LoRA adapter 1 and now names None"):
        book.plan([Request(1, (9,), 3)])
    with pytest.raises(ValueError, match=r"request 2 was admitted with LoRA adapter None and now names 2"):
        book.plan([Request(2, (3,), 2, lora=2)])
    book.release(1)
    assert book.plan([Request(1, (5,), 0, lora=2)])[0].lora == 2  # a new request under the old id: a new adapter
