"""Bit-equality of tensors: `torch.equal` on the raw values, NaN compared by bit pattern."""
from __future__ import annotations

import torch


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point():
        return False
    # NaN != NaN under torch.equal; compare those positions by their bits instead.
    nan = torch.isnan(a) | torch.isnan(b)
    if not nan.any():
        return False
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    """The largest |actual - expected|, inf where a value became NaN or infinite that was not
    (so a known-failure bound on the difference cannot cover a NaN); None where shapes differ."""
    if actual.shape != expected.shape:
        return None
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    diff = (a - e).abs()
    diff[(a == e) | (torch.isnan(a) & torch.isnan(e))] = 0.0  # equal infinities, NaN against NaN
    if not bool(torch.isfinite(diff).all()):
        return float("inf")
    return float(diff.max()) if diff.numel() else 0.0


def first_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when bit-equal; else where and how they first differ, for a failure message."""
    if not isinstance(actual, torch.Tensor):
        return f"got a {type(actual).__name__}, not a tensor"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if same_bits(actual, expected):
        return None
    a, e = actual.detach().cpu(), expected.detach().cpu()
    differ = (a != e) & ~(torch.isnan(a) & torch.isnan(e)) if a.is_floating_point() else a != e
    index = tuple(int(i) for i in differ.nonzero()[0])
    return (f"{int(differ.sum())} of {a.numel()} elements differ; first at {index}: "
            f"got {a[index].item()!r}, expected {e[index].item()!r}; "
            f"largest difference {largest_difference(actual, expected):.3g}")
