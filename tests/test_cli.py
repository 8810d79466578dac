"""The policy calculator CLI (`python -m reference_runtime`), checked against SPEC 3-5.

Every expected number is written out from the SPEC, never computed by the code under test.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reference_runtime import cli

REPO = Path(__file__).resolve().parents[1]


def run_json(capsys, *argv):
    """Run with --json; return (exit code, parsed stdout)."""
    code = cli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1, f"JSON output must be one line: {out!r}"
    return code, json.loads(out)


def ok_json(capsys, *argv):
    code, data = run_json(capsys, *argv)
    assert code == 0, data
    return data


def run_text(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- SPEC 3: capture sizes ------------------------------------------------------------------------
@pytest.mark.parametrize("argv, count, max_size", [
    (["--max-num-seqs", "16"], 7, 32),
    (["--max-num-seqs", "32"], 11, 64),
    (["--max-num-seqs", "64"], 19, 128),
    (["--max-num-seqs", "128"], 35, 256),
    (["--max-num-seqs", "256"], 51, 512),
    (["--max-num-seqs", "1024", "--platform-max", "1024"], 83, 1024),
    (["--max-num-seqs", "264"], 52, 512),
    (["--max-num-seqs", "100"], 29, 200),
    (["--max-num-seqs", "1024"], 51, 512),
    (["--max-num-seqs", "264", "--platform-max", "1024", "--max-num-batched-tokens", "2048"], 53, 528),
    (["--max-num-seqs", "300", "--platform-max", "1024", "--max-num-batched-tokens", "2048"], 57, 592),
])
def test_sizes_counts(capsys, argv, count, max_size):
    data = ok_json(capsys, "sizes", *argv)
    assert data["count"] == count
    assert len(data["sizes"]) == count
    assert data["max_capture_size"] == max_size
    assert data["sizes"] == sorted(set(data["sizes"]))


def test_sizes_cap_32_list(capsys):
    assert ok_json(capsys, "sizes", "--max-num-seqs", "16")["sizes"] == [1, 2, 4, 8, 16, 24, 32]


def test_sizes_small_max_num_seqs(capsys):
    data = ok_json(capsys, "sizes", "--max-num-seqs", "8")
    assert data == {"sizes": [1, 2, 4, 8, 16], "count": 5, "max_capture_size": 16}


def test_sizes_off_grid_append(capsys):
    assert 300 in ok_json(capsys, "sizes", "--max-num-seqs", "300", "--platform-max", "1024",
                          "--max-num-batched-tokens", "2048")["sizes"]


@pytest.mark.parametrize("k, count", [("1", 50), ("2", 56), ("3", 49)])
def test_sizes_speculative_full_decode(capsys, k, count):
    # SPEC 3's q > 1 counts are vLLM's V1 model runner's: it rounds the sizes themselves.
    data = ok_json(capsys, "sizes", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
                   "--num-speculative-tokens", k, "--runner", "v1")
    assert data["count"] == count
    q = 1 + int(k)
    assert all(s % q == 0 for s in data["sizes"])  # FULL decode graphs hold whole requests
    if k == "2":
        assert data["max_capture_size"] == 504


@pytest.mark.parametrize("k, count", [("1", 51), ("2", 60), ("3", 51)])
def test_sizes_speculative_v2_not_rounded(capsys, k, count):
    # vLLM's V2 runner (its default) keeps the sizes and rounds only its decode keys (docs/runners.md).
    data = ok_json(capsys, "sizes", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
                   "--num-speculative-tokens", k, "--runner", "v2")
    assert data["count"] == count
    assert data["sizes"][:2] == [1, 2]
    assert ok_json(capsys, "sizes", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
                   "--num-speculative-tokens", k) == data  # v2 is the default


def test_sizes_speculative_piecewise_not_rounded(capsys):
    # Only FULL decode graphs round to multiples of q; PIECEWISE keeps 1 and 2 and gains n * q.
    data = ok_json(capsys, "sizes", "--num-speculative-tokens", "2", "--mode", "PIECEWISE")
    assert data["sizes"][:4] == [1, 2, 3, 4]


def test_sizes_user_max_truncates_to_grid(capsys):
    assert ok_json(capsys, "sizes", "--max-capture-size", "257")["max_capture_size"] == 256


def test_sizes_user_sizes_deduplicated_and_sorted(capsys):
    data = ok_json(capsys, "sizes", "--sizes", "8,4,1,2,4,8")
    assert data == {"sizes": [1, 2, 4, 8], "count": 4, "max_capture_size": 8}


def test_sizes_user_sizes_filtered_to_batched_tokens(capsys):
    data = ok_json(capsys, "sizes", "--max-num-seqs", "8", "--max-num-batched-tokens", "16",
                   "--sizes", "1,2,4,32")
    assert data["sizes"] == [1, 2, 4]


def test_sizes_user_max_matching_user_sizes_is_fine(capsys):
    assert ok_json(capsys, "sizes", "--sizes", "1,2,4", "--max-capture-size", "4")["max_capture_size"] == 4


def test_sizes_human(capsys):
    code, out, err = run_text(capsys, "sizes")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "cap 512, 51 sizes (max 512)"
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].strip().startswith("1, 2, 4, 8, 16,")
    assert lines[-1].strip().endswith("512")


# -- SPEC 4: padding ------------------------------------------------------------------------------
def test_pad_small_batch(capsys):
    data = ok_json(capsys, "pad", "--max-num-seqs", "64", "--batch", "5")
    assert data == {"batch": 5, "padded": 8, "waste_tokens": 3, "waste_pct": 37.5, "runs": "graph"}


def test_pad_large_batch(capsys):
    data = ok_json(capsys, "pad", "--max-num-seqs", "256", "--batch", "500")
    assert data == {"batch": 500, "padded": 512, "waste_tokens": 12, "waste_pct": 2.34, "runs": "graph"}


def test_pad_above_max_runs_eager(capsys):
    data = ok_json(capsys, "pad", "--batch", "600")
    assert data == {"batch": 600, "padded": None, "waste_tokens": 0, "waste_pct": 0.0, "runs": "eager"}


def test_pad_human(capsys):
    assert run_text(capsys, "pad", "--batch", "500") == (
        0, "cap 512, 51 sizes; batch 500 -> 512, waste 12 tokens (2.34%)\n", "")
    assert run_text(capsys, "pad", "--max-num-seqs", "64", "--batch", "5") == (
        0, "cap 128, 19 sizes; batch 5 -> 8, waste 3 tokens (37.50%)\n", "")
    assert run_text(capsys, "pad", "--batch", "600") == (
        0, "cap 512, 51 sizes; batch 600 -> eager (above the max capture size 512), no padding\n", "")


def test_pad_range(capsys):
    rows = ok_json(capsys, "pad", "--max-num-seqs", "64", "--batch", "5-9")
    assert [r["batch"] for r in rows] == [5, 6, 7, 8, 9]
    assert [r["padded"] for r in rows] == [8, 8, 8, 8, 16]
    assert [r["waste_tokens"] for r in rows] == [3, 2, 1, 0, 7]


def test_pad_range_across_the_max(capsys):
    rows = ok_json(capsys, "pad", "--batch", "512-513")
    assert [(r["padded"], r["runs"]) for r in rows] == [(512, "graph"), (None, "eager")]


def test_pad_single_value_range_is_a_list(capsys):
    assert ok_json(capsys, "pad", "--batch", "7-7") == [
        {"batch": 7, "padded": 8, "waste_tokens": 1, "waste_pct": 12.5, "runs": "graph"}]


def test_pad_range_human_one_line_per_row(capsys):
    code, out, _ = run_text(capsys, "pad", "--max-num-seqs", "64", "--batch", "5-7")
    assert code == 0
    assert out.splitlines() == [
        "cap 128, 19 sizes",
        "batch 5 -> 8, waste 3 tokens (37.50%)",
        "batch 6 -> 8, waste 2 tokens (25.00%)",
        "batch 7 -> 8, waste 1 tokens (12.50%)",
    ]


# -- SPEC 4: dispatch -----------------------------------------------------------------------------
def desc(num_padded_tokens, num_padded_rows, uniform=False, has_lora=False, num_active_loras=0):
    return {"num_padded_tokens": num_padded_tokens, "num_padded_rows": num_padded_rows, "uniform": uniform,
            "has_lora": has_lora, "num_active_loras": num_active_loras}


def test_dispatch_uniform_decode_full(capsys):
    data = ok_json(capsys, "dispatch", "--num-tokens", "5", "--uniform")
    assert data == {"runtime_mode": "FULL", "descriptor": desc(8, 8, uniform=True)}


def test_user_sizes_above_the_token_budget_capture_nothing(capsys):
    # As vLLM: the given sizes are filtered to <= max_num_batched_tokens; none left means no graphs.
    data = ok_json(capsys, "sizes", "--max-num-seqs", "8", "--max-num-batched-tokens", "16", "--sizes", "32")
    assert data == {"sizes": [], "count": 0, "max_capture_size": 0}


def test_dispatch_mixed_piecewise(capsys):
    data = ok_json(capsys, "dispatch", "--num-tokens", "5")
    assert data == {"runtime_mode": "PIECEWISE", "descriptor": desc(8, None)}


@pytest.mark.parametrize("runner, key", [("v1", desc(600, None)), ("v2", desc(600, 200))])
def test_dispatch_above_max_is_eager_unpadded(capsys, runner, key):
    # An eager step: V1 keys it by its size alone, V2 keeps its request count.
    data = ok_json(capsys, "dispatch", "--num-tokens", "600", "--num-reqs", "200", "--runner", runner)
    assert data == {"runtime_mode": "NONE", "descriptor": key}


def test_dispatch_plain_full_uses_mixed_keys(capsys):
    data = ok_json(capsys, "dispatch", "--mode", "FULL", "--num-tokens", "5", "--uniform")
    assert data == {"runtime_mode": "FULL", "descriptor": desc(8, 8, uniform=False)}


@pytest.mark.parametrize("runner, key", [("v1", desc(5, None)), ("v2", desc(5, 5))])
def test_dispatch_full_decode_only_mixed_runs_eager(capsys, runner, key):
    data = ok_json(capsys, "dispatch", "--mode", "FULL_DECODE_ONLY", "--num-tokens", "5", "--runner", runner)
    assert data == {"runtime_mode": "NONE", "descriptor": key}


@pytest.mark.parametrize("runner, key", [("v1", desc(5, None)), ("v2", desc(5, 5))])
def test_dispatch_mode_none(capsys, runner, key):
    data = ok_json(capsys, "dispatch", "--mode", "none", "--num-tokens", "5", "--uniform", "--runner", runner)
    assert data == {"runtime_mode": "NONE", "descriptor": key}


def test_dispatch_speculative_uniform_default_num_reqs(capsys):
    # q = 2: 6 tokens are 3 requests, padded to size 8 = 4 requests of 2.
    data = ok_json(capsys, "dispatch", "--num-speculative-tokens", "1", "--num-tokens", "6", "--uniform")
    assert data == {"runtime_mode": "FULL", "descriptor": desc(8, 4, uniform=True)}


@pytest.mark.parametrize("extra, active", [(["--specialize-active-loras"], 4), ([], 5)])
def test_dispatch_lora_rounds_active_count_up(capsys, extra, active):
    # max_loras 4: counts 1, 2, 4 and 5 with count specialisation, else only 5.
    data = ok_json(capsys, "dispatch", "--max-loras", "4", *extra, "--num-tokens", "5", "--uniform",
                   "--num-active-loras", "3")
    assert data == {"runtime_mode": "FULL",
                    "descriptor": desc(8, 8, uniform=True, has_lora=True, num_active_loras=active)}


def test_dispatch_range_mixed(capsys):
    rows = ok_json(capsys, "dispatch", "--num-tokens", "511-513")
    assert [r["runtime_mode"] for r in rows] == ["PIECEWISE", "PIECEWISE", "NONE"]
    assert [r["descriptor"]["num_padded_tokens"] for r in rows] == [512, 512, 513]


def test_dispatch_range_uniform_only_multiples_of_q(capsys):
    rows = ok_json(capsys, "dispatch", "--num-speculative-tokens", "1", "--num-tokens", "1-8", "--uniform")
    assert [r["runtime_mode"] for r in rows] == ["FULL"] * 4
    assert [(r["descriptor"]["num_padded_tokens"], r["descriptor"]["num_padded_rows"]) for r in rows] == [
        (2, 1), (4, 2), (8, 4), (8, 4)]
    assert all(r["descriptor"]["uniform"] for r in rows)


def test_dispatch_human(capsys):
    code, out, err = run_text(capsys, "dispatch", "--num-tokens", "5", "--uniform")
    assert code == 0 and err == ""
    assert out.count("\n") == 1
    assert "-> FULL, key 8 tokens, 8 reqs, uniform" in out


def test_dispatch_help_documents_num_reqs_default(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["dispatch", "--help"])
    assert exc.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "num_real_tokens / q with --uniform" in help_text
    assert "min(num_real_tokens, max_num_seqs)" in help_text


# -- SPEC 5: resolution ---------------------------------------------------------------------------
RESOLVE_TABLE = {  # requested -> resolved for ALWAYS, UNIFORM_BATCH, USTD, NEVER (None: error)
    "NONE": ["NONE", "NONE", "NONE", "NONE"],
    "PIECEWISE": ["PIECEWISE", "PIECEWISE", "PIECEWISE", "PIECEWISE"],
    "FULL": ["FULL", "FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", None],
    "FULL_DECODE_ONLY": ["FULL_DECODE_ONLY", "FULL_DECODE_ONLY", "FULL_DECODE_ONLY", "PIECEWISE"],
    "FULL_AND_PIECEWISE": ["FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", "PIECEWISE"],
}
SUPPORTS = ["ALWAYS", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE", "NEVER"]


@pytest.mark.parametrize("requested, support, resolved", [
    (req, sup, row[i]) for req, row in RESOLVE_TABLE.items() for i, sup in enumerate(SUPPORTS)
    if row[i] is not None
])
def test_resolve_table(capsys, requested, support, resolved):
    data = ok_json(capsys, "resolve", "--mode", requested, "--support", support)
    assert data["requested"] == requested
    assert data["resolved"] == resolved
    assert bool(data["warnings"]) == (resolved != requested)  # every downgrade warns


def test_resolve_full_uniform_batch_warns(capsys):
    data = ok_json(capsys, "resolve", "--mode", "FULL", "--support", "UNIFORM_BATCH")
    assert data["resolved"] == "FULL_AND_PIECEWISE"
    assert len(data["warnings"]) == 1


def test_resolve_full_never_is_an_error(capsys):
    code, data = run_json(capsys, "resolve", "--mode", "FULL", "--support", "NEVER")
    assert code == 2
    assert "PIECEWISE" in data["error"]


def test_resolve_full_never_human_error(capsys):
    code, out, err = run_text(capsys, "resolve", "--mode", "FULL", "--support", "NEVER")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "PIECEWISE" in err


@pytest.mark.parametrize("argv, resolved", [
    (["--mode", "FULL_DECODE_ONLY", "--support", "NEVER", "--no-piecewise"], "NONE"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "NEVER", "--no-piecewise"], "NONE"),
    (["--mode", "FULL", "--support", "UNIFORM_BATCH", "--no-piecewise"], "FULL_DECODE_ONLY"),
    (["--mode", "FULL", "--support", "USTD", "--no-piecewise"], "FULL_DECODE_ONLY"),
    (["--mode", "PIECEWISE", "--support", "ALWAYS", "--no-piecewise"], "NONE"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "ALWAYS", "--empty-splitting-ops"], "FULL"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "USTD", "--num-speculative-tokens", "1"], "PIECEWISE"),
    (["--mode", "FULL_DECODE_ONLY", "--support", "USTD", "--num-speculative-tokens", "1",
      "--no-piecewise"], "NONE"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "UNIFORM_BATCH", "--num-speculative-tokens", "1"],
     "FULL_AND_PIECEWISE"),
])
def test_resolve_variants(capsys, argv, resolved):
    data = ok_json(capsys, "resolve", *argv)
    assert data["resolved"] == resolved
    assert bool(data["warnings"]) == (resolved != data["requested"])


def test_resolve_human(capsys):
    code, out, err = run_text(capsys, "resolve", "--mode", "full", "--support", "ustd")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "FULL + UNIFORM_SINGLE_TOKEN_DECODE -> FULL_AND_PIECEWISE"
    assert len(lines) == 2 and lines[1].startswith("warning: ")


# -- bad arguments: exit 2, one line saying what is wrong, never a traceback ----------------------
BAD = [
    # (argv, a fragment the message must contain)
    (["sizes", "--max-num-seqs", "0"], ">= 1"),
    (["sizes", "--max-num-seqs", "-3"], ">= 1"),
    (["sizes", "--max-num-seqs", "abc"], "integer"),
    (["sizes", "--max-num-seqs", "2.5"], "integer"),
    (["sizes", "--platform-max", "0"], ">= 1"),
    (["sizes", "--num-speculative-tokens", "-1"], ">= 0"),
    (["sizes", "--max-loras", "-1"], ">= 0"),
    (["sizes", "--max-capture-size", "0"], ">= 1"),
    (["sizes", "--max-num-batched-tokens", "100"], "max_num_seqs"),
    (["sizes", "--mode", "SOMETIMES"], "FULL_AND_PIECEWISE"),
    (["sizes", "--sizes", ""], "comma-separated"),
    (["sizes", "--sizes", "1,x,4"], "comma-separated"),
    (["sizes", "--sizes", "0,2"], "comma-separated"),
    (["sizes", "--sizes", "1,2,4", "--max-capture-size", "8"], "max_capture_size"),
    (["sizes", "--max-num-seqs", "1", "--num-speculative-tokens", "600", "--runner", "v1"], "601"),
    (["sizes", "--runner", "v3"], "invalid choice"),
    (["sizes", "--bogus"], "unrecognized"),
    ([], "required"),
    (["table"], "invalid choice"),
    (["pad"], "--batch"),
    (["pad", "--batch", "0"], ">= 1"),
    (["pad", "--batch", "-5"], ">= 1"),
    (["pad", "--batch", "x"], "range A-B"),
    (["pad", "--batch", "9-5"], "A <= B"),
    (["pad", "--batch", "0-5"], "1 <= A"),
    (["dispatch", "--num-tokens", "0"], ">= 1"),
    (["dispatch", "--num-tokens", "8-4"], "A <= B"),
    (["dispatch", "--num-tokens", "5", "--num-reqs", "0"], ">= 1"),
    (["dispatch", "--num-tokens", "5", "--num-reqs", "10"], "num_real_rows"),
    (["dispatch", "--num-tokens", "5", "--uniform", "--num-speculative-tokens", "1"], "multiple of q = 2"),
    (["dispatch", "--num-tokens", "6", "--uniform", "--num-reqs", "2"], "q * num_real_rows"),
    (["dispatch", "--num-tokens", "5-6", "--uniform", "--num-speculative-tokens", "3"], "no multiple"),
    (["dispatch", "--num-tokens", "1-4", "--num-reqs", "1"], "single --num-tokens"),
    (["dispatch", "--num-tokens", "5", "--num-active-loras", "1"], "--max-loras"),
    (["dispatch", "--num-tokens", "5", "--max-loras", "2", "--num-active-loras", "3"], "--max-loras"),
    (["dispatch", "--num-tokens", "5", "--num-active-loras", "-1"], ">= 0"),
    (["resolve", "--mode", "FULL"], "--support"),
    (["resolve", "--support", "SOMETIMES"], "ALWAYS"),
    (["resolve", "--mode", "HALF", "--support", "ALWAYS"], "FULL_AND_PIECEWISE"),
]


@pytest.mark.parametrize("argv, fragment", BAD)
def test_bad_arguments_json(capsys, argv, fragment):
    code, data = run_json(capsys, *argv)
    assert code == 2
    assert list(data) == ["error"]
    assert fragment in data["error"]


@pytest.mark.parametrize("argv, fragment", BAD)
def test_bad_arguments_human(capsys, argv, fragment):
    code, out, err = run_text(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert fragment in err


# -- the module entry point -----------------------------------------------------------------------
def test_python_m_entry_point():
    def run(*argv):
        return subprocess.run([sys.executable, "-X", "importtime", "-m", "reference_runtime", *argv],
                              cwd=REPO, capture_output=True, text=True, timeout=60)

    good = run("pad", "--batch", "500", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["padded"] == 512
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in good.stderr.splitlines()}
    assert "torch" not in imported  # the CLI must start without torch

    bad = run("pad", "--batch", "0")
    assert bad.returncode == 2
    assert bad.stdout == ""
    messages = [line for line in bad.stderr.splitlines() if not line.startswith("import time:")]
    assert len(messages) == 1 and messages[0].startswith("error: ")
    assert "Traceback" not in bad.stderr


# -- vLLM's compilation settings and the finer resolution inputs (docs/spec.md 2.3, 3.8, 4.8, 5.3) --
@pytest.mark.parametrize("argv, resolved", [
    (["--mode", "FULL_AND_PIECEWISE", "--support", "ALWAYS", "--no-piecewise"], "FULL_DECODE_ONLY"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "ALWAYS", "--no-piecewise", "--release", "0.25"], "NONE"),
    (["--mode", "FULL", "--support", "UNIFORM_BATCH", "--no-piecewise-capture"], "FULL_DECODE_ONLY"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "UNIFORM_BATCH", "--no-piecewise-capture"], "FULL_DECODE_ONLY"),
    (["--mode", "PIECEWISE", "--support", "ALWAYS", "--attention-quant-fusion"], "FULL"),
    (["--mode", "FULL_AND_PIECEWISE", "--support", "UNIFORM_BATCH", "--attention-quant-fusion"], "FULL_DECODE_ONLY"),
    (["--support", "ALWAYS", "-O0"], "NONE"),
    (["--support", "ALWAYS", "-O1"], "PIECEWISE"),
    (["--support", "ALWAYS", "-O3"], "FULL_AND_PIECEWISE"),
    (["--support", "ALWAYS", "-O0", "--mode", "FULL_AND_PIECEWISE"], "FULL_DECODE_ONLY"),
    (["--support", "ALWAYS", "--enforce-eager", "--mode", "FULL"], "NONE"),
])
def test_resolve_compilation_settings(capsys, argv, resolved):
    assert ok_json(capsys, "resolve", *argv)["resolved"] == resolved


def test_enforce_eager_captures_nothing(capsys):
    assert ok_json(capsys, "sizes", "--enforce-eager") == {"sizes": [], "count": 0, "max_capture_size": 0}


def test_a_max_of_zero_goes_with_mode_none(capsys):
    assert ok_json(capsys, "sizes", "--mode", "NONE", "--max-capture-size", "0")["max_capture_size"] == 0
    code, data = run_json(capsys, "sizes", "--max-capture-size", "0")
    assert code == 2 and "give a max >= 1, or mode NONE" in data["error"]


def test_compile_sizes_that_padding_moves_are_one_clear_error(capsys):
    code, out, err = run_text(capsys, "sizes", "--max-num-seqs", "8", "--compile-sizes", "1,2,3")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "compile_sizes holds 3, which cudagraph padding would run at 4" in err
    assert ok_json(capsys, "sizes", "--max-num-seqs", "8", "--compile-sizes", "1,2,4,100")["count"] == 5


@pytest.mark.parametrize("argv, mode, uniform", [
    (["--query-lens", "2,2,2", "--num-speculative-tokens", "1"], "FULL", True),
    (["--query-lens", "2,1,2", "--num-speculative-tokens", "1"], "PIECEWISE", False),
    (["--query-lens", "2,2,2", "--num-speculative-tokens", "1", "--has-prefill"], "PIECEWISE", False),
    (["--query-lens", "2,2,2", "--num-speculative-tokens", "1", "--has-prefill", "--runner", "v1"], "FULL", True),
    (["--query-lens", "1,1,1,1,1,1,1,1,1", "--max-num-seqs", "8", "--sizes", "1,2,4,8"], "NONE", True),
])
def test_dispatch_decides_uniform_from_the_requests(capsys, argv, mode, uniform):
    data = ok_json(capsys, "dispatch", *argv)
    assert data["runtime_mode"] == mode
    assert data["descriptor"]["uniform"] == (uniform and mode == "FULL")


def test_more_requests_than_max_num_seqs_dispatch_like_vllm(capsys):
    data = ok_json(capsys, "dispatch", "--num-tokens", "10", "--num-reqs", "10", "--max-num-seqs", "8",
                   "--max-num-batched-tokens", "64", "--sizes", "1,2,4,8,16")
    assert data["runtime_mode"] == "PIECEWISE"  # no FULL key holds 10 requests; the piecewise one does


def test_query_lens_replace_the_batch_options(capsys):
    code, data = run_json(capsys, "dispatch", "--query-lens", "1,1", "--num-tokens", "2")
    assert code == 2 and "drop --num-tokens" in data["error"]
    code, data = run_json(capsys, "dispatch")
    assert code == 2 and "needs --num-tokens" in data["error"]


def test_a_dynamic_speculative_schedule_gives_each_q_its_sizes(capsys):
    argv = ["--max-num-seqs", "17", "--num-speculative-tokens", "4", "--max-num-batched-tokens", "32768"]
    static = ok_json(capsys, "sizes", *argv)["sizes"]
    dynamic = ok_json(capsys, "sizes", *argv, "--speculative-schedule", "1-2:4,5-5:1")["sizes"]
    assert 34 in dynamic and 34 not in static  # 17 requests of q = 2 (the tail after batch 5)
    data = ok_json(capsys, "dispatch", "--num-tokens", "6", "--num-reqs", "3", "--uniform", "--max-num-seqs", "8",
                   "--num-speculative-tokens", "3", "--speculative-schedule", "1-2:3,3-8:1")
    assert data == {"runtime_mode": "FULL", "descriptor": {"num_padded_tokens": 8, "num_padded_rows": 4, "uniform": True,
                                                           "has_lora": False, "num_active_loras": 0}}


@pytest.mark.parametrize("text, words", [
    ("1-x", "expected FIRST-LAST:K entries"), ("2-5:1", "must start at batch size 1"), ("1-4:1,3-8:2", "overlap")])
def test_a_bad_speculative_schedule_is_one_line(capsys, text, words):
    code, data = run_json(capsys, "sizes", "--num-speculative-tokens", "2", "--speculative-schedule", text)
    assert code == 2 and words in data["error"]
