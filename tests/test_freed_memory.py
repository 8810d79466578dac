"""Memory a graph uses but did not allocate (harness/graphs/held.py): freed or moved by the program
after the capture, a replay raises FreedMemoryError naming the tensor and the capture, on the
emulator always and on CUDA under `watch_memory`; memory the program still holds, through any
tensor, replays as before.

Expected outcomes come from what CUDA's caching allocator does (a freed block goes to the next
allocation; the graph keeps only the address), never from the emulator under test.
"""
from __future__ import annotations

import gc

import pytest
import torch

from harness.graphs import FreedMemoryError, emulator, held, make_backend

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA half runs on a GPU machine")


def capture_with_a_workspace(cg, device="cpu"):
    """A graph that stages x through a workspace the program owns (allocated before the capture)."""
    owner = {"workspace": torch.zeros(4, device=device)}
    x = torch.ones(4, device=device)

    def step():
        workspace = owner["workspace"]
        workspace.copy_(x * 2)
        return workspace + 1
    step()
    graph = cg.CUDAGraph(name="step with a workspace") if cg is emulator else cg.CUDAGraph()
    with cg.graph(graph):
        out = step()
    return graph, out, owner, x


def test_a_replay_over_freed_memory_names_the_tensor_and_the_capture():
    graph, out, owner, x = capture_with_a_workspace(emulator)
    graph.replay()
    assert out.tolist() == [3.0] * 4
    owner["workspace"] = torch.zeros(8)  # grown after the capture: the captured one is freed
    with pytest.raises(FreedMemoryError) as raised:
        graph.replay()
    message = str(raised.value)
    for words in ("graph 'step with a workspace'", "float32 (4,)", "aten.copy_", "test_freed_memory.py:",
                  "in step (`workspace.copy_(x * 2)`)", "was freed after the capture"):
        assert words in message, message


def test_memory_moved_in_place_is_named_as_moved():
    graph, _, owner, _ = capture_with_a_workspace(emulator)
    owner["workspace"].resize_(1 << 16)
    with pytest.raises(FreedMemoryError, match="resized or moved after the capture"):
        graph.replay()


def test_memory_held_through_any_tensor_replays():
    graph, out, owner, x = capture_with_a_workspace(emulator)
    view = owner.pop("workspace")[1:]  # the name is gone, a view keeps the memory
    x.fill_(2.0)
    graph.replay()
    assert out.tolist() == [5.0] * 4 and view.tolist() == [4.0] * 3


def test_memory_two_graphs_share_is_the_programs_until_it_frees_it():
    """Each graph's own references are the harness's, not the program's: two graphs over one workspace
    still see it freed when the program drops it, and a graph that dies gives its references back."""
    first, _, owner, x = capture_with_a_workspace(emulator)
    second = emulator.CUDAGraph(name="second")
    with emulator.graph(second):
        owner["workspace"].mul_(x)
    first.replay(), second.replay()
    key = owner["workspace"].untyped_storage()._cdata
    del first
    gc.collect()
    second.replay()
    assert held._HELD[key][2] == 1  # one graph watches it now
    del owner["workspace"]
    with pytest.raises(FreedMemoryError, match="graph 'second'"):
        second.replay()


def test_the_cuda_debug_mode_watches_without_a_gpu():
    """The watcher the CUDA backend captures under, on CPU tensors: it notes what the ops used that
    they did not allocate, and the check raises once the program frees it."""
    outside = held.Outside("watched")
    owner, x = {"workspace": torch.ones(4)}, torch.ones(4)
    with held.Watcher(outside):
        made = x * owner["workspace"]
        made + 1  # what the capture allocated is not the program's to free
    assert len(outside.storages) == 2  # x and the workspace
    outside.check()
    owner["workspace"] = torch.ones(8)
    with pytest.raises(FreedMemoryError, match=r"graph .watched.: a tensor .*\(`made = x \* owner"):
        outside.check()


@CUDA
def test_the_cuda_backend_raises_under_watch_memory():
    backend = make_backend("cuda", "cuda", watch_memory=True)
    owner, x = {"workspace": torch.zeros(4, device="cuda")}, torch.ones(4, device="cuda")

    def step():
        owner["workspace"].copy_(x * 2)
        return owner["workspace"] + 1
    step()
    graph = backend.capture(step, static_inputs={"x": x}, name="workspace step")
    graph.replay({"x": x})
    assert graph.output.tolist() == [3.0] * 4
    owner["workspace"] = torch.zeros(8, device="cuda")
    with pytest.raises(FreedMemoryError, match="graph 'workspace step'.*freed after the capture"):
        graph.replay({"x": x})


@CUDA
def test_the_cuda_backend_without_watch_memory_replays_over_the_freed_memory():
    """What CUDA does by default, for the record: no error (the replay uses whatever the memory holds)."""
    backend = make_backend("cuda", "cuda")
    owner, x = {"workspace": torch.zeros(4, device="cuda")}, torch.ones(4, device="cuda")
    step = lambda: owner["workspace"].copy_(x * 2) + 1  # noqa: E731
    step()
    graph = backend.capture(step, static_inputs={"x": x}, name="unwatched")
    owner["workspace"] = torch.zeros(8, device="cuda")
    graph.replay({"x": x})
    torch.cuda.synchronize()
