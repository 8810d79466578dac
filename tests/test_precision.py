"""Declared precision (Capabilities.precision) and the numerical anchor's tolerance rule
(harness.expectations.anchor.tolerance, docs/spec.md section 10).

- The rule holds against the arithmetic it describes: transformers' own forward with every matrix
  product's inputs rounded to TF32, or run in bfloat16 or float16, lies within the tolerance of
  that precision and (the reduced ones) beyond IEEE's.
- A runtime declaring IEEE whose products round to TF32 is caught by the anchor, and the failure
  names the declaration; the same arithmetic declared as TF32 passes.
- A declaration the harness does not know is refused when the runtime loads; a runtime that computes
  in a dtype is built in it.
"""
from __future__ import annotations

import pytest
import torch

from harness.expectations import anchor as anchor_module
from harness.expectations import presets
from harness.protocol import Capabilities
from harness.runtime import registry
from harness.runtime.factory import EngineFactory
from harness.expectations.emulated_precision import TF32Products, round_to_tf32
from tests.broken_precision import DeclaresIeeeComputesTf32
from tests.catching import assert_caught, run_suites

PRESET = "tiny"
ONE_MODE = "test_numerical_anchor.py::test_every_step_matches_transformers[{name}-FULL_AND_PIECEWISE]"


@pytest.fixture(scope="module")
def forward():
    """(ieee logits, tf32 logits, bfloat16 logits, float16 logits, the anchor's scale) over one sequence."""
    checkpoint = str(presets.checkpoint(PRESET))
    anchor = anchor_module.Anchor(checkpoint)
    ids = torch.tensor([[1 + (11 * i) % 250 for i in range(40)]])
    with torch.inference_mode():
        ieee = anchor.model(input_ids=ids).logits[0]
        with TF32Products():
            tf32 = anchor.model(input_ids=ids).logits[0]
        reduced = {dtype: presets.seeded_model(PRESET).to(dtype)(input_ids=ids).logits[0].float()
                   for dtype in (torch.bfloat16, torch.float16)}
    return ieee, tf32, reduced[torch.bfloat16], reduced[torch.float16], anchor.scale


def test_tf32_rounding_keeps_ten_mantissa_bits_and_rounds_to_nearest_even():
    x = torch.tensor([1 + 2 ** -11, 1 + 2 ** -10 + 2 ** -11, 1 + 2 ** -12, -3.14159265, float("inf")])
    assert round_to_tf32(x).tolist() == [1.0, 1 + 2 ** -9, 1.0, -3.140625, float("inf")]


@pytest.mark.parametrize("precision,index", [("tf32", 1), ("bfloat16", 2), ("float16", 3)])
def test_the_rule_covers_the_arithmetic_it_describes(forward, precision, index):
    ieee, scale = forward[0], forward[4]
    difference = float((forward[index] - ieee).abs().max())
    assert difference <= anchor_module.tolerance(precision, PRESET, scale).value
    assert difference > anchor_module.tolerance("ieee", PRESET, scale).value  # the IEEE tolerance would catch it


def test_tolerances_order_as_the_precisions_and_grow_with_the_model():
    values = [anchor_module.tolerance(p, "small", 1.0).value for p in ("ieee", "tf32", "bfloat16")]
    assert values == sorted(values)
    assert anchor_module.tolerance("tf32", "small", 1.0).value > anchor_module.tolerance("tf32", "tiny", 1.0).value
    assert anchor_module.tolerance("tf32", "small", 2.0).value == pytest.approx(
        2 * anchor_module.tolerance("tf32", "small", 1.0).value)
    with pytest.raises(ValueError, match="unknown precision 'fp32'"):
        anchor_module.tolerance("fp32", "small", 1.0)


@pytest.mark.parametrize("mutant", ["DeclaresIeeeComputesTf32"])  # the catch table's row (tests/conftest.py)
def test_a_runtime_declaring_ieee_that_computes_tf32_is_caught_by_the_anchor(pytester, record_property, mutant):
    assert_caught(pytester, record_property, f"tests.broken_precision:{mutant}",
                  DeclaresIeeeComputesTf32.__doc__, [ONE_MODE.format(name=DeclaresIeeeComputesTf32.name)],
                  {"test_numerical_anchor.py"}, mentions=("declared precision 'ieee'", "Capabilities.precision"))


def test_the_same_arithmetic_declared_as_tf32_passes(pytester):
    report = run_suites(pytester, "tests.broken_precision:DeclaresTf32ComputesTf32",
                        [ONE_MODE.format(name="declares-tf32-computes-tf32")])
    assert [t["outcome"] for t in report["tests"]] == ["passed"]
    assert report["capabilities"]["precision"] == "tf32"


def test_an_unknown_precision_is_refused_when_the_runtime_loads():
    class Runtime:
        name, version = "fp32-runtime", "1"
        capabilities = Capabilities(execution=True, precision="fp32")

    with pytest.raises(registry.RuntimeLoadError, match="precision='fp32'.*'ieee', 'tf32', 'bfloat16', 'float16'"):
        registry.check(Runtime(), "fp32-runtime")


@pytest.mark.parametrize("precision,dtype", [("ieee", "float32"), ("tf32", "float32"), ("bfloat16", "bfloat16"),
                                             ("float16", "float16")])
def test_an_engine_is_built_in_the_dtype_its_precision_names(precision, dtype):
    class Runtime:
        name, version = "any", "1"
        capabilities = Capabilities(execution=True, graph_backends=("emulated",), precision=precision)

    assert EngineFactory(Runtime(), "emulated").config().dtype == dtype
    assert EngineFactory(Runtime(), "emulated", dtype="float32").config().dtype == "float32"  # asked for: kept
