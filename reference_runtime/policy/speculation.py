"""Dynamic speculative decoding: a speculative-token count per range of batch sizes (vLLM's
`num_speculative_tokens_per_batch_size`), and the decode tiers its capture sizes must cover
(SPEC 3.3). A step is uniform only within a tier, so each tier's q needs sizes of its own.
"""
from __future__ import annotations

# One entry: (first batch size, last batch size, speculative tokens), both ends inclusive.
Schedule = tuple[tuple[int, int, int], ...]


def check_schedule(schedule) -> Schedule:
    """The schedule sorted by its first batch size; ValueError saying what is wrong otherwise."""
    entries = []
    for entry in schedule:
        if len(entry) != 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in entry):
            raise ValueError(f"each speculative_schedule entry is (first batch, last batch, speculative tokens), got {entry!r}")
        first, last, tokens = entry
        if first < 1 or first > last or tokens < 0:
            raise ValueError(f"speculative_schedule entry {entry!r} needs 1 <= first <= last and tokens >= 0")
        entries.append((first, last, tokens))
    if not entries:
        raise ValueError("speculative_schedule is empty; give at least one (first, last, tokens) range, or leave it unset")
    entries.sort()
    if entries[0][0] != 1:
        raise ValueError(f"speculative_schedule must start at batch size 1, so every batch has a count; got {entries[0]!r}")
    for before, after in zip(entries, entries[1:]):
        if after[0] <= before[1]:
            raise ValueError(f"speculative_schedule ranges overlap: {before!r} and {after!r}")
    return tuple(entries)


def tokens_by_batch_size(schedule: Schedule, max_num_seqs: int, num_speculative_tokens: int) -> list[int]:
    """Speculative tokens at each batch size 1..max_num_seqs (index 0 unused): each range's count,
    never above num_speculative_tokens; a gap or the tail after the last range keeps the count
    before it (vLLM's build_dynamic_sd_schedule_lookup)."""
    counts = [0] * (max_num_seqs + 1)
    for batch in range(1, max_num_seqs + 1):
        latest = max((entry for entry in schedule if entry[0] <= batch), key=lambda entry: entry[0])
        counts[batch] = min(num_speculative_tokens, latest[2])
    return counts


def decode_tiers(schedule: Schedule | None, max_num_seqs: int, num_speculative_tokens: int) -> list[tuple[int, int]]:
    """(q, the widest batch that runs at it) for each q a uniform decode step can have."""
    if schedule is None:
        return [(1 + num_speculative_tokens, max_num_seqs)]
    widest: dict[int, int] = {}
    for batch, tokens in enumerate(tokens_by_batch_size(schedule, max_num_seqs, num_speculative_tokens)[1:], start=1):
        widest[1 + tokens] = batch
    return sorted(widest.items())
