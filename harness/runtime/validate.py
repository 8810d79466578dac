"""The protocol boundary: is what a runtime handed back the kind of thing the protocol promises?

Each function returns None when the answer is well formed, else one sentence saying what was
wrong and what was expected. harness.runtime.observe calls them on every answer, for every suite, so a
wrong type fails as a wrong answer with a reason, never as an AttributeError three calls later.
No validator raises: an answer too broken even to inspect (an attribute that raises, a sequence
whose iteration raises) is itself the problem reported.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from harness.reliability.processes import pids  # noqa: F401 (checked where processes are watched)
from harness.reliability.safe import describe_exception, safe_repr
from harness.vocabulary import CONFIG_MODES, PRECISIONS, RUNTIME_MODES, VLLM_RELEASES, parse_rules

ENGINE_OPERATIONS = ("capture", "step", "eager_step", "release", "static_buffer_addresses")  # every Engine has them


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _never_raises(validator):
    @functools.wraps(validator)
    def guarded(value, *args):
        try:
            return validator(value, *args)
        except Exception as exc:  # noqa: BLE001 - the answer is what is broken
            return (f"returned {safe_repr(value)}, which the harness could not even inspect "
                    f"({describe_exception(exc, 300)})")
    return guarded


def declarations(capabilities) -> str | None:
    """The declarations in Capabilities that are values, not switches: each one the harness knows."""
    precision = capabilities.precision
    if precision not in PRECISIONS:
        return (f"Capabilities.precision={safe_repr(precision)} is not one the harness knows; declare one of "
                f"{', '.join(map(repr, PRECISIONS))}: how the engine's float32 matrix products are done (ieee, tf32) "
                "or the dtype it computes in (docs/spec.md section 10)")
    if capabilities.speculative_steps and not (capabilities.speculative and capabilities.execution):
        return ("Capabilities.speculative_steps (engines that run verify steps of q tokens a request) needs "
                "speculative (policies that take num_speculative_tokens > 0) and execution as well")
    kept = capabilities.memory_kept_per_build
    if not _is_int(kept) or kept < 0:
        return (f"Capabilities.memory_kept_per_build={safe_repr(kept)}; declare the device bytes a closed engine "
                "may leave allocated, an int >= 0 (0: close() releases everything)")
    rules = getattr(capabilities, "rules", None)
    try:
        parsed = parse_rules(rules)
    except ValueError as error:
        return f"Capabilities.rules={safe_repr(rules)}: {error}"
    if parsed.family != "vllm":
        return None  # another engine's rules, or its own: held to its own answers
    release = VLLM_RELEASES.get(parsed.release)
    if release is None:
        return (f"Capabilities.rules={rules!r}: {parsed.release!r} is not a vLLM release whose policy the harness "
                f"models; declare one of {', '.join(repr(f'vllm-{v}') for v in VLLM_RELEASES)} (docs/spec.md section 11)")
    if parsed.runner is not None and parsed.runner not in release.runners:
        return (f"Capabilities.rules={rules!r}: the harness models vLLM {parsed.release}'s runner(s) "
                f"{', '.join(release.runners)} only")
    if capabilities.data_parallel and not release.data_parallel:
        return (f"Capabilities.rules={rules!r} with data_parallel: the harness models the "
                f"data-parallel agreement of vLLM {', '.join(v for v, r in VLLM_RELEASES.items() if r.data_parallel)} "
                "only; declare that release, or data_parallel=False")
    return None


@_never_raises
def sizes(value) -> str | None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return f"returned {safe_repr(value)}; expected a list of ints"
    bad = [v for v in value if not _is_int(v) or v < 1]
    return f"returned {safe_repr(value)}; {safe_repr(bad[0])} is not an int >= 1" if bad else None


@_never_raises
def padded_size(value, num_real_tokens: int) -> str | None:
    if value is None:
        return None
    if not _is_int(value):
        return f"returned {safe_repr(value)}; expected an int or None (None: the batch runs eager)"
    if value < num_real_tokens:
        return f"returned {value} for {num_real_tokens} tokens; a padded size holds every real token (>= {num_real_tokens})"
    return None


@_never_raises
def dispatch(value) -> str | None:
    mode = getattr(value, "runtime_mode", None)
    key = getattr(value, "descriptor", None)
    if not isinstance(mode, str) or mode not in RUNTIME_MODES:
        return f"returned {safe_repr(value)}; expected a Dispatch whose runtime_mode is one of {RUNTIME_MODES}"
    tokens, rows = getattr(key, "num_padded_tokens", None), getattr(key, "num_padded_rows", "missing")
    if not _is_int(tokens) or tokens < 1:
        return f"returned {safe_repr(value)}; the descriptor's num_padded_tokens must be an int >= 1"
    if rows is not None and not _is_int(rows):
        return f"returned {safe_repr(value)}; the descriptor's num_padded_rows must be an int or None"
    if not isinstance(getattr(key, "uniform", None), bool):
        return f"returned {safe_repr(value)}; the descriptor's uniform must be a bool"
    return None


@_never_raises
def dispatches(value, count: int) -> str | None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != count:
        return f"returned {safe_repr(value)}; expected a list of {count} Dispatch answers, one per rank"
    return next((problem for problem in map(dispatch, value) if problem), None)


@_never_raises
def resolution(value) -> str | None:
    resolved, warnings = getattr(value, "resolved", None), getattr(value, "warnings", None)
    if not isinstance(resolved, str) or resolved not in CONFIG_MODES:
        return f"returned {safe_repr(value)}; expected a Resolution whose resolved mode is one of {CONFIG_MODES}"
    if isinstance(warnings, str) or not isinstance(warnings, Sequence) or not all(isinstance(w, str) for w in warnings):
        return f"returned {safe_repr(value)}; its warnings must be a tuple of strings"
    return None


@_never_raises
def step_result(value, num_real_tokens: int, vocab: int | None, device: str, dtype: str | None = None) -> str | None:
    """A StepResult of the promised form and kind: logits [num_real_tokens, vocab], dense, floating point,
    on the engine's device, in the engine's dtype (`dtype`, EngineConfig.dtype; float32 too, the
    upcast engines make for sampling), with no NaN (a real token's logits never are)."""
    import torch

    logits = getattr(value, "logits", None)
    if not isinstance(logits, torch.Tensor):
        return f"returned {safe_repr(value)}; expected a StepResult whose logits are a tensor"
    expected_shape = (num_real_tokens, vocab) if vocab else None
    if logits.dim() != 2 or logits.shape[0] != num_real_tokens or (expected_shape and tuple(logits.shape) != expected_shape):
        return (f"returned logits of shape {tuple(logits.shape)}; expected {expected_shape or (num_real_tokens, 'vocab')}: "
                "one row per real token, in request order")
    problem = logits_kind(logits, device, dtype)
    if problem:
        return problem
    mode = getattr(value, "runtime_mode", None)
    if not isinstance(mode, str) or mode not in RUNTIME_MODES:
        return f"reported runtime_mode {safe_repr(mode)}; expected one of {RUNTIME_MODES}"
    if getattr(value, "num_real_tokens", None) != num_real_tokens:
        return f"reported num_real_tokens {safe_repr(getattr(value, 'num_real_tokens', None))} for a batch of {num_real_tokens} tokens"
    padded = getattr(value, "num_padded_tokens", None)
    if not _is_int(padded) or padded < num_real_tokens:
        return f"reported num_padded_tokens {safe_repr(padded)}; expected an int >= the {num_real_tokens} real tokens"
    return nan_rows(logits)


def logits_kind(logits, device: str, dtype: str | None = None) -> str | None:
    """What is wrong with the logits' kind (layout, dtype, device), or None."""
    import torch

    if logits.layout != torch.strided:
        return f"returned logits with layout {logits.layout}; expected a dense (torch.strided) tensor"
    if not logits.is_floating_point():
        return f"returned logits of dtype {logits.dtype}; expected a floating-point dtype"
    if dtype is not None:
        built = getattr(torch, dtype, None)
        allowed = [d for d in (built, torch.float32) if isinstance(d, torch.dtype)]
        if logits.dtype not in allowed:
            upcast = " or torch.float32 (an upcast for sampling)" if built != torch.float32 else ""
            return (f"returned logits of dtype {logits.dtype}; expected {built} (the engine was built with "
                    f"EngineConfig.dtype={dtype!r}){upcast}")
    wanted = torch.device(device)
    if logits.device.type != wanted.type or (wanted.index is not None and logits.device.index != wanted.index):
        return f"returned logits on {logits.device}; the engine was built for device {device!r}"
    return None


def nan_rows(logits) -> str | None:
    """NaN in real rows: never right (on the emulator, NaN is memory a graph read before anything wrote it)."""
    import torch

    if not logits.numel() or not bool(torch.isnan(logits).any()):
        return None
    rows = torch.isnan(logits).any(dim=1).nonzero().flatten().tolist()
    return (f"returned NaN in the logits of {len(rows)} of {logits.shape[0]} real rows (first: row {rows[0]}); "
            "a real token's logits are never NaN (NaN from padded rows must not reach them; on the graph "
            "emulator, NaN is memory a graph read before anything wrote it)")


def kind(tensor) -> tuple:
    """(shape, dtype, device): what one engine's answers of one method keep from call to call."""
    return tuple(tensor.shape), tensor.dtype, tensor.device


def same_kind(logits, first: tuple, first_call: str) -> str | None:
    """One engine answers in one kind: these logits against those of its first answer (`first`, a
    `kind()`, from `first_call`), whichever method gave them."""
    _, dtype, device = first
    if (logits.dtype, logits.device) == (dtype, device):
        return None
    return (f"returned logits of dtype {logits.dtype} on {logits.device}, and its {first_call} returned "
            f"{dtype} on {device}: one engine answers every step in one dtype on one device (the harness "
            "compares them bit for bit)")


@_never_raises
def capture_report(value) -> str | None:
    graphs = getattr(value, "graphs", None)
    if not isinstance(graphs, Mapping) or not all(k in ("FULL", "PIECEWISE") and _is_int(v) and v >= 0
                                                   for k, v in graphs.items()):
        return f"returned {safe_repr(value)}; expected a CaptureReport whose graphs map FULL/PIECEWISE to counts"
    seconds, memory = getattr(value, "seconds", None), getattr(value, "memory_bytes", "missing")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        return f"returned {safe_repr(value)}; seconds must be a number >= 0"
    if memory is not None and not _is_int(memory):
        return f"returned {safe_repr(value)}; memory_bytes must be an int or None (not measured)"
    order = getattr(value, "order", None)
    if order is None or not all(isinstance(o, Sequence) and len(o) == 2 and o[0] in ("FULL", "PIECEWISE")
                                and _is_int(o[1]) for o in order):
        return f"returned {safe_repr(value)}; order must list (runtime mode, num_real_tokens) pairs"
    return None


@_never_raises
def step_inputs(value, num_padded_tokens: int) -> str | None:
    import torch

    for name in ("token_ids", "positions", "slot_mapping"):
        tensor = getattr(value, name, None)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.shape[0] != num_padded_tokens:
            return (f"returned {name}={safe_repr(tensor)}; expected a 1-D tensor of the step's "
                    f"{num_padded_tokens} padded rows")
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            return f"returned {name} of dtype {tensor.dtype}; expected an integer tensor (ids, positions, slots)"
    if not _is_int(getattr(value, "padding_slot", None)):
        return "returned a padding_slot that is not an int"
    return request_rows(value)


def request_rows(value) -> str | None:
    """The request rows of a StepInputs, where exposed: integer tensors of one row count (query
    starts one more), block tables 2-D; block_size and padding_block ints or None."""
    import torch

    rows = None
    for name, dims, extra in (("seq_lens", 1, 0), ("query_start_loc", 1, 1), ("block_tables", 2, 0)):
        tensor = getattr(value, name, None)
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims or tensor.is_floating_point() \
                or tensor.is_complex() or tensor.dtype == torch.bool:
            return f"returned {name}={safe_repr(tensor)}; expected a {dims}-D integer tensor, or None where not exposed"
        count = tensor.shape[0] - extra
        if rows is not None and count != rows:
            return (f"returned {name} for {count} request rows where another request-row field has {rows}: "
                    "every field holds the same rows (query_start_loc one entry more)")
        rows = count
    for name in ("block_size", "padding_block"):
        if getattr(value, name, None) is not None and not _is_int(getattr(value, name)):
            return f"returned a {name} that is neither an int nor None"
    return None


@_never_raises
def kv_snapshot(value, previous: tuple | None = None) -> str | None:
    """A copy of every KV slot, slot first; of one shape, dtype and device (`previous`, the last
    snapshot's `kind()`) for one engine."""
    import torch

    if not isinstance(value, torch.Tensor) or value.dim() < 1 or value.layout != torch.strided:
        return f"returned {safe_repr(value, 300)}; expected a dense tensor of every KV slot, slot first"
    if previous is not None and kind(value) != previous:
        shape, dtype, device = previous
        return (f"returned shape {tuple(value.shape)}, {value.dtype} on {value.device}; its previous snapshot was "
                f"{shape}, {dtype} on {device}: snapshots are compared slot by slot, bit for bit")
    return None


@_never_raises
def engine(value) -> str | None:
    missing = [name for name in ENGINE_OPERATIONS if not callable(getattr(value, name, None))]
    if missing:
        return (f"returned {safe_repr(value)}, which has no {', '.join(missing)}: "
                "expected an Engine (harness/protocol.py)")
    return None


@_never_raises
def addresses(value) -> str | None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and _is_int(v) for k, v in value.items()):
        return f"returned {safe_repr(value)}; expected a mapping of static buffer names to int addresses"
    return None


@_never_raises
def slot(value) -> str | None:
    return None if _is_int(value) else f"returned {safe_repr(value)}; expected an int slot"
