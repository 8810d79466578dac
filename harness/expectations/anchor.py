"""The numerical anchor: transformers' own forward over the harness's checkpoint, independent of
any engine. Every expected logit row is computed from a request's whole sequence (prompt and
every token since), with no KV cache, no padding and no graphs.

How far an engine's logits may lie from the anchor follows from how it declares its arithmetic
(`Capabilities.precision`) by one rule, `tolerance()` (docs/spec.md section 10): rounding
errors of the model's matrix products, added up as independent errors, scaled by the size of
the logits, with a stated margin. `scripts/precision_calibration.py` measures the rule against
emulated TF32, bfloat16 and float16 forwards (reports/precision/).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from harness.expectations import presets
from harness.reliability.processes import harness_owned
from harness.vocabulary import PRECISIONS

# Unit roundoff of a matrix product's inputs (and, for a dtype, of every value stored between
# products): float32 keeps 24 significant bits, TF32 11, bfloat16 8, float16 11.
UNIT_ROUNDOFF = {"ieee": 2.0 ** -24, "tf32": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# The spread of a sum of independent rounding errors is a few of its standard deviations at the
# extreme of the ~10^5 logits a test compares; 4 leaves room for correlated layers.
MARGIN = 4.0
PROBE_TOKENS = 64  # the anchor's own scale: the largest |logit| over a fixed sequence this long
# The helper process's first answer waits for its transformers import and model load (tens of
# seconds on a cold machine); a later one takes milliseconds.
ANSWER_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Tolerance:
    """The largest |engine - anchor| logit difference allowed, and how the rule arrived at it."""

    value: float
    precision: str
    products: int  # matrix products on the path from the embedding to a logit
    inner: int  # the longest inner dimension one of them sums over
    scale: float  # the largest |logit| of the anchor

    def explain(self) -> str:
        return (f"{self.value:.3g}, the tolerance for declared precision {self.precision!r} (Capabilities.precision): "
                f"{MARGIN:g} x sqrt({self.products} matrix products) x (u={UNIT_ROUNDOFF[self.precision]:.3g} + "
                f"float32 accumulation {UNIT_ROUNDOFF['ieee']:.3g} x sqrt({self.inner})) x the anchor's largest "
                f"|logit| {self.scale:.3g} (docs/spec.md section 10)")


def tolerance(precision: str, preset: str, scale: float) -> Tolerance:
    """The rule (docs/spec.md section 10). Each of the M = 6 x layers + 1 matrix products of a
    Llama (QKV, scores, values, output, gate/up, down, and the head) is off by its inputs'
    unit roundoff u plus float32 accumulation over its inner dimension K, both relative to its
    result; independent errors of M products add to sqrt(M) of one; the logits carry them at
    their own size."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    shape = presets.preset(preset)
    products = 6 * shape.layers + 1
    inner = max(shape.hidden, shape.intermediate)
    per_product = UNIT_ROUNDOFF[precision] + UNIT_ROUNDOFF["ieee"] * math.sqrt(inner)
    return Tolerance(MARGIN * math.sqrt(products) * per_product * scale, precision, products, inner, scale)


class _Rows:
    """What an anchor answers from its logits (`logits`, `scale`): a step's expected rows, a tolerance."""

    scale: float

    def logits(self, sequence: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def tolerance(self, precision: str, preset: str) -> Tolerance:
        return tolerance(precision, preset, self.scale)

    def step(self, requests, history: dict[int, list[int]]) -> torch.Tensor:
        """The rows a step's logits should hold, in request order: for each request, the positions
        its tokens occupy after the `history` (its tokens before this step)."""
        rows = []
        for r in requests:
            before = history.get(r.request_id, [])
            if len(before) != r.context_len:
                raise ValueError(f"request {r.request_id} says {r.context_len} tokens are cached; its history has "
                                 f"{len(before)}")
            rows.append(self.logits(before + list(r.token_ids))[r.context_len:])
        return torch.cat(rows)


class Anchor(_Rows):
    def __init__(self, checkpoint: str, device: str = "cpu"):
        import transformers
        from transformers import LlamaForCausalLM

        self.device = device
        # transformers 4.56 renamed from_pretrained's torch_dtype to dtype; the floor (4.45) knows only the old name.
        major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
        dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        self.model = LlamaForCausalLM.from_pretrained(checkpoint, **{dtype_key: torch.float32},
                                                      attn_implementation="eager").to(device).eval()
        probe = [1 + (7 * i) % (self.model.config.vocab_size - 1) for i in range(PROBE_TOKENS)]
        self.scale = float(self.logits(probe).abs().max())

    @torch.inference_mode()
    def logits(self, sequence: list[int]) -> torch.Tensor:
        """[len(sequence), vocab] fp32 logits on the CPU: row i predicts the token after position i."""
        ids = torch.tensor([sequence], device=self.device)
        return self.model(input_ids=ids).logits[0].float().cpu()


class AnchorProcessError(RuntimeError):
    """The anchor's helper process failed or stopped answering."""


class AnchorProcess(_Rows):
    """The Anchor in a helper process of its own, on the CPU with one thread, for preset `preset`.

    Started as soon as the tests are known (harness.session.anchor_helper), it imports transformers
    and loads the model while the other tests run: the pytest process computes on one core, and this uses another.
    Answers come back as raw float32 bytes, the same values the Anchor computes there. A fresh
    interpreter (not multiprocessing's spawn, which would run the parent's main script again),
    with the parent's import path."""

    def __init__(self, preset: str, timeout: float = ANSWER_TIMEOUT_S):
        import multiprocessing
        import subprocess
        import sys

        self.timeout, self._scale = timeout, None
        self._connection, child = multiprocessing.Pipe()
        command = [sys.executable, "-c", "import sys; from harness.expectations.anchor import _serve; "
                   "_serve(sys.argv[1], int(sys.argv[2]))", preset, str(child.fileno())]
        # The tests' import path; no GPU, so the helper never touches the device the tests measure.
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                       "CUDA_VISIBLE_DEVICES": ""}
        with harness_owned("the numerical anchor's helper process"):
            self._process = subprocess.Popen(command, pass_fds=[child.fileno()], env=environment,
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
        child.close()

    @property
    def scale(self) -> float:
        if self._scale is None:
            self._scale = self._ask("scale")
        return self._scale

    def logits(self, sequence: list[int]) -> torch.Tensor:
        shape, data = self._ask("logits", list(sequence))
        return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)

    def _ask(self, *request):
        try:
            self._connection.send(request)
            if not self._connection.poll(self.timeout):
                raise TimeoutError(f"no answer within {self.timeout:g} s")
            status, value = self._connection.recv()
        except (OSError, EOFError, TimeoutError) as exc:
            self._process.kill()  # a late answer would be read as the next request's: no later request is asked
            self._process.wait(timeout=5)
            raise AnchorProcessError(
                f"the numerical anchor's helper process (transformers' forward on the CPU, started with the "
                f"tests) did not answer {request[0]!r}: {type(exc).__name__}: {str(exc) or 'its end of the pipe closed'}; "
                f"its exit status: {self._process.returncode}") from None
        if status != "ok":
            raise AnchorProcessError(f"the numerical anchor's helper process failed: {value}")
        return value

    def close(self) -> None:
        """Ended at once: it keeps nothing to write, and shutting down its interpreter would take longer."""
        self._process.kill()
        self._process.wait(timeout=5)
        self._connection.close()


def _serve(preset: str, fd: int) -> None:
    """The helper process: an Anchor over the preset's checkpoint, answering on `fd` until it is ended."""
    from multiprocessing.connection import Connection

    connection = Connection(fd)
    torch.set_num_threads(1)  # one spare core, not every core the tests' process computes on
    try:
        anchor, failure = Anchor(str(presets.checkpoint(preset))), None
    except Exception as exc:  # noqa: BLE001 - said in answer to every request, which fails the anchor's tests
        anchor, failure = None, f"building transformers' model failed: {type(exc).__name__}: {exc}"
    while True:
        try:
            kind, *arguments = connection.recv()
        except EOFError:  # the tests' process ended
            return
        try:
            if anchor is None:
                raise RuntimeError(failure)
            if kind == "scale":
                answer = anchor.scale
            else:
                rows = anchor.logits(*arguments).contiguous()
                answer = (tuple(rows.shape), rows.numpy().tobytes())
            connection.send(("ok", answer))
        except Exception as exc:  # noqa: BLE001 - sent back, where the asking test reports it
            connection.send(("error", f"{type(exc).__name__}: {exc}"))


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Per row, the gap between the best and the second-best logit."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]
