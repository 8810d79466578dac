"""A runtime whose arithmetic is not what it declares: the reference runtime, declaring IEEE float32
(`Capabilities.precision="ieee"`), whose every matrix product rounds its float32 inputs to TF32
first, as Triton's `tl.dot` and cuBLAS with `allow_tf32` do on a GPU. The numerical anchor must
hold it to the IEEE tolerance and fail it (tests/test_precision.py).

The engine runs every call under a torch function mode that does that rounding, so it needs no
change to the reference engine: a third party's runtime whose kernels round, wrapped as shipped.
"""
from __future__ import annotations

from dataclasses import replace

from harness.expectations.emulated_precision import TF32Products
from reference_runtime.adapter import ReferenceRuntime


class _RoundingEngine:
    """The reference engine with every operation run under TF32Products."""

    CALLS = ("capture", "step", "eager_step", "release", "static_buffer_addresses", "kv_snapshot", "slot_of",
             "last_step_inputs", "swap_static_buffer")

    def __init__(self, engine):
        self._engine = engine
        self.resolution = engine.resolution

    def __getattr__(self, name):
        call = getattr(self._engine, name)
        if name not in self.CALLS:
            return call

        def rounded(*args, **kwargs):
            with TF32Products():
                return call(*args, **kwargs)
        return rounded


class DeclaresIeeeComputesTf32(ReferenceRuntime):
    """Declares IEEE float32 (the reference's declaration), rounds every matrix product's inputs to TF32."""

    name = "declares-ieee-computes-tf32"

    def build(self, config):
        with TF32Products():
            return _RoundingEngine(super().build(config))


class DeclaresTf32ComputesTf32(DeclaresIeeeComputesTf32):
    """Not broken: the same arithmetic, declared for what it is (TF32): held to the TF32 tolerance, it passes."""

    name = "declares-tf32-computes-tf32"
    capabilities = replace(ReferenceRuntime.capabilities, precision="tf32")
