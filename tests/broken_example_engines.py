"""The bucket engine (examples/bucket_engine) with one bug each, of a kind engine authors write;
tests/test_broken_example_engines.py checks that the suites catch every one. Those that read the
checkpoint wrong are in tests/broken_example_models.py.

Each is a subclass of the engine (or the runtime) that changes one method, so the rest of the
engine is the one that passes every suite. `BucketEngine` here is the unbroken runtime.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

try:
    import bucket_engine  # noqa: F401 (installed by scripts/install.sh)
except ImportError:  # a bare checkout: the example package is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "bucket_engine"))

from bucket_engine import policy  # noqa: E402
from harness.vocabulary import FAP  # noqa: E402
from bucket_engine.engine import BucketEngine as Engine  # noqa: E402
from bucket_engine.runtime import BucketRuntime  # noqa: E402


def broken(name: str, engine_class: type) -> type:
    return type(engine_class.__name__.lstrip("_"), (BucketRuntime,),
                {"name": name, "engine_class": engine_class, "__doc__": engine_class.__doc__})


class _BucketOffByThree(Engine):
    """Looks its graph up for num_real_tokens + 3: it runs, and says it ran, a bucket its own dispatch()
    did not choose (and eager where that bucket does not exist)."""

    def bucket(self, num_real_tokens, num_real_rows, uniform):
        return super().bucket(num_real_tokens + 3, num_real_rows, uniform)


class _ReportsDispatchedSize(Engine):
    """Replays its largest graph for every batch ("one graph fits all"), but reports the bucket
    its dispatch chose: a step reporting a size it did not run."""

    def bucket(self, num_real_tokens, num_real_rows, uniform):
        chosen = super().bucket(num_real_tokens, num_real_rows, uniform)
        return self.sizes[-1] if chosen is not None else None

    def step(self, requests, padding_fill=None):
        result = super().step(requests, padding_fill)
        if result.runtime_mode == "FULL":
            uniform = all(len(r.token_ids) == self.q for r in requests)
            result.num_padded_tokens = super().bucket(result.num_real_tokens, len(requests), uniform)
        return result


class _PaddingSlotZero(Engine):
    """Padded tokens write slot 0, the way engines with a reserved null block do; here slot 0 is
    the first slot of a live request's row."""

    def __init__(self, config):
        super().__init__(config)
        self.padding_slot = 0


class _PaddingWritesAFreeSlot(Engine):
    """Padded tokens write the first slot of the last KV row, which no request holds in the suites:
    a write into free memory that no live request's logits show."""

    def __init__(self, config):
        super().__init__(config)
        self.padding_slot = (self.num_rows - 1) * self.length


class _StalePaddedRows(Engine):
    """Copies only the real rows into the static buffers: padded rows keep the token ids,
    positions, slots and KV rows some earlier step left there."""

    def load(self, requests, size, padding_fill=None):
        super().load(requests, sum(len(r.token_ids) for r in requests), padding_fill)
        self.last_size = size


class _GraphKeepsRowTable(Engine):
    """Graph steps skip copying the KV-row table, as if a graph had captured its contents (it
    captured the buffer's address, not its values): they read the rows of the previous step."""

    _in_step = False

    def load(self, requests, size, padding_fill=None):
        kept = self.inputs["kv_rows"].clone()
        super().load(requests, size, padding_fill)
        if requests and size in self.graphs and self._in_step:
            self.inputs["kv_rows"].copy_(kept)

    def step(self, requests, padding_fill=None):
        self._in_step = True
        try:
            return super().step(requests, padding_fill)
        finally:
            self._in_step = False


class _HostSyncInForward(Engine):
    """Checks positions against max_model_len inside the forward: int(tensor) reads the device
    from the host, which a graph cannot capture (the emulator raises CaptureError, as CUDA does)."""

    def forward(self, n):
        if int(self.inputs["positions"][:n].max()) >= self.length:
            raise ValueError("a position is beyond max_model_len")
        return super().forward(n)


class _OutputIsAGraphBuffer(Engine):
    """Returns a view of the graph's logits buffer (no copy) while declaring that outputs are the
    caller's (outputs_alias_graph_buffers=False): the next replay overwrites them."""

    def step(self, requests, padding_fill=None):
        result = super().step(requests, padding_fill)
        if result.runtime_mode == "FULL":
            result.logits = self.graphs[result.num_padded_tokens][1][: result.num_real_tokens]
        return result


class AliasedOutputs(BucketRuntime):
    """Not broken: returns a view of the graph's logits buffer and says so
    (outputs_alias_graph_buffers=True), as engines that save the copy do. A suite that keeps a
    step's logits past the next step without copying them fails it."""

    name = "aliased-outputs"
    engine_class = _OutputIsAGraphBuffer
    capabilities = replace(BucketRuntime.capabilities, outputs_alias_graph_buffers=True)


class _NoAddressCheck(Engine):
    """Declares address_checks but replays without checking: a static buffer replaced after
    capture is silently ignored, and the graph computes on the old memory."""

    def check_addresses(self):
        pass


class _CaptureWritesLiveSlots(Engine):
    """Its warm-up and capture batch writes slots 0..size-1 ("a dummy run that looks real")
    instead of the padding slot: capture overwrites the KV of requests already running."""

    def load(self, requests, size, padding_fill=None):
        super().load(requests, size, padding_fill)
        if not requests:
            self.inputs["slot_mapping"][:size].copy_(torch.arange(size))


class _InterleavedRope(Engine):
    """Rotates interleaved pairs (x[2i], x[2i+1]), as Meta's original Llama code does, over
    Hugging Face weights, which are permuted for rotate_half: every path agrees, all are wrong."""

    def __init__(self, config):
        super().__init__(config)
        model = self.model

        def rope(x, positions):
            half = model.head_dim // 2
            cos, sin = model.cos[positions, None, :half], model.sin[positions, None, :half]
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

        model.rope = rope





# -- engines whose bugs need a grid past its powers of two, a one-token prompt, or a shared pool ----
class _PowerOfTwoLookup(Engine):
    """Finds its graph at the next power of two (times q) of the batch, as its buckets were before the
    largest whole batch was added to them: right wherever max_num_seqs is a power of two; at a
    maximum off the powers (17) there is no such graph, and the full batch runs eager."""

    def bucket(self, num_real_tokens, num_real_rows, uniform):
        chosen = super().bucket(num_real_tokens, num_real_rows, uniform)
        if chosen is None:
            return None
        return self.q * (1 << (-(-num_real_tokens // self.q) - 1).bit_length())


class _ByExponent(dict):
    """A dict of graphs keyed by the bit length of the bucket."""

    def __setitem__(self, size, graph):
        super().__setitem__(size.bit_length(), graph)

    def __getitem__(self, size):
        return super().__getitem__(size.bit_length())

    def get(self, size, default=None):
        return default if size is None else super().get(size.bit_length(), default)


class _GraphsKeyedByExponent(Engine):
    """Keeps one graph per power of two, keyed by the bucket's bit length: a maximum off the powers
    (17) shares its key with 16, the graph captured last answers for both, and a batch of 17 runs
    in the graph of 16."""

    def __init__(self, config):
        super().__init__(config)
        self.graphs = _ByExponent()


class _DecodeGraphSkipsNewRows(Engine):
    """Hands KV rows out from its free list in the steps it runs eagerly or as prefills; in a decode
    graph it takes a request it has not seen for one whose row is 0, so a request whose prompt is
    one token, joining a decode batch, shares row 0 with another request: the step computes the
    same numbers, the steps after it read each other's KV."""

    _decoding = False

    def step(self, requests, padding_fill=None):
        self._decoding = self.captured and self.is_uniform(requests)
        try:
            return super().step(requests, padding_fill)
        finally:
            self._decoding = False

    def row_of(self, request):
        if self._decoding and request.request_id not in self.rows:
            self.rows[request.request_id] = 0
        return super().row_of(request)


class _SmallestFirstUncopiedTop(Engine):
    """When a batch fills its largest graph (nothing padded to strip) it hands that graph's output
    over as it is, which no other graph's replay writes while the largest is captured first into
    the shared pool; but it captures smallest first, so the largest graph's output lands in blocks
    the smaller graphs freed, and their replays overwrite logits the caller holds."""

    def capture_order(self):
        return sorted(self.sizes)

    def step(self, requests, padding_fill=None):
        result = super().step(requests, padding_fill)
        if result.runtime_mode == "FULL" and result.num_real_tokens == result.num_padded_tokens == max(self.sizes):
            result.logits = self.graphs[result.num_padded_tokens][1]
        return result


# -- engines wrong only at the end of the context -------------------------------------------------
class _LastDecodeRefused(Engine):
    """Its decode path checks a request's length with >= where > was meant: a prefill may fill
    max_model_len, but a decode (or verify) step that reaches the last position is refused."""

    def check_length(self, request):
        decoding = request.context_len > 0 and len(request.token_ids) == self.q
        if decoding and request.context_len + len(request.token_ids) >= self.length:
            raise ValueError(f"request {request.request_id} would reach max_model_len {self.length}")
        super().check_length(request)


class _NoLengthCheck(Engine):
    """Never checks a request's length against max_model_len: a token past it indexes past the
    RoPE table and the KV row (an error on the CPU, other memory on a GPU)."""

    def check_length(self, request):
        pass


class _RopeTableOneShort(Engine):
    """Builds its RoPE table for max_position_embeddings - 1 positions (arange(n - 1)): the model's
    last position is past the table."""

    def __init__(self, config):
        super().__init__(config)
        self.model.cos, self.model.sin = self.model.cos[:-1], self.model.sin[:-1]


class _LastSlotNotAttended(Engine):
    """Keeps the last slot of each KV row as a guard it never attends to: a token at the last
    position does not see its own key. Graph and eager steps agree; transformers does not."""

    def visible(self, positions):
        return super().visible(positions) & (self.window < self.length - 1)[None, :]


class SilentDowngrade(BucketRuntime):
    """Resolves modes by its rule but drops the warning from resolve_mode()'s answer."""

    name = "silent-downgrade"

    def resolve_mode(self, request):
        return replace(super().resolve_mode(request), warnings=())


class DenseTopBuckets(BucketRuntime):
    """Not broken: it also captures mixed batches of up to twice its largest decode batch, and that
    grid ends in two neighbouring sizes (..., 2 * most - 1, 2 * most), so a batch of 2 * most - 1
    tokens rightly pads to itself, not to the largest size. A suite that expects every grid to
    have vLLM's gaps at the top fails it."""

    name = "dense-top-buckets"

    @staticmethod
    def dense(config):
        sizes = policy.capture_sizes(config)
        top = 2 * sizes[-1] if sizes else 0
        # Its one attention backend is ALWAYS: FULL_AND_PIECEWISE resolves to FULL (engine docstring).
        mixed_in_graphs = config.mode in ("FULL", FAP)
        if config.capture_sizes is not None or not mixed_in_graphs or top < 4 or top > policy.batched_tokens(config):
            return config
        return replace(config, capture_sizes=sizes + [top - 1, top])

    def capture_sizes(self, config):
        return super().capture_sizes(self.dense(config))

    def padded_size(self, config, num_real_tokens):
        return super().padded_size(self.dense(config), num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False):
        return super().dispatch(self.dense(config), num_real_tokens, num_real_rows, uniform)

    def build(self, config):
        return super().build(replace(config, policy=self.dense(config.policy)))


class GridToTheBudget(DenseTopBuckets):
    """Not broken: its mixed-batch graphs reach the token budget (..., budget / 2, budget), and its
    static buffers hold the budget and no more, so a step above it is refused, as no scheduler
    sends one. A suite that probes the largest size + 1 there fails it."""

    name = "grid-to-the-budget"

    @staticmethod
    def dense(config):
        sizes, budget = policy.capture_sizes(config), policy.batched_tokens(config)
        if config.capture_sizes is not None or config.mode not in ("FULL", FAP) or not sizes or budget <= sizes[-1]:
            return config
        return replace(config, capture_sizes=sizes + [s for s in (budget // 2, budget) if s > sizes[-1]])


class _RejectsFull(Engine):
    def __init__(self, config):
        if config.policy.mode == "FULL":
            raise ValueError("mode FULL is not supported: mixed batches never run in a graph here; "
                             "use FULL_DECODE_ONLY")
        super().__init__(config)


class RejectsFullDeclaringNoBackends(BucketRuntime):
    """Not broken: rejects mode FULL at build with a ValueError naming it, and declares no
    attention backends, so the harness has no resolve_mode() answer to check that against."""

    name = "rejects-full"
    engine_class = _RejectsFull
    capabilities = replace(BucketRuntime.capabilities, attention_backends=())

    def resolve_mode(self, request):
        if request.mode == "FULL":
            raise ValueError("mode FULL is not supported; use FULL_DECODE_ONLY")
        return super().resolve_mode(request)


class DeclaresFewerSizes(DenseTopBuckets):
    """Captures, dispatches to and runs a graph at 2 * most - 1 tokens, but leaves that size out of
    what capture_sizes() declares: its declared grid is not the one its engine runs."""

    name = "declares-fewer-sizes"

    def capture_sizes(self, config):
        sizes = super().capture_sizes(config)
        top = self.dense(config).capture_sizes
        return [s for s in sizes if not top or s != top[-2]]


BucketEngine = BucketRuntime
BucketOffByThree = broken("bucket-off-by-three", _BucketOffByThree)
ReportsDispatchedSize = broken("reports-dispatched-size", _ReportsDispatchedSize)
PaddingWritesAFreeSlot = broken("padding-writes-a-free-slot", _PaddingWritesAFreeSlot)
PaddingSlotZero = broken("padding-slot-zero", _PaddingSlotZero)
StalePaddedRows = broken("stale-padded-rows", _StalePaddedRows)
GraphKeepsRowTable = broken("graph-keeps-row-table", _GraphKeepsRowTable)
HostSyncInForward = broken("host-sync-in-forward", _HostSyncInForward)
OutputIsAGraphBuffer = broken("output-is-a-graph-buffer", _OutputIsAGraphBuffer)
NoAddressCheck = broken("no-address-check", _NoAddressCheck)
CaptureWritesLiveSlots = broken("capture-writes-live-slots", _CaptureWritesLiveSlots)
InterleavedRope = broken("interleaved-rope", _InterleavedRope)
LastDecodeRefused = broken("last-decode-refused", _LastDecodeRefused)
NoLengthCheck = broken("no-length-check", _NoLengthCheck)
RopeTableOneShort = broken("rope-table-one-short", _RopeTableOneShort)
LastSlotNotAttended = broken("last-slot-not-attended", _LastSlotNotAttended)
PowerOfTwoLookup = broken("power-of-two-lookup", _PowerOfTwoLookup)
GraphsKeyedByExponent = broken("graphs-keyed-by-exponent", _GraphsKeyedByExponent)
DecodeGraphSkipsNewRows = broken("decode-graph-skips-new-rows", _DecodeGraphSkipsNewRows)
SmallestFirstUncopiedTop = broken("smallest-first-uncopied-top", _SmallestFirstUncopiedTop)

MUTANTS = [BucketOffByThree, ReportsDispatchedSize, PaddingSlotZero, StalePaddedRows, GraphKeepsRowTable,
           HostSyncInForward, OutputIsAGraphBuffer, NoAddressCheck, CaptureWritesLiveSlots, InterleavedRope,
           SilentDowngrade, DeclaresFewerSizes, PaddingWritesAFreeSlot, PowerOfTwoLookup, GraphsKeyedByExponent, DecodeGraphSkipsNewRows,
           SmallestFirstUncopiedTop, LastDecodeRefused, NoLengthCheck, RopeTableOneShort, LastSlotNotAttended]
