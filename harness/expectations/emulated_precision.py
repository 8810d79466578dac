"""Reduced-precision arithmetic emulated on the CPU, for checking the anchor's tolerance rule
(scripts/precision_calibration.py) and for the self-tests' runtime that rounds where it declares
IEEE (tests/broken_precision.py).

TF32 keeps float32's 8 exponent bits and 10 of its 23 mantissa bits: rounding a matrix product's
float32 inputs to the nearest TF32 value (ties to even) and multiplying and adding in float32 is
what tensor cores compute for Triton's default float32 `tl.dot` and for cuBLAS with `allow_tf32`.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

DROPPED_BITS = 13  # float32 mantissa bits TF32 does not keep
MATRIX_PRODUCTS = {torch.nn.functional.linear, torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm,
                   torch.einsum, torch.Tensor.__matmul__, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm}


def round_to_tf32(x):
    """The nearest TF32 value of every element of a float32 tensor (ties to even); anything else unchanged."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    keep = (bits >> DROPPED_BITS) & 1  # the last kept bit: ties round to make it even
    half = (1 << (DROPPED_BITS - 1)) - 1
    return ((bits + half + keep) & ~((1 << DROPPED_BITS) - 1)).view(torch.float32).view_as(x)


class TF32Products(TorchFunctionMode):
    """Matrix products round their float32 inputs to TF32; everything else runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in MATRIX_PRODUCTS:
            args = tuple(round_to_tf32(a) for a in args)
        return func(*args, **(kwargs or {}))
