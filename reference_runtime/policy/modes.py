"""Graph modes and attention-backend support levels (SPEC 2 and 5).

A *config* mode is what the user asks for; it is a pair of routines
(decode routine, mixed routine). A *runtime* mode is what one step runs:
NONE, PIECEWISE or FULL only.
"""
from __future__ import annotations

import enum


class CUDAGraphMode(enum.Enum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"

    @classmethod
    def parse(cls, name: str | "CUDAGraphMode") -> "CUDAGraphMode":
        if isinstance(name, cls):
            return name
        try:
            return cls[str(name).strip().upper()]
        except KeyError:
            valid = ", ".join(m.name for m in cls)
            raise ValueError(f"unknown graph mode {name!r}; expected one of: {valid}") from None

    @property
    def routines(self) -> tuple["CUDAGraphMode", "CUDAGraphMode"]:
        """(decode routine, mixed routine)."""
        return _ROUTINES[self]

    def decode_mode(self) -> "CUDAGraphMode":
        return self.routines[0]

    def mixed_mode(self) -> "CUDAGraphMode":
        return self.routines[1]

    def separate_routine(self) -> bool:
        """True for the pair modes, where uniform decode has a routine of its own."""
        return self in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE)

    def has_full(self) -> bool:
        return CUDAGraphMode.FULL in self.routines

    def has_piecewise(self) -> bool:
        return CUDAGraphMode.PIECEWISE in self.routines


_ROUTINES = {
    CUDAGraphMode.NONE: (CUDAGraphMode.NONE, CUDAGraphMode.NONE),
    CUDAGraphMode.PIECEWISE: (CUDAGraphMode.PIECEWISE, CUDAGraphMode.PIECEWISE),
    CUDAGraphMode.FULL: (CUDAGraphMode.FULL, CUDAGraphMode.FULL),
    CUDAGraphMode.FULL_DECODE_ONLY: (CUDAGraphMode.FULL, CUDAGraphMode.NONE),
    CUDAGraphMode.FULL_AND_PIECEWISE: (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE),
}

RUNTIME_MODES = (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)

# Order used by data-parallel consensus: ranks agree on the lowest.
RUNTIME_MODE_RANK = {CUDAGraphMode.NONE: 0, CUDAGraphMode.PIECEWISE: 1, CUDAGraphMode.FULL: 2}

class AttentionCGSupport(enum.IntEnum):
    """How much of a batch an attention backend can run inside a captured graph.

    Higher is stronger. A model with several backends takes the weakest (min).
    """

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3

    @classmethod
    def parse(cls, name: str | "AttentionCGSupport") -> "AttentionCGSupport":
        if isinstance(name, cls):
            return name
        key = str(name).strip().upper()
        key = {"USTD": "UNIFORM_SINGLE_TOKEN_DECODE"}.get(key, key)
        try:
            return cls[key]
        except KeyError:
            valid = ", ".join(m.name for m in cls)
            raise ValueError(f"unknown attention graph support {name!r}; expected one of: {valid} (or USTD)") from None


def weakest_support(levels) -> AttentionCGSupport:
    """The support level of a model with several attention backends."""
    levels = [AttentionCGSupport.parse(level) for level in levels]
    if not levels:
        raise ValueError("a model needs at least one attention backend to resolve graph support")
    return min(levels)
