"""Policy calculator: capture sizes, padding, dispatch and mode resolution (SPEC 3-5).

    python -m reference_runtime sizes --max-num-seqs 64
    python -m reference_runtime pad --batch 500 --json
    python -m reference_runtime dispatch --num-tokens 1-16 --uniform --num-speculative-tokens 1
    python -m reference_runtime resolve --mode FULL --support UNIFORM_BATCH
    python -m reference_runtime resolve --support ALWAYS -O1
    python -m reference_runtime dispatch --query-lens 2,2,2 --num-speculative-tokens 1
    python -m reference_runtime sizes --max-num-seqs 8 --compile-sizes 1,2,3
    python -m reference_runtime sizes --max-num-seqs 128 --num-speculative-tokens 16 --speculative-schedule 1-16:16,17-128:2

Only the standard library and `reference_runtime.policy`: no torch, so it starts instantly anywhere.
Bad input exits 2 with one line (`{"error": ...}` on stdout with --json, `error: ...` on stderr
otherwise), never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import textwrap
from dataclasses import asdict

from .policy import AttentionCGSupport, CUDAGraphMode, Dispatcher, PaddingTable, PolicyConfig, capture_sizes, resolve_mode
from .policy.compilation import OPTIMIZATION_LEVELS, check_compile_sizes, compilation_defaults
from .policy.config import DEFAULT_RUNNER, RUNNERS
from .policy.dispatch import is_uniform_decode
from .policy.resolve import RELEASES
from .policy.sizes import default_cap

PROG = "python -m reference_runtime"
MODES = ", ".join(m.name for m in CUDAGraphMode)
SUPPORTS = ", ".join(s.name for s in reversed(AttentionCGSupport)) + " (or USTD)"


class UsageError(Exception):
    """A bad argument; main() turns it into one line and exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse would print usage and exit itself; we need one line, and JSON when asked.
    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


# -- argument types: each error says what was given and what is accepted ------------------------
def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def positive(text: str) -> int:
    return _int(text, 1)


def non_negative(text: str) -> int:
    return _int(text, 0)


def count_or_range(text: str) -> int | tuple[int, int]:
    """N, or A-B inclusive. A range always prints a list, even when A == B."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match:
        try:
            return positive(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected an integer >= 1 or a range A-B, got {text!r}") from None
    lo, hi = int(match[1]), int(match[2])
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"a range A-B needs 1 <= A <= B, got {text!r}")
    return lo, hi


def size_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"\d+", p) and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 like 1,2,4,8, got {text!r}")
    return tuple(int(p) for p in parts)


def schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """FIRST-LAST:K,... (batch sizes FIRST..LAST run K speculative tokens)."""
    entries = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*", part)
        if not match:
            raise argparse.ArgumentTypeError(f"expected FIRST-LAST:K entries like 1-16:3,17-256:1, got {text!r}")
        entries.append(tuple(int(g) for g in match.groups()))
    return tuple(entries)


def _enum(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:  # the policy's message already lists the valid names
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _values(arg) -> list[int]:
    return list(range(arg[0], arg[1] + 1)) if isinstance(arg, tuple) else [arg]


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    g = common.add_argument_group("sizes options")
    g.add_argument("--max-num-seqs", type=positive, default=256, metavar="N", help="default 256")
    g.add_argument("--max-num-batched-tokens", type=positive, metavar="T",
                   help="default max(8192, max_num_seqs); must be >= --max-num-seqs")
    g.add_argument("--num-speculative-tokens", type=non_negative, default=0, metavar="K",
                   help="default 0; q = 1 + K tokens per request in a uniform decode step")
    g.add_argument("--speculative-schedule", type=schedule, metavar="1-16:3,17-256:1",
                   help="dynamic speculative decoding: batch sizes FIRST..LAST run K speculative tokens "
                        "(K at most --num-speculative-tokens); sizes and V2 decode graphs cover each q")
    g.add_argument("--platform-max", type=positive, default=512, metavar="D",
                   help="platform max capture size: 512, or 1024 on SM100 (default 512)")
    g.add_argument("--sizes", type=size_list, metavar="1,2,4", help="user capture sizes, comma-separated")
    g.add_argument("--max-capture-size", type=non_negative, metavar="M",
                   help="user max capture size (0: no graphs, with --mode NONE)")
    g.add_argument("--mode", type=_enum(CUDAGraphMode.parse), default=None,
                   help=f"graph mode, one of {MODES} (default: the optimization level's, FULL_AND_PIECEWISE at -O2). "
                        "For sizes and pad it decides whether anything is captured and whether sizes round up "
                        "to multiples of q; resolve takes it as the request")
    g.add_argument("-O", "--optimization-level", type=int, choices=sorted(OPTIMIZATION_LEVELS), default=2,
                   metavar="LEVEL", help="vLLM's -O0..-O3 (default 2): the mode and compilation left unset")
    g.add_argument("--enforce-eager", action="store_true",
                   help="vLLM's enforce_eager: no compilation, mode NONE, max capture size 0")
    g.add_argument("--compile-sizes", type=size_list, metavar="1,2,4",
                   help="vLLM's compile_sizes: each must be a capture size or above the largest")
    g.add_argument("--runner", choices=RUNNERS, default=DEFAULT_RUNNER,
                   help=f"vLLM's model runner whose rules apply (default {DEFAULT_RUNNER}, as vLLM 0.33): v1 rounds "
                        "sizes to multiples of q under FULL decode graphs, v2 only its decode keys")
    g.add_argument("--max-loras", type=non_negative, default=0, metavar="L", help="default 0 (LoRA off)")
    g.add_argument("--no-specialize-lora", action="store_true", help="one graph set for LoRA and no-LoRA batches")
    g.add_argument("--specialize-active-loras", action="store_true",
                   help="a graph per power-of-two active adapter count")
    g.add_argument("--json", action="store_true", help="print JSON (errors too, as {\"error\": ...})")

    parser = _Parser(prog=PROG, description="Calculate vLLM's CUDA-graph policy.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{sizes,pad,dispatch,resolve}")

    def add(name, help_text):
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text, allow_abbrev=False)

    add("sizes", "the capture sizes")
    pad = add("pad", "the padded size and wasted tokens of a batch")
    pad.add_argument("--batch", type=count_or_range, required=True, metavar="B|A-B", help="tokens in the batch")
    dispatch = add("dispatch", "the runtime mode and graph key of a batch (the mode comes from --mode)")
    dispatch.add_argument("--num-tokens", dest="num_real_tokens", type=count_or_range, metavar="T|A-B",
                          help="tokens in the batch; with a range and --uniform only multiples of q are rows")
    dispatch.add_argument("--query-lens", type=size_list, metavar="1,1,2",
                          help="each request's tokens this step, instead of --num-tokens/--num-reqs/--uniform: "
                               "uniform is decided from them as vLLM decides it")
    dispatch.add_argument("--has-prefill", action="store_true",
                          help="with --query-lens: a request is a prompt chunk (V2 then never takes a decode graph)")
    dispatch.add_argument("--num-reqs", dest="num_real_rows", type=positive, metavar="R",
                          help="requests in the batch (single --num-tokens only). Default: num_real_tokens / q "
                               "with --uniform, else min(num_real_tokens, max_num_seqs)")
    dispatch.add_argument("--uniform", action="store_true", help="uniform decode: every request has q tokens")
    dispatch.add_argument("--num-active-loras", type=non_negative, default=0, metavar="N",
                          help="active adapters in the batch (needs --max-loras >= N)")
    resolve = add("resolve", "what --mode becomes given the attention backend's graph support")
    resolve.add_argument("--support", type=_enum(AttentionCGSupport.parse), required=True, metavar="LEVEL",
                         help=f"the weakest attention backend's support: {SUPPORTS}")
    resolve.add_argument("--no-piecewise", action="store_true",
                         help="attention is not in the splitting ops, so no PIECEWISE routine exists")
    resolve.add_argument("--empty-splitting-ops", action="store_true", help="splitting_ops is empty")
    resolve.add_argument("--no-piecewise-capture", action="store_true",
                         help="piecewise graphs cannot be captured (no piecewise compilation, no breakable graphs), "
                              "whether or not attention is in the splitting ops")
    resolve.add_argument("--attention-quant-fusion", action="store_true",
                         help="vLLM's fuse_attn_quant under piecewise compilation: the splitting ops are emptied")
    resolve.add_argument("--release", choices=RELEASES, default="0.33", help="the vLLM release's rules (default 0.33)")
    return parser


def _config(args) -> PolicyConfig:
    defaults = compilation_defaults(args.optimization_level, enforce_eager=args.enforce_eager, mode=args.mode)
    args.mode, args.piecewise_compilation = defaults.mode, defaults.piecewise_compilation
    config = PolicyConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        num_speculative_tokens=args.num_speculative_tokens, platform_max=args.platform_max,
        capture_sizes=() if args.enforce_eager else args.sizes,
        max_capture_size=defaults.max_capture_size if args.enforce_eager else args.max_capture_size, mode=args.mode,
        max_loras=args.max_loras, specialize_lora=not args.no_specialize_lora,
        specialize_active_loras=args.specialize_active_loras, runner=args.runner,
        speculative_schedule=args.speculative_schedule,
    )
    if args.compile_sizes is not None:
        check_compile_sizes(args.compile_sizes, capture_sizes(config), config.mode)
    return config


def _header(config: PolicyConfig, sizes: list[int]) -> str:
    if config.mode is CUDAGraphMode.NONE:
        source = "mode NONE captures nothing"
    elif config.capture_sizes is not None:
        source = "user sizes"
    elif config.max_capture_size is not None:
        source = f"user max {config.max_capture_size}"
    else:
        source = f"cap {default_cap(config)}"
    q = f", q {config.query_len}" if config.query_len > 1 else ""
    return f"{source}{q}, {len(sizes)} sizes"


# -- subcommands: each returns (JSON data, human text) ------------------------------------------
def cmd_sizes(args, config):
    sizes = capture_sizes(config)
    body = textwrap.fill(", ".join(map(str, sizes)), width=78, initial_indent="  ", subsequent_indent="  ")
    largest = max(sizes, default=0)
    text = f"{_header(config, sizes)} (max {largest})\n{body}".rstrip()
    return {"sizes": sizes, "count": len(sizes), "max_capture_size": largest}, text


def cmd_pad(args, config):
    sizes = capture_sizes(config)
    table = PaddingTable(sizes)
    rows, lines = [], []
    for batch in _values(args.batch):
        p = table.pad(batch)
        row = {"batch": batch, "padded": p.padded, "waste_tokens": p.waste_tokens,
               "waste_pct": round(p.waste_pct, 2), "runs": p.runs}
        rows.append(row)
        if p.padded is None:
            why = "no graphs" if not sizes else f"above the max capture size {table.max_size}"
            lines.append(f"batch {batch} -> eager ({why}), no padding")
        else:
            lines.append(f"batch {batch} -> {p.padded}, waste {p.waste_tokens} tokens ({row['waste_pct']:.2f}%)")
    return _rows_out(args.batch, rows, lines, _header(config, sizes))


def cmd_dispatch(args, config):
    q = config.query_len
    if args.query_lens is not None:
        if args.num_real_tokens is not None or args.num_real_rows is not None or args.uniform:
            raise UsageError("--query-lens gives the batch; drop --num-tokens, --num-reqs and --uniform")
        args.uniform = is_uniform_decode(args.query_lens, q, has_prefill=args.has_prefill, runner=config.runner)
        args.num_real_tokens, args.num_real_rows = sum(args.query_lens), len(args.query_lens)
    elif args.num_real_tokens is None:
        raise UsageError("dispatch needs --num-tokens (or --query-lens)")
    values = _values(args.num_real_tokens)
    is_range = isinstance(args.num_real_tokens, tuple)
    if args.num_real_rows is not None and is_range:
        raise UsageError("--num-reqs needs a single --num-tokens; drop it to use the default for each row")
    if args.num_active_loras and args.num_active_loras > config.max_loras:
        # With LoRA off the policy would just miss every key; say so instead.
        raise UsageError(f"--num-active-loras {args.num_active_loras} needs --max-loras >= {args.num_active_loras}")
    if args.uniform and config.speculative_schedule is None:
        # A uniform decode step is num_real_rows requests of q tokens each.
        if not is_range and values[0] % q:
            raise UsageError(f"--uniform needs --num-tokens to be a multiple of q = {q} "
                             f"(1 + --num-speculative-tokens), got {values[0]}")
        values = [t for t in values if t % q == 0]
        if not values:
            raise UsageError(f"--num-tokens {args.num_real_tokens[0]}-{args.num_real_tokens[1]} holds no multiple of "
                             f"q = {q}; --uniform rows need num_real_tokens = q * num_real_rows")
    dispatcher = Dispatcher(config)
    dispatcher.initialize_keys()
    rows, lines = [], []
    for tokens in values:
        reqs = args.num_real_rows if args.num_real_rows is not None else (
            tokens // q if args.uniform else min(tokens, config.max_num_seqs))
        mode, key = dispatcher.dispatch(tokens, reqs, args.uniform, args.num_active_loras)
        rows.append({"runtime_mode": mode.name, "descriptor": asdict(key)})
        batch = f"{tokens} tokens, {reqs} reqs, {'uniform' if args.uniform else 'mixed'}"
        if mode is CUDAGraphMode.NONE:
            lines.append(f"{batch} -> NONE (eager, unpadded)")
        else:
            lora = f"{key.num_active_loras} active LoRAs" if key.has_lora else "no LoRA"
            kind = "uniform" if key.uniform else "mixed"
            reqs_text = "any reqs" if key.num_padded_rows is None else f"{key.num_padded_rows} reqs"
            lines.append(f"{batch} -> {mode.name}, key {key.num_padded_tokens} tokens, {reqs_text}, {kind}, {lora}")
    header = f"{dispatcher.mode.name}, " + (_header(config, dispatcher.sizes) if dispatcher.sizes else "no graphs")
    return _rows_out(args.num_real_tokens, rows, lines, header)


def cmd_resolve(args, config):
    piecewise_capture = None if args.piecewise_compilation and not args.no_piecewise_capture else False
    res = resolve_mode(args.mode, args.support, num_speculative_tokens=args.num_speculative_tokens,
                       attention_in_splitting_ops=not args.no_piecewise and args.piecewise_compilation,
                       splitting_ops_empty=args.empty_splitting_ops, piecewise_capture=piecewise_capture,
                       attention_quant_fusion=args.attention_quant_fusion, release=args.release)
    data = {"requested": res.requested.name, "resolved": res.resolved.name, "warnings": list(res.warnings)}
    text = "\n".join([f"{res.requested.name} + {args.support.name} -> {res.resolved.name}"]
                     + [f"warning: {w}" for w in res.warnings])
    return data, text


def _rows_out(arg, rows, lines, header):
    """A single value prints one object and one line; a range a list and a line per row."""
    if isinstance(arg, tuple):
        return rows, "\n".join([header] + lines)
    return rows[0], f"{header}; {lines[0]}"


COMMANDS = {"sizes": cmd_sizes, "pad": cmd_pad, "dispatch": cmd_dispatch, "resolve": cmd_resolve}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv  # known even when parsing fails (abbreviations are off)
    try:
        args = build_parser().parse_args(argv)
        # Every subcommand validates the whole config, so a bad option never passes silently.
        data, text = COMMANDS[args.command](args, _config(args))
    except (UsageError, ValueError) as exc:  # ValueError: the policy rejecting its inputs
        message = " ".join(str(exc).split())
        if as_json:
            print(json.dumps({"error": message}))
        else:
            print(f"error: {message}", file=sys.stderr)
        return 2
    print(json.dumps(data) if args.json else text)
    return 0


def run(argv: list[str] | None = None) -> int:
    """main(), quiet when its reader closes the pipe (`... | head`): exit 141 (128 + SIGPIPE), as a
    Unix tool killed by SIGPIPE does, with no traceback. (harness.reliability.pipes does the same for
    the harness's tools; the calculator imports nothing of the harness but its protocol.)"""
    try:
        status = main(argv)
        sys.stdout.flush()  # what is still buffered meets the closed pipe here, not at exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's own flush at exit must not raise again
        os.close(devnull)
        return 128 + signal.SIGPIPE
    return status
