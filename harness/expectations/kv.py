"""What a step did to the KV cache, read through a runtime's inspection hooks (`kv_snapshot()`,
`slot_of()`): the slots whose bits changed, and the slots its real tokens own.
"""
from __future__ import annotations


def changed_slots(before, after) -> list[int]:
    """KV slots whose bits changed between two `kv_snapshot()`s (slot first). Bits, not values:
    a NaN that kept its bit pattern is no change, and 0.0 written over -0.0 is one."""
    import torch

    slots = before.shape[0]
    return (before.contiguous().view(torch.uint8).reshape(slots, -1)
            != after.contiguous().view(torch.uint8).reshape(slots, -1)).any(dim=1).nonzero().flatten().tolist()


def written_slots(engine, requests) -> set[int]:
    """The slots a step's real tokens write: one per token, at its position."""
    return {engine.slot_of(r.request_id, r.context_len + j) for r in requests for j in range(len(r.token_ids))}


def stray_slots(engine, requests, before, after, written: set[int] | None = None) -> list[int]:
    """Slots that changed although no real token of `requests` owns them (`written`, where the
    caller already has it)."""
    if written is None:
        written = written_slots(engine, requests)
    return sorted(set(changed_slots(before, after)) - written)
