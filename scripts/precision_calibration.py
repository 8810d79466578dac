"""The numerical anchor's tolerance rule (docs/spec.md section 10) against the arithmetic it describes.

    python scripts/precision_calibration.py --out reports/precision [--presets tiny,small]

For each model preset, transformers' own forward over the harness's checkpoint is run as IEEE
float32 (the anchor), with every matrix product's inputs rounded to TF32, with only attention's
products rounded (vLLM's float32 path: Triton's `tl.dot` defaults to TF32, its other products are
cuBLAS at "highest"), and in bfloat16 and float16; over three sequences. It writes the largest
difference from the anchor beside the tolerance the rule gives each precision, and their ratio.
CPU only; the emulation is harness.expectations.emulated_precision.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.expectations import anchor as anchor_module  # noqa: E402
from harness.expectations import presets  # noqa: E402
from harness.expectations.emulated_precision import TF32Products, round_to_tf32  # noqa: E402

LENGTHS = (5, 17, 40)


class TF32Attention(TF32Products):
    """Only attention's products (transformers' eager attention: torch.matmul) round to TF32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.matmul:
            args = tuple(round_to_tf32(a) for a in args)
        return func(*args, **(kwargs or {}))


def measure(preset: str) -> tuple[float, list[tuple[str, str, float]]]:
    """(the anchor's scale, [(arithmetic, precision it is held to, largest difference)])."""
    anchor = anchor_module.Anchor(str(presets.checkpoint(preset)))
    vocab = presets.preset(preset).vocab
    worst: dict[tuple[str, str], float] = {}
    reduced = {dtype: presets.seeded_model(preset).to(dtype) for dtype in (torch.bfloat16, torch.float16)}
    with torch.inference_mode():
        for n in LENGTHS:
            ids = torch.tensor([[1 + (13 * i + n) % (vocab - 1) for i in range(n)]])
            ieee = anchor.model(input_ids=ids).logits[0]
            runs = {}
            with TF32Products():
                runs[("TF32 matrix products", "tf32")] = anchor.model(input_ids=ids).logits[0]
            with TF32Attention():
                runs[("TF32 attention products only", "tf32")] = anchor.model(input_ids=ids).logits[0]
            runs[("bfloat16 model", "bfloat16")] = reduced[torch.bfloat16](input_ids=ids).logits[0].float()
            runs[("float16 model", "float16")] = reduced[torch.float16](input_ids=ids).logits[0].float()
            for key, logits in runs.items():
                worst[key] = max(worst.get(key, 0.0), float((logits - ieee).abs().max()))
    return anchor.scale, [(what, precision, difference) for (what, precision), difference in worst.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/precision")
    parser.add_argument("--presets", default="tiny,small")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["# The anchor's tolerance rule against emulated arithmetic", "",
             f"Written by `python scripts/precision_calibration.py --out {args.out} --presets {args.presets}` "
             f"(torch {torch.__version__}, CPU). Rule: `harness.expectations.anchor.tolerance` (docs/spec.md "
             "section 10); margin " f"{anchor_module.MARGIN:g}. Each row: the largest |logit - anchor| over sequences of "
             f"{', '.join(map(str, LENGTHS))} tokens, the tolerance of the precision that arithmetic is held to, "
             "and the IEEE tolerance it would fail.", "",
             "| preset | anchor's largest \\|logit\\| | arithmetic | held to | largest difference | its tolerance | "
             "difference / tolerance | IEEE tolerance |", "|---|---|---|---|---|---|---|---|"]
    for preset in args.presets.split(","):
        start = time.perf_counter()
        scale, rows = measure(preset)
        ieee = anchor_module.tolerance("ieee", preset, scale).value
        for what, precision, difference in rows:
            bound = anchor_module.tolerance(precision, preset, scale).value
            lines.append(f"| {preset} | {scale:.3f} | {what} | {precision} | {difference:.3g} | {bound:.3g} | "
                         f"{difference / bound:.3f} | {ieee:.3g} |")
        print(f"{preset}: {time.perf_counter() - start:.1f}s", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.md").write_text("\n".join(lines) + "\n")
    print(out / "calibration.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
