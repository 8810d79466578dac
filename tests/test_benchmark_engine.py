"""The benchmark lane builds each engine in the dtype its declared precision names (an engine that
computes in float16 whatever it is asked is not built in bf16 and then failed for its logits' dtype),
and in bf16 where the precision names none."""
from types import SimpleNamespace

import pytest

from harness.runtime.factory import BENCHMARK_ENGINE, benchmark_engine


@pytest.mark.parametrize("precision, dtype", [("ieee", "bfloat16"), ("tf32", "bfloat16"),
                                              ("bfloat16", "bfloat16"), ("float16", "float16")])
def test_the_bench_engine_takes_the_dtype_the_precision_names(precision, dtype):
    runtime = SimpleNamespace(capabilities=SimpleNamespace(precision=precision))
    built = benchmark_engine(runtime)
    assert built["dtype"] == dtype
    assert {k: v for k, v in built.items() if k != "dtype"} == {k: v for k, v in BENCHMARK_ENGINE.items() if k != "dtype"}
