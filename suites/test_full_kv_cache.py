"""A full KV cache (docs/spec.md section 7, invariants 1 and 3 where no block is free): every
block the engine holds taken (harness.scenarios.full_cache), then padded graph steps at several
sizes that need no new block, in every graph mode.

- The fill ends in a declared refusal (`KVCacheFull`), once at least `kv_tokens` are held.
- Each padded step runs as the runtime's own dispatch says (the harness checks every step: no
  silent eager run), equals eager at its shape and transformers' forward, and writes no KV slot
  but its real tokens' (a pad that takes a live request's block shows here).
- A step refused for lack of blocks raises `KVCacheFull`, nothing else.
- After the serving run, every request released, the same number of blocks fits again.

TensorRT-LLM allocated its padding dummy lazily from the KV pool: with a full cache, padded
batches silently ran eager, or took a live request's block. Expected values: the configured
`kv_tokens`, the protocol's declared error, the blocks held before the run, an eager step of the
same runtime, and transformers' forward.
"""
import pytest

from harness.expectations import kv, presets
from harness.protocol import KVCacheFull, Request
from harness.reliability.safe import describe_exception
from harness.scenarios import full_cache
from harness.scenarios.batches import advance, decode_requests, describe_batch, padded_counts, prompt
from harness.vocabulary import CONFIG_MODES, EAGER, INDEPENDENT_FORWARD, OBSERVED

INVARIANT = "a full KV cache"
pytestmark = pytest.mark.requires("execution", "kv_inspection", "input_inspection")
DECLARED = "the protocol: a step refused for lack of KV blocks raises KVCacheFull (harness.protocol)"


def fill(check, engines, engine, block_size: int, decoders: int, kv_tokens: int, max_model_len: int,
         held_before: int | None = None) -> full_cache.Filled:
    """Every block taken; the refusal that ended the fill checked, and kv_tokens held (after a
    serving run, `held_before`: as many blocks as the first fill took)."""
    most = 4 * -(-kv_tokens // block_size) + decoders
    filled = full_cache.fill(engine, engines.new_id, block_size, engine.policy.max_num_batched_tokens,
                             max_model_len, decoders, most)
    if filled.refusal is None:
        full_cache.release(engine, filled)
        check.skip(f"holds more than {most} blocks of {block_size} tokens, four times kv_tokens: not filled here")
    if isinstance(filled.refusal, ValueError):  # a step it could never serve: more live requests than it seats
        full_cache.release(engine, filled)
        check.skip(f"cannot fill its KV cache of {kv_tokens} tokens with the requests it serves at once "
                   f"(it keeps more than max_num_seqs blocks besides): {describe_exception(filled.refusal)}")
    if held_before is not None:
        check.equal(filled.blocks, held_before, source="the blocks the same engine held before the serving run",
                    what="blocks that fit again after padded steps on a full cache, every request released")
    check.that(isinstance(filled.refusal, KVCacheFull), source=DECLARED,
               what="the step that found the KV cache full was refused with another error",
               error=describe_exception(filled.refusal), blocks_held=filled.blocks)
    check.that(filled.blocks * block_size >= kv_tokens, source="the configured kv_tokens",
               what=f"the engine refused a block with {filled.blocks * block_size} tokens held, fewer than the "
                    f"{kv_tokens} it was built to hold", blocks_held=filled.blocks, block_size=block_size)
    check.that(len(filled.decoders) == decoders, source=OBSERVED,
               what="the cache was full before the requests that decode were admitted", admitted=len(filled.decoders))
    return filled


def block_size_of(engines, engine) -> int | None:
    """The engine's KV block size, from the inputs of one step of a request released after it."""
    request_id = engines.new_id()
    engine.step([Request(request_id, prompt(request_id, 1), 0)])
    engine.release(request_id)
    return engine.last_step_inputs().block_size


def fillable(seats: int, blocks_per_filler: int) -> tuple[int, int] | None:
    """(decoders, KV blocks) of a cache the seats can fill, whatever an engine keeps apart from 1
    block (the reference's) to `seats + 1` (vLLM's null block, LMDeploy's padding block, and a partly
    filled block a request): blocks enough to admit the decoders (one each) beside one filler, and
    the seats the decoders leave holding more than the cache and what is kept apart. The most
    decoders that allow it; None where none do."""
    for decoders in range(seats - 1, 0, -1):
        if (seats - decoders - 1) * blocks_per_filler >= seats + 2:
            return decoders, decoders + blocks_per_filler
    return None


@pytest.mark.parametrize("mode", [m for m in CONFIG_MODES if m != "NONE"])
def test_padded_graph_steps_on_a_full_cache(check, engines, mode):
    block_size = block_size_of(engines, engines.for_mode(mode))
    if not block_size:
        check.skip("does not expose its KV block size (StepInputs.block_size): the fill cannot count blocks")
    seats = engines.for_mode(mode).policy.max_num_seqs
    # Long fillers, so that few seats fill the cache; half the checkpoint's positions leaves room for
    # what an engine adds to max_model_len (vLLM's runtimes ask for one position more).
    max_model_len = max(engines.max_model_len, presets.preset(engines.preset).max_positions // 2)
    cache = fillable(seats, max_model_len // block_size)
    if cache is None:
        check.skip(f"max_model_len {max_model_len} holds fewer than two blocks of {block_size} tokens: "
                   f"{seats} requests cannot fill a KV cache beside the blocks an engine keeps apart")
    decoders, blocks = cache
    kv_tokens = blocks * block_size
    engine = engines.for_mode(mode, kv_tokens=kv_tokens, max_model_len=max_model_len)
    counts = padded_counts(engines.runtime, engine.policy, decoders)[: block_size - 1]
    if not counts:
        check.skip(f"no batch of at most {decoders} decodes runs padded under its policy")
    filled = fill(check, engines, engine, block_size, max(counts), kv_tokens, max_model_len)
    caps = engines.runtime.capabilities
    anchor = engines.anchor() if caps.loads_checkpoint else None
    tolerance = anchor.tolerance(caps.precision, engines.preset) if anchor else None
    padded, refused = 0, []
    for n in counts:
        requests = decode_requests(filled.decoders[:n])
        history = {s.request_id: list(s.tokens) for s in filled.decoders[:n]}
        before = engine.kv_snapshot()
        try:
            out = engine.step(requests)
        except KVCacheFull as exc:  # declared: its padding needs a block the cache does not have
            refused.append((n, describe_exception(exc)))
            continue
        except Exception as exc:  # noqa: BLE001 - any other refusal is the failure
            check.that(False, source=DECLARED, case=describe_batch(requests), error=describe_exception(exc),
                       what="a step that needs no new KV block was refused on a full cache, not with KVCacheFull")
        case = f"{describe_batch(requests)} on a full KV cache; {out.runtime_mode} at {out.num_padded_tokens}"
        padded += out.num_padded_tokens > out.num_real_tokens
        stray = kv.stray_slots(engine, requests, before, engine.kv_snapshot())
        check.that(not stray, source=OBSERVED, case=case, stray_slots=stray[:10],
                   what="a padded step on a full KV cache wrote slots its real tokens do not own (a live request's)")
        check.same_bits(out.logits, engine.eager_step(requests, out.num_padded_tokens).logits, source=EAGER, case=case,
                        what="a padded step on a full KV cache vs eager at the same shape")
        if anchor is not None:
            difference = float((out.logits.float().cpu() - anchor.step(requests, history)).abs().max())
            check.note_difference(difference)
            check.that(difference <= tolerance.value, source=INDEPENDENT_FORWARD, case=case,
                       what=f"logits on a full KV cache differ from transformers' forward by more than "
                            f"{tolerance.explain()}", largest_difference=difference)
        advance(filled.decoders, requests)
    full_cache.release(engine, filled)
    full_cache.release(engine, fill(check, engines, engine, block_size, max(counts), kv_tokens, max_model_len,
                                    held_before=filled.blocks))
    check.that(padded > 0 or bool(refused), source=OBSERVED, refused=refused,
               what="none of the decode batches chosen to be padded ran padded on the full cache")
