"""The harness's torch dispatch modes (the emulator's recorder, the CPU op counter), without
importing dynamo where nothing can compile.

torch keeps dynamo from tracing a dispatch mode by wrapping its `__torch_dispatch__`; the wrapper
imports dynamo on the first op, in a process that may never need it, and costs every op a call.
Only compiled code can bring dynamo into a mode's ops, and compiling loads dynamo first. So a mode
here is `HarnessMode`, which opts out of the wrapping (torch's own switch, described in
TorchDispatchMode's docstring), and `enter(cls, ...)` makes the wrapped kind instead wherever
dynamo is loaded.
"""
from __future__ import annotations

import functools
import sys

from torch.utils._python_dispatch import TorchDispatchMode


class HarnessMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


@functools.lru_cache(maxsize=None)
def _outside_dynamo(cls: type) -> type:
    """cls, its __torch_dispatch__ kept out of dynamo's tracing as torch wraps it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return cls.__torch_dispatch__(self, func, types, args, kwargs)

    return type(f"{cls.__name__}OutsideDynamo", (cls,), {
        "_should_skip_dynamo": classmethod(lambda _: True), "__torch_dispatch__": __torch_dispatch__,
        "__module__": cls.__module__, "__doc__": cls.__doc__})


def make(cls: type, *args, **kwargs) -> HarnessMode:
    """An instance of the mode class cls, wrapped as torch wraps modes where dynamo is loaded."""
    return (_outside_dynamo(cls) if "torch._dynamo" in sys.modules else cls)(*args, **kwargs)
