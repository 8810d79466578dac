"""Without CUDA the compile runtime declares no execution, and every suite skips with a reason."""
import pytest

pytest.importorskip("cudagraph_torch_compile", reason="plugins/torch-compile is not installed")
torch = pytest.importorskip("torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_no_cuda_no_execution():
    from cudagraph_torch_compile.runtime import ReferenceCompile

    runtime = ReferenceCompile()
    assert not runtime.capabilities.execution and runtime.capabilities.graph_backends == ()
    assert "no CUDA device" in runtime.capabilities.notes
