"""BatchDescriptor keys and the dispatcher: which graph, if any, runs a batch (SPEC 4; V1 and V2
runners, docs/runners.md)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from .config import PolicyConfig
from .lora import effective_active_loras, lora_cases
from .modes import RUNTIME_MODES, CUDAGraphMode
from .padding import PaddingTable
from .sizes import capture_sizes
from .speculation import decode_tiers


ALL_RUNTIME_MODES = frozenset(RUNTIME_MODES)


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of one captured graph, at its padded sizes. num_padded_rows is None on relaxed (PIECEWISE) keys."""

    num_padded_tokens: int
    num_padded_rows: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0

    def relaxed(self) -> "BatchDescriptor":
        """The key a PIECEWISE graph answers to: any request count, any batch kind."""
        return replace(self, num_padded_rows=None, uniform=False)


class Dispatcher:
    """Holds the valid keys per runtime mode and picks FULL > PIECEWISE > NONE for a batch."""

    def __init__(self, config: PolicyConfig, mode: CUDAGraphMode | str | None = None, *, piecewise_capture: bool = True):
        self.config = config
        self.mode = CUDAGraphMode.parse(mode if mode is not None else config.mode)
        # vLLM's CudagraphDispatcher refuses an unresolved mode whose pieces cannot exist.
        if self.mode.has_piecewise() and not piecewise_capture:
            raise ValueError(f"mode {self.mode.name} needs piecewise graphs, but none can be captured (no piecewise "
                             "compilation); resolve the mode first (resolve_mode drops the pieces)")
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
            for q in self.decode_query_lens:
                for size in self._decode_sizes(q):
                    for loras in cases:
                        self.add_key(CUDAGraphMode.FULL, BatchDescriptor(size, size // q, True, loras > 0, loras))
        # V2 looks keys up per runtime mode and adapter case: the keys at the smallest size that holds
        # the batch (several under dynamic speculative decoding: one per q).
        self.key_at: dict[tuple, list[BatchDescriptor]] = {}
        for mode, keys in self.keys.items():
            for k in sorted(keys, key=lambda k: (k.num_padded_tokens, k.num_padded_rows or 0)):
                self.key_at.setdefault((mode, k.num_active_loras, k.num_padded_tokens), []).append(k)
        self.key_tables = {(mode, loras): PaddingTable([n for m, c, n in self.key_at if (m, c) == (mode, loras)])
                           for mode in self.keys for loras in cases}

    @functools.cached_property
    def decode_query_lens(self) -> list[int]:
        """The q of every uniform-decode graph: the config's, or under V2 with a dynamic speculative
        schedule each 1 + count the schedule gives (vLLM's CudaGraphManager._init_candidates)."""
        if self.config.speculative_schedule is None or not self.config.rules.rounds_decode_keys_to_q:
            return [self.config.query_len]
        return sorted({tier_q for tier_q, _ in decode_tiers(self.config.speculative_schedule,
                                                             self.config.max_num_seqs,
                                                             self.config.num_speculative_tokens)})

    def _decode_sizes(self, q: int) -> list[int]:
        """Token counts of the uniform-decode graphs of q tokens a request: whole requests, at most
        max_num_seqs.

        V1 keeps the sizes that are already multiples of q (they were rounded in sizes.py); V2
        rounds each size up to a multiple of q and keeps those within the max size
        (vLLM's CudaGraphManager._init_candidates).
        """
        most = q * self.config.max_num_seqs
        if not self.config.rules.rounds_decode_keys_to_q:
            return [s for s in self.sizes if q <= s <= most and s % q == 0]
        rounded = {-(-s // q) * q for s in self.sizes}
        return sorted(s for s in rounded if s <= min(most, self.table.max_size))

    def _padded_key(self, num_real_tokens: int, *, uniform: bool, num_active_loras: int) -> BatchDescriptor:
        padded = self.table.padded(num_real_tokens)
        if uniform:
            num_padded_rows = min(padded // self.config.query_len, self.config.max_num_seqs)
        else:
            num_padded_rows = min(padded, self.config.max_num_seqs)
        return BatchDescriptor(padded, num_padded_rows, uniform, num_active_loras > 0, num_active_loras)

    def capture_keys(self) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
        """What to capture, in capture order: PIECEWISE before FULL, largest first."""
        order = []
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            keys = sorted(self.keys[mode], key=lambda k: (-k.num_padded_tokens, k.uniform, k.num_active_loras))
            if keys:
                order.append((mode, keys))
        return order

    # -- dispatch ---------------------------------------------------------------------
    def dispatch(
        self,
        num_real_tokens: int,
        num_real_rows: int | None = None,
        uniform: bool = False,
        num_active_loras: int = 0,
        allowed_modes: frozenset[CUDAGraphMode] = ALL_RUNTIME_MODES,
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """The runtime mode and key for a batch. `uniform` says every request has q tokens.

        V1: the exact FULL key at the padded size, then the relaxed PIECEWISE key, then NONE;
        only the pair modes keep uniform keys (under plain FULL a uniform batch uses the mixed
        FULL keys). V2: the smallest FULL key that holds the batch, if it fits the batch, then the
        smallest PIECEWISE key, then NONE. Above the max size the batch runs eager and unpadded,
        under the trivial key (V1) or a key that keeps the request and adapter counts (V2).
        """
        self._check_batch(num_real_tokens, num_real_rows, uniform)
        return self.lookup(num_real_tokens, num_real_rows, uniform, num_active_loras, allowed_modes)

    def lookup(self, num_real_tokens: int, num_real_rows: int | None, uniform: bool, num_active_loras: int = 0,
               allowed_modes: frozenset[CUDAGraphMode] = ALL_RUNTIME_MODES) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """dispatch() without checking that the counts describe one batch: data-parallel ranks
        re-dispatch their own request count at another rank's token count (data_parallel.py)."""
        loras, rules = effective_active_loras(self.config, num_active_loras), self.config.rules
        if not rules.eager_key_keeps_counts:
            unpadded = BatchDescriptor(num_real_tokens)  # vLLM's trivial key: an eager step is not keyed
        else:
            if num_real_rows is None:  # V2 always knows the count; unsaid, it is the most the batch can hold
                num_real_rows = num_real_tokens // self.config.query_len if uniform else min(num_real_tokens, self.config.max_num_seqs)
            unpadded = BatchDescriptor(num_real_tokens, num_real_rows, False, loras > 0, loras)
        if (
            not self.keys_initialized
            or self.mode is CUDAGraphMode.NONE
            or num_real_tokens > self.table.max_size
            or allowed_modes <= {CUDAGraphMode.NONE}
        ):
            return CUDAGraphMode.NONE, unpadded
        if rules.smallest_key_that_holds:
            batch_q = self._batch_query_len(num_real_tokens, num_real_rows)
            for mode in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
                for key in self._smallest_keys(mode, num_real_tokens, loras) if mode in allowed_modes else ():
                    if _holds(key, batch_q, num_real_rows, uniform):
                        return mode, key
        else:
            key = self._padded_key(num_real_tokens, uniform=uniform and self.mode.separate_routine(), num_active_loras=loras)
            if CUDAGraphMode.FULL in allowed_modes and key in self.keys[CUDAGraphMode.FULL]:
                return CUDAGraphMode.FULL, key
            if CUDAGraphMode.PIECEWISE in allowed_modes and key.relaxed() in self.keys[CUDAGraphMode.PIECEWISE]:
                return CUDAGraphMode.PIECEWISE, key.relaxed()
        if CUDAGraphMode.NONE not in allowed_modes:
            allowed = ", ".join(sorted(m.name for m in allowed_modes))
            raise ValueError(f"no captured graph for {num_real_tokens} tokens among allowed modes {{{allowed}}}, "
                             "and NONE is not allowed")
        return CUDAGraphMode.NONE, unpadded

    def _batch_query_len(self, num_real_tokens: int, num_real_rows: int) -> int:
        """The q a uniform batch's requests bring: the config's, or under a dynamic speculative
        schedule the one of its q's that its counts give (vLLM passes it as uniform_token_count)."""
        for q in self.decode_query_lens[:-1]:
            if num_real_tokens == q * num_real_rows:
                return q
        return self.decode_query_lens[-1]

    def _smallest_keys(self, mode: CUDAGraphMode, num_real_tokens: int, loras: int) -> list[BatchDescriptor]:
        """V2: the keys of `mode` at the smallest size of that mode's keys that holds num_real_tokens."""
        table = self.key_tables.get((mode, loras))
        size = table.padded(num_real_tokens) if table is not None else None
        return [] if size is None else self.key_at[(mode, loras, size)]

    def _check_batch(self, num_real_tokens: int, num_real_rows: int | None, uniform: bool) -> None:
        # More requests than max_num_seqs is a batch vLLM dispatches too (no key holds it: PIECEWISE
        # or eager), so only the counts' own consistency is checked.
        if num_real_tokens < 1:
            raise ValueError(f"num_real_tokens must be >= 1, got {num_real_tokens}")
        if num_real_rows is not None and not 1 <= num_real_rows <= num_real_tokens:
            raise ValueError(f"num_real_rows must be in 1..num_real_tokens = 1..{num_real_tokens}, got {num_real_rows}")
        if uniform and num_real_rows is not None and num_real_tokens not in {num_real_rows * q for q in self.decode_query_lens}:
            qs = "q" if len(self.decode_query_lens) == 1 else f"q in {self.decode_query_lens}"
            raise ValueError(
                f"a uniform decode batch has num_real_tokens = {qs} * num_real_rows = "
                f"{' or '.join(str(q) for q in self.decode_query_lens)} * {num_real_rows}, got num_real_tokens={num_real_tokens}"
            )


def uniform_token_count(query_lens, *, decode_graph_eligible: bool = True) -> int | None:
    """The tokens every request has, where all have the same number; else None (vLLM's
    get_uniform_decode_token_count: only the batch's shape, and a batch with a prompt chunk is
    not eligible for a decode graph however it is shaped)."""
    lens = list(query_lens)
    if not lens or not decode_graph_eligible:
        return None
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lens):
        raise ValueError(f"query lengths are integers >= 1 (tokens a request brings this step), got {lens}")
    longest = max(lens)
    return longest if sum(lens) == longest * len(lens) else None


def prompt_step_runs_as_decode(new_prompt_tokens: int, computed_prompt_tokens: int) -> bool:
    """V2: a request still in its prompt computes like a decode when it brings one new prompt token
    over context it already has (a prompt tail, maybe padded with placeholder drafts); a fresh prompt
    or a longer chunk does not (vLLM's gather_batch_req_state)."""
    return new_prompt_tokens == 1 and computed_prompt_tokens > 0


def is_uniform_decode(query_lens, query_len: int, *, has_prefill: bool = False, runner: str = "v2") -> bool:
    """Whether a batch takes the uniform-decode routine: every request brings q tokens.

    V1 (GPUModelRunner._is_uniform_decode) looks only at the shape; V2 also refuses a batch where a
    request computes a prompt chunk that does not run as a decode (`has_prefill`; see
    prompt_step_runs_as_decode), since a decode graph would not compute its prompt. `uniform` in dispatch() stays an
    override, as vLLM's force_uniform_decode is at capture.
    """
    count = uniform_token_count(query_lens, decode_graph_eligible=runner == "v1" or not has_prefill)
    return count == query_len


def _holds(key: BatchDescriptor, batch_query_len: int, num_real_rows: int, uniform: bool) -> bool:
    """V2's compatibility test: a uniform-decode key takes only uniform batches of its own q, and a
    key with a request count takes at most that many requests."""
    if key.uniform and not (uniform and key.num_padded_tokens == batch_query_len * key.num_padded_rows):
        return False
    return key.num_padded_rows is None or key.num_padded_rows >= num_real_rows
