"""Graph backends (SPEC 6): replay equals eager, frozen capture, address checks, capture errors.

Every test runs on the CPU emulator; those that hold for real graphs also run on CUDA where a
GPU is present. Eager runs of the same step are the oracle.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.graphs import CaptureError, StaleAddressError, make_backend

CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))


@pytest.fixture(params=["emulated", CUDA])
def backend(request):
    return make_backend(request.param, "cuda")


@pytest.fixture
def emulated():
    return make_backend("emulated", "cpu")


def device_of(backend) -> str:
    return "cuda" if backend.name == "cuda" else "cpu"


class TinyStep:
    """A decode-like step: MLP with views, softmax, in-place ops, a cache written through slots."""

    def __init__(self, device, batch=4, hidden=8, num_slots=32):
        weights = torch.Generator().manual_seed(0)
        self.batch, self.hidden, self.num_slots = batch, hidden, num_slots
        self.w_in = torch.randn(hidden, 2 * hidden, generator=weights).to(device)
        self.w_out = torch.randn(hidden, hidden, generator=weights).to(device)
        self.cache = torch.zeros(num_slots, hidden, device=device)
        self.inputs = {"hidden": torch.zeros(batch, hidden, device=device),
                       "slot_ids": torch.arange(batch, device=device)}

    def __call__(self):
        up_and_gate = (self.inputs["hidden"] @ self.w_in).view(self.batch, 2, self.hidden).transpose(0, 1)
        activation = torch.softmax(up_and_gate[0], dim=-1) * up_and_gate[1]
        activation.mul_(0.5).add_(1.0)
        out = activation @ self.w_out
        self.cache.index_put_((self.inputs["slot_ids"],), out)
        gathered = self.cache.index_select(0, self.inputs["slot_ids"]).t().reshape(-1)
        best, best_index = out.max(dim=-1)  # a multi-output op
        return {"out": out, "gathered": gathered, "best": best, "best_index": best_index}

    def copy_in(self, seed: int) -> None:
        data = torch.Generator().manual_seed(seed)
        self.inputs["hidden"].copy_(torch.randn(self.batch, self.hidden, generator=data))
        self.inputs["slot_ids"].copy_(torch.randperm(self.num_slots, generator=data)[: self.batch])


def capture_step(backend, step: TinyStep, name="step"):
    step()  # warm-up, as the caller must do before a CUDA capture
    return backend.capture(step, static_inputs=step.inputs, name=name)


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
def test_replay_equals_eager_bit_for_bit(backend, grad_mode):
    step = TinyStep(device_of(backend))
    with grad_mode():
        graph = capture_step(backend, step)
        for seed in range(3):
            step.copy_in(seed)
            cache_before = step.cache.clone()
            graph.replay(step.inputs)
            replayed = {k: v.clone() for k, v in graph.output.items()}
            replayed_cache = step.cache.clone()
            step.cache.copy_(cache_before)
            eager = step()
            for key in eager:
                assert torch.equal(replayed[key], eager[key]), f"{key} differs from eager (seed {seed})"
            assert torch.equal(replayed_cache, step.cache), f"cache differs from eager (seed {seed})"


def test_outputs_are_overwritten_in_place_by_the_next_replay(backend):
    step = TinyStep(device_of(backend))
    with torch.inference_mode():
        graph = capture_step(backend, step)
        out = graph.output["out"]
        step.copy_in(1)
        graph.replay(step.inputs)
        first = out.clone()
        step.copy_in(2)
        graph.replay(step.inputs)
    assert graph.output["out"] is out
    assert not torch.equal(out, first)
    assert backend.pool_stats()["bytes"] > 0


def test_python_control_flow_and_scalars_are_frozen_at_capture(backend):
    x = torch.ones(3, device=device_of(backend))
    settings = {"scale": 2.0}

    def fn():
        return x * settings["scale"] if settings["scale"] > 1 else x - 100

    with torch.inference_mode():
        graph = backend.capture(fn, static_inputs={"x": x})
        settings["scale"] = 0.0  # eager would now take the other branch
        x.copy_(torch.tensor([1.0, 2.0, 3.0]))
        graph.replay({"x": x})
    assert graph.output.tolist() == [2.0, 4.0, 6.0]


def test_stale_metadata_is_used_as_is(backend):
    """Slots not copied into their buffer: replay writes the cache at the old slots (as a real graph)."""
    step = TinyStep(device_of(backend))
    with torch.inference_mode():
        graph = capture_step(backend, step)
        step.cache.zero_()
        step.inputs["hidden"].copy_(torch.ones(step.batch, step.hidden))  # slot_ids left at 0..3
        graph.replay(step.inputs)
    written = step.cache.abs().sum(dim=-1).nonzero().flatten().tolist()
    assert written == [0, 1, 2, 3]


@pytest.mark.parametrize("forbidden", [
    pytest.param(lambda x: x.sum().item(), id="item"),
    pytest.param(lambda x: x.tolist(), id="tolist"),
    pytest.param(lambda x: torch.nonzero(x), id="nonzero"),
])
def test_cpu_sync_during_capture_raises(backend, forbidden):
    x = torch.ones(4, device=device_of(backend))
    with torch.inference_mode(), pytest.raises(CaptureError, match="capture"):
        backend.capture(lambda: forbidden(x), static_inputs={"x": x}, name="bad")
    assert not backend.capturing
    with torch.inference_mode():  # a failed capture leaves the backend usable
        graph = backend.capture(lambda: x + 1, static_inputs={"x": x})
        graph.replay({"x": x})
    assert graph.output.tolist() == [2.0] * 4


@pytest.mark.parametrize("forbidden, message", [
    pytest.param(lambda x: x[x > 0], "boolean mask", id="mask-index"),
    pytest.param(lambda x: x.to("meta"), "device copies", id="device-copy"),
    pytest.param(lambda x: bool(x[0]), "CPU synchronisation", id="bool"),
    pytest.param(lambda x: x.clone().unsqueeze_(0), "out-of-place", id="inplace-view"),
])
def test_emulator_rejects_what_it_cannot_replay(emulated, forbidden, message):
    x = torch.ones(4)
    for grad_mode in (torch.inference_mode, torch.no_grad):
        with grad_mode(), pytest.raises(CaptureError, match=message):
            emulated.capture(lambda: forbidden(x), static_inputs={"x": x}, name="bad")


def test_capture_leaves_existing_tensors_as_it_found_them(backend):
    """A CUDA capture records without running: state the step writes changes only on replay,
    and a failed capture changes nothing either."""
    device = device_of(backend)
    cache, x = torch.zeros(4, device=device), torch.ones(4, device=device)

    def step():
        cache.add_(x)
        return x * 2

    with torch.inference_mode():
        graph = backend.capture(step, static_inputs={"x": x})
        assert cache.tolist() == [0.0] * 4
        graph.replay({"x": x})
        assert cache.tolist() == [1.0] * 4 and graph.output.tolist() == [2.0] * 4
        with pytest.raises(CaptureError):
            backend.capture(lambda: (cache.add_(x), x.sum().item()), static_inputs={"x": x}, name="bad")
    assert cache.tolist() == [1.0] * 4


def test_replaced_buffer_fails_on_first_replay(backend):
    step = TinyStep(device_of(backend))
    with torch.inference_mode():
        graph = capture_step(backend, step, name="decode-4")
        step.inputs["hidden"] = torch.ones_like(step.inputs["hidden"])  # replaced, not copied into
        with pytest.raises(StaleAddressError, match=r"'decode-4'.*'hidden'.*copied into the captured static buffers"):
            graph.replay(step.inputs)


def replace_after_one_good_replay(backend, kept: list | None = None):
    """Replay once with the captured buffer, then replace it with a new tensor of other data; the
    captured one stays alive in `kept` (freed, a replay reads freed memory: test_freed_memory below)."""
    x = torch.ones(3, device=device_of(backend))
    with torch.inference_mode():
        graph = backend.capture(lambda: x * 2, static_inputs={"x": x}, name="double")
        graph.replay({"x": x})
    if kept is not None:
        kept.append(x)
    return graph, {"x": torch.full_like(x, 5.0)}


def test_debug_checks_every_replay():
    backend = make_backend("emulated", "cpu", debug=True)
    graph, replaced = replace_after_one_good_replay(backend)
    with pytest.raises(StaleAddressError, match="'x' is now at 0x"):
        graph.replay(replaced)


def test_without_debug_later_replays_are_unchecked_and_compute_on_the_old_buffer(backend):
    # Documented cost of checking only the first replay: a later swap goes unnoticed.
    kept = []
    graph, replaced = replace_after_one_good_replay(backend, kept)
    graph.replay(replaced)
    assert graph.output.tolist() == [2.0, 2.0, 2.0]  # stale: 2 * the old ones, not 2 * 5


@pytest.mark.parametrize("debug", [False, True])
def test_inputs_given_as_a_function_are_built_only_to_be_checked(debug):
    # The reference runner hands its FULL replays a function: a step need not build the inputs'
    # mapping for a replay that does not look at it. A replaced buffer is still caught when it does.
    backend = make_backend("emulated", "cpu", debug=debug)
    x = torch.ones(3)
    calls = []

    def inputs():
        calls.append(1)
        return {"x": x}
    with torch.inference_mode():
        graph = backend.capture(lambda: x * 2, static_inputs={"x": x}, name="double")
        for _ in range(3):
            graph.replay(inputs)
    assert len(calls) == (3 if debug else 1)
    fresh = backend.capture(lambda: x * 3, static_inputs={"x": x}, name="triple")
    with pytest.raises(StaleAddressError, match="'x' is now at 0x"):
        fresh.replay(lambda: {"x": x.clone()})


def test_missing_and_unknown_inputs_are_stale(emulated):
    x = torch.ones(2)
    graph = emulated.capture(lambda: x + 1, static_inputs={"x": x}, name="g")
    with pytest.raises(StaleAddressError, match="'x'.*not supplied"):
        graph.replay({})
    with pytest.raises(StaleAddressError, match="'y' was not a static input"):
        graph.replay({"x": x, "y": x})


def test_capture_after_the_capture_phase_raises(backend):
    backend.close_capture_phase()
    with pytest.raises(CaptureError, match="capture after the capture phase"):
        backend.capture(lambda: None, static_inputs={}, name="late")


def test_capturing_flag_is_set_only_inside_capture(backend):
    x, seen = torch.ones(2, device=device_of(backend)), []
    backend.capture(lambda: (seen.append(backend.capturing), x + 1), static_inputs={"x": x})
    assert seen == [True] and not backend.capturing


def test_num_ops_counts_work_not_views(emulated):
    x, w = torch.ones(4, 8), torch.ones(8, 8)
    graph = emulated.capture(lambda: (x @ w).reshape(-1).view(8, 4).t(), static_inputs={"x": x})
    assert graph.num_ops == 1  # mm; reshape of a contiguous tensor, view and t are aliases
    assert emulated.pool_stats() == {"bytes": 4 * 8 * 4}  # the mm result, float32
    step = TinyStep("cpu")
    graph = capture_step(emulated, step)
    counts = {graph.num_ops}
    for seed in range(3):
        step.copy_in(seed)
        graph.replay(step.inputs)
        counts.add(graph.num_ops)
    assert len(counts) == 1 and graph.num_ops > 5


class LaunchedEagerly(TorchDispatchMode):
    """What an eager run dispatches that makes new memory (a kernel a replay would run), and its bytes."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        fresh = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs]
        if fresh:
            self.ops.append(str(func))
            self.bytes += sum(t.untyped_storage().nbytes() for t in fresh)
        return out


@pytest.mark.parametrize("shapes", [((4,), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5))],
                         ids=["vector@batch", "batch@batch", "batch@matrix"])
def test_a_capture_records_the_kernels_an_eager_run_launches(emulated, shapes):
    """Under inference_mode a composite op reaches the emulator whole; it must decompose it as an eager
    run does (no_grad here, the independent run), not as torch's Python decompositions for tracing do
    (a vector times a batch of matrices: clone and mv instead of one bmm)."""
    a, b = (torch.randn(*shape) for shape in shapes)
    with torch.no_grad(), LaunchedEagerly() as eager:
        torch.matmul(a, b)
    with torch.inference_mode():
        graph = emulated.capture(lambda: torch.matmul(a, b), static_inputs={"a": a, "b": b})
    assert graph.num_ops == len(eager.ops), eager.ops
    assert emulated.pool_stats()["bytes"] == eager.bytes


def test_long_graph_replays_and_matches_eager(backend):
    x = torch.linspace(0, 1, 64, device=device_of(backend))

    def hundred_layers():
        y = x
        for _ in range(100):
            y = torch.tanh(y * 1.01 + 0.01)
        return y

    with torch.inference_mode():
        graph = backend.capture(hundred_layers, static_inputs={"x": x})
        for seed in range(20):
            x.copy_(torch.rand(64, generator=torch.Generator().manual_seed(seed)))
            graph.replay({"x": x})
        assert torch.equal(graph.output, hundred_layers())
    assert graph.num_ops in (None, 300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_backend_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a CUDA device.*'emulated'"):
        make_backend("cuda", "cuda")


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="unknown graph backend 'tpu'; valid names: cuda, emulated"):
        make_backend("tpu", "cpu")


@pytest.mark.parametrize("cuda, explicit, expected", [
    ("13.0", None, "1"), ("12.6", None, "1"),  # the CUDA graph bug that kept CUPTI attached is fixed
    ("12.4", None, None),  # torch's own workaround stands there
    ("13.0", "0", "0"),  # an explicit choice is the user's
])
def test_profiler_detaches_from_the_gpu_when_cuda_allows(monkeypatch, cuda, explicit, expected):
    # A profiler left attached slowed every later step by ~300 us on the H200 (counting.profiler).
    from torch.profiler import ProfilerActivity

    from harness.graphs import counting

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setenv("TEARDOWN_CUPTI", explicit or "")  # so that the test's own setting is undone
    if explicit is None:
        monkeypatch.delenv("TEARDOWN_CUPTI")
    counting.profiler(ProfilerActivity.CPU)
    assert os.environ.get("TEARDOWN_CUPTI") == expected


def test_every_profile_goes_through_the_harness_profiler():
    # A profile opened with torch's own profiler leaves CUPTI attached and slows every timing after
    # it (counting.profiler); the project's code profiles only through counting.profiler.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    opened_directly = re.compile(r"\bprofile\(\s*activities|import[^\n]*\bprofile\b(?!r)")
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("harness", "suites", "scripts", "plugins", "reference_runtime")
        for path in sorted((root / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if opened_directly.search(line) and path.name != "counting.py"
    ]
    assert not offenders, f"torch's profiler opened directly (use harness.graphs.counting.profiler): {offenders}"


def test_a_kernel_floor_retakes_a_profile_that_saw_no_device(monkeypatch):
    from harness.graphs import counting

    profiles = iter([{}, {}, {"gemm": [3.0, 4.0], "copy": [1.0]}])
    monkeypatch.setattr(counting, "kernel_times_us", lambda fn: (fn(), next(profiles))[1])
    ran = []
    assert counting.kernel_time_us(lambda: ran.append(1)) == 8.0 and len(ran) == 3
    monkeypatch.setattr(counting, "kernel_times_us", lambda fn: {})
    assert counting.kernel_time_us(lambda: None) is None  # not a floor of 0


def test_steps_in_a_stream_are_timed_per_step_behind_a_first_untimed_one(monkeypatch):
    # harness.reports.timing.in_a_stream_ms: the benchmark lane's "in a stream" figure and the step breakdown's.
    # A stand-in for CUDA events that reads the host clock: each step "runs" while the host sleeps.
    import time

    from harness.reports.timing import in_a_stream_ms

    events = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = time.perf_counter()
            events.append("record")

        def synchronize(self):
            events.append("wait")

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3

    def step():
        first = not events or events[-1] == "sync"
        events.append("step")
        time.sleep(0.05 if first else 0.002)  # the first of a run fills the queue: slow, and not counted

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    per_step = in_a_stream_ms(step, steps=4, repeats=3)
    assert events == (["sync", "step", "record"] + ["step"] * 4 + ["record", "wait"]) * 3
    assert 2.0 <= per_step < 10.0  # milliseconds per timed step: neither per run of four nor the first step's




def test_most_keeps_the_largest_count_of_each_field():
    """A count that saw fewer launches than another of the same call (a profile that missed some)
    never decides: the larger is kept, field by field."""
    from harness.graphs import counting

    x, calls = torch.ones(4), []

    def fn():
        calls.append(1)
        for _ in range(3 if len(calls) == 2 else 1):  # the second call does more
            x.add(1)

    counted = counting.most(fn, "cpu")
    assert len(calls) == 2
    assert counted.kernels == counting.count(lambda: [x.add(1) for _ in range(3)], "cpu").kernels == 3
    assert counted.graphs == 0 and counted.ops_in_graphs == 0
    assert counted.launch_calls is None  # the profiler's API breakdown is CUDA's alone


def test_a_cuda_count_reads_launches_by_api_and_copies_from_the_profile(monkeypatch):
    """The CUDA count's figures from the profiler's host events (a stand-in profile here): kernels are
    the kernel-launch calls of every API, graphs the graph launches, copies the memcpy calls."""
    from types import SimpleNamespace

    from harness.graphs import counting

    names = ["cudaLaunchKernel"] * 3 + ["cuLaunchKernelEx"] * 2 + ["cudaGraphLaunch", "cudaMemcpyAsync", "aten::add"]

    class Profile:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return [SimpleNamespace(name=name, thread=7) for name in names]

    monkeypatch.setattr(counting, "profiler", lambda *activities: Profile())
    monkeypatch.setattr(counting.torch.cuda, "synchronize", lambda: None)
    counted = counting.count(lambda: None, "cuda")
    assert (counted.kernels, counted.graphs, counted.copies) == (5, 1, 1)
    assert counted.launch_calls == {"cudaLaunchKernel": 3, "cuLaunchKernelEx": 2, "cudaGraphLaunch": 1, "threads": 1}


def test_most_keeps_each_counts_launch_calls(monkeypatch):
    """On CUDA each count's launch calls by API are kept, one dict a count: what tells a launch
    recorded through two APIs from two launches."""
    from harness.graphs import counting

    seen = iter([counting.Submissions(115, 0, 21, launch_calls={"cudaLaunchKernel": 115, "threads": 1}),
                 counting.Submissions(230, 0, 21, launch_calls={"cudaLaunchKernel": 115, "cuLaunchKernel": 115,
                                                                "threads": 1})])
    monkeypatch.setattr(counting, "count", lambda fn, device: next(seen))
    counted = counting.most(lambda: None, "cuda")
    assert counted.kernels == 230
    assert counted.launch_calls == [{"cudaLaunchKernel": 115, "threads": 1},
                                    {"cudaLaunchKernel": 115, "cuLaunchKernel": 115, "threads": 1}]
