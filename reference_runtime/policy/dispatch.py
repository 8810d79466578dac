"""BatchDescriptor keys and the dispatcher: which graph, if any, runs a batch (SPEC 4)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import PolicyConfig
from .lora import effective_active_loras, lora_cases
from .modes import RUNTIME_MODES, CUDAGraphMode
from .padding import PaddingTable
from .sizes import capture_sizes


ALL_RUNTIME_MODES = frozenset(RUNTIME_MODES)


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of one captured graph. num_reqs is None on relaxed (PIECEWISE) keys."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0

    def relaxed(self) -> "BatchDescriptor":
        """The key a PIECEWISE graph answers to: any request count, any batch kind."""
        return replace(self, num_reqs=None, uniform=False)


class Dispatcher:
    """Holds the valid keys per runtime mode and picks FULL > PIECEWISE > NONE for a batch."""

    def __init__(self, config: PolicyConfig, mode: CUDAGraphMode | str | None = None):
        self.config = config
        self.mode = CUDAGraphMode.parse(mode if mode is not None else config.mode)
        self.keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.FULL: set(),
            CUDAGraphMode.PIECEWISE: set(),
        }
        self.keys_initialized = False
        self.sizes: list[int] = []
        self.table: PaddingTable | None = None

    # -- keys -------------------------------------------------------------------------
    def add_key(self, runtime_mode: CUDAGraphMode, key: BatchDescriptor) -> None:
        if runtime_mode not in self.keys:
            valid = ", ".join(m.name for m in self.keys)
            raise ValueError(f"graphs are keyed only for runtime modes {valid}, not {runtime_mode.name}")
        self.keys[runtime_mode].add(key)

    def initialize_keys(self) -> None:
        self.keys_initialized = True
        if self.mode is CUDAGraphMode.NONE:
            return
        self.sizes = capture_sizes(replace(self.config, mode=self.mode))
        self.table = PaddingTable(self.sizes)
        cases = lora_cases(self.config)
        mixed = self.mode.mixed_mode()
        if mixed is not CUDAGraphMode.NONE:
            for size in self.sizes:
                for loras in cases:
                    key = self._padded_key(size, uniform=False, num_active_loras=loras)
                    self.add_key(mixed, key.relaxed() if mixed is CUDAGraphMode.PIECEWISE else key)
        if self.mode.decode_mode() is CUDAGraphMode.FULL and self.mode.separate_routine():
            q = self.config.query_len
            for size in self.sizes:
                if q <= size <= q * self.config.max_num_seqs and size % q == 0:
                    for loras in cases:
                        self.add_key(CUDAGraphMode.FULL, self._padded_key(size, uniform=True, num_active_loras=loras))

    def _padded_key(self, num_tokens: int, *, uniform: bool, num_active_loras: int) -> BatchDescriptor:
        padded = self.table.padded(num_tokens)
        if uniform:
            num_reqs = min(padded // self.config.query_len, self.config.max_num_seqs)
        else:
            num_reqs = min(padded, self.config.max_num_seqs)
        return BatchDescriptor(padded, num_reqs, uniform, num_active_loras > 0, num_active_loras)

    def capture_keys(self) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
        """What to capture, in capture order: PIECEWISE before FULL, largest first."""
        order = []
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            keys = sorted(self.keys[mode], key=lambda k: (-k.num_tokens, k.uniform, k.num_active_loras))
            if keys:
                order.append((mode, keys))
        return order

    # -- dispatch ---------------------------------------------------------------------
    def dispatch(
        self,
        num_tokens: int,
        num_reqs: int | None = None,
        uniform: bool = False,
        num_active_loras: int = 0,
        allowed_modes: frozenset[CUDAGraphMode] = ALL_RUNTIME_MODES,
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """The runtime mode and key for a batch: exact FULL key, then relaxed PIECEWISE key, then NONE.

        `uniform` says every request has q tokens. Only the pair modes keep uniform keys; under
        plain FULL a uniform batch uses the mixed FULL keys. Above the max size the batch runs
        eager and unpadded, under the trivial key BatchDescriptor(num_tokens).
        """
        self._check_batch(num_tokens, num_reqs, uniform)
        unpadded = BatchDescriptor(num_tokens)  # vLLM's trivial key: an eager step is not keyed
        if (
            not self.keys_initialized
            or self.mode is CUDAGraphMode.NONE
            or num_tokens > self.table.max_size
            or allowed_modes <= {CUDAGraphMode.NONE}
        ):
            return CUDAGraphMode.NONE, unpadded
        loras = effective_active_loras(self.config, num_active_loras)
        key = self._padded_key(num_tokens, uniform=uniform and self.mode.separate_routine(), num_active_loras=loras)
        if CUDAGraphMode.FULL in allowed_modes and key in self.keys[CUDAGraphMode.FULL]:
            return CUDAGraphMode.FULL, key
        if CUDAGraphMode.PIECEWISE in allowed_modes and key.relaxed() in self.keys[CUDAGraphMode.PIECEWISE]:
            return CUDAGraphMode.PIECEWISE, key.relaxed()
        if CUDAGraphMode.NONE not in allowed_modes:
            allowed = ", ".join(sorted(m.name for m in allowed_modes))
            raise ValueError(f"no captured graph for {key} among allowed modes {{{allowed}}}, and NONE is not allowed")
        return CUDAGraphMode.NONE, unpadded

    def _check_batch(self, num_tokens: int, num_reqs: int | None, uniform: bool) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if num_reqs is not None and not 1 <= num_reqs <= min(num_tokens, self.config.max_num_seqs):
            raise ValueError(
                f"num_reqs must be in 1..min(num_tokens, max_num_seqs) = "
                f"1..{min(num_tokens, self.config.max_num_seqs)}, got {num_reqs}"
            )
        if uniform and num_reqs is not None and num_tokens != num_reqs * self.config.query_len:
            raise ValueError(
                f"a uniform decode batch has num_tokens = q * num_reqs = {self.config.query_len} * {num_reqs}, "
                f"got num_tokens={num_tokens}"
            )
