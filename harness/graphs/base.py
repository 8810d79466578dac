"""The graph backend interface, shared by the real CUDA backend and the CPU emulator (SPEC 6).

A backend captures a callable once and replays it many times. Replay reads and writes the
addresses captured, so callers copy new data into the static input buffers; the address check
here makes a replaced buffer fail loudly instead of silently computing on stale memory.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch


class CaptureError(RuntimeError):
    """Something that cannot be captured: a CPU sync, a data-dependent shape, a late capture."""


class StaleAddressError(RuntimeError):
    """A replay would read a static input from an address other than the captured one."""


class FreedMemoryError(RuntimeError):
    """A replay would use memory the program freed (or moved) after the graph's capture (held.py)."""


@dataclass(frozen=True)
class InputAddress:
    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> InputAddress:
        return cls(tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))

    def __str__(self) -> str:
        return f"{self.data_ptr:#x} (shape {self.shape}, stride {self.stride})"


def record_addresses(graph_name: str, static_inputs: Mapping[str, torch.Tensor]) -> dict[str, InputAddress]:
    for input_name, tensor in static_inputs.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"graph {graph_name!r}: static input {input_name!r} is a {type(tensor).__name__}, not a tensor")
    return {input_name: InputAddress.of(tensor) for input_name, tensor in static_inputs.items()}


def check_addresses(graph_name: str, captured: Mapping[str, InputAddress], inputs: Mapping[str, torch.Tensor]) -> None:
    """Raise StaleAddressError unless every captured input is supplied at its captured address.

    Only data_ptr decides: the graph reads its captured extent from that address, so a caller
    relying on a prefix slice of the same buffer is fine; shape and stride are shown to help.
    """
    advice = "inputs must be copied into the captured static buffers (buffer.copy_(new)), never replaced"
    unknown = sorted(set(inputs) - set(captured))
    if unknown:
        raise StaleAddressError(
            f"graph {graph_name!r}: input {unknown[0]!r} was not a static input at capture "
            f"(captured inputs: {sorted(captured)}); {advice}"
        )
    for input_name, at_capture in captured.items():
        if input_name not in inputs:
            raise StaleAddressError(
                f"graph {graph_name!r}: static input {input_name!r} captured at {at_capture} was not "
                f"supplied to replay, so its address cannot be checked; {advice}"
            )
        now = InputAddress.of(inputs[input_name])
        if now.data_ptr != at_capture.data_ptr:
            raise StaleAddressError(
                f"graph {graph_name!r}: static input {input_name!r} is now at {now} but was captured at "
                f"{at_capture}; replay would compute on the old memory; {advice}"
            )


class CapturedGraph(ABC):
    """One captured graph. `output` is what the captured callable returned, at fixed addresses,
    and is overwritten by every replay."""

    num_ops: int | None = None  # operations one replay submits, where the backend knows it

    def __init__(self, backend: GraphBackend, name: str, output: Any, input_addresses: dict[str, InputAddress]):
        self.name = name
        self.output = output
        self._backend = backend
        self._input_addresses = input_addresses
        self._addresses_checked = False

    def replay(self, inputs: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]] | None = None) -> None:
        """Submit the captured work once. `inputs`, the static inputs by name (or a function that
        returns them, called only when they are checked), are checked against the captured
        addresses on the first replay that names them (as vLLM does) and on every one in debug."""
        if inputs is not None and (self._backend.debug or not self._addresses_checked):
            check_addresses(self.name, self._input_addresses, inputs() if callable(inputs) else inputs)
            self._addresses_checked = True
        self._launch()

    @abstractmethod
    def _launch(self) -> None:
        """Submit the captured work once."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} backend={self._backend.name} num_ops={self.num_ops}>"


class GraphBackend(ABC):
    """Captures callables into graphs; owns the capture phase and the memory pool."""

    name: str

    def __init__(self, debug: bool = False):
        self.debug = debug  # check input addresses on every replay, not only the first
        self.capturing = False
        self._capture_phase_closed = False

    def capture(
        self, fn: Callable[[], Any], *, static_inputs: Mapping[str, torch.Tensor], name: str = ""
    ) -> CapturedGraph:
        if self._capture_phase_closed:
            raise CaptureError(
                f"capture after the capture phase was closed (graph {name!r}): every graph must be "
                f"captured before serving starts"
            )
        if self.capturing:
            raise CaptureError(f"capture of graph {name!r} started inside another capture")
        input_addresses = record_addresses(name, static_inputs)
        self.capturing = True
        try:
            return self._capture(fn, name, input_addresses)
        finally:
            self.capturing = False

    def close_capture_phase(self) -> None:
        self._capture_phase_closed = True

    @abstractmethod
    def _capture(self, fn: Callable[[], Any], name: str, input_addresses: dict[str, InputAddress]) -> CapturedGraph:
        """Run fn once under capture and return the graph."""

    @abstractmethod
    def pool_stats(self) -> dict:
        """Memory held for graphs; always has "bytes"."""
