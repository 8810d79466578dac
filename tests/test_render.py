"""Self-tests of the report renderer (`harness.reports.render`, `python -m harness.reports.render`).

Runs are small dicts written here with literal numbers, in the shape RunReport writes; every
expected figure is worked out by hand in a comment, never by the code under test. The last tests
run real pytest sessions through the installed plugin.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from harness.reports import measurements
from harness.reports import records
from harness.reports import render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
H200 = "NVIDIA H200 (torch 2.11.0+cu130, CUDA 13.0)"
# vLLM's default grid for max_num_seqs=256 (SPEC 3): [1, 2, 4] + 8..248 step 8 + 256..512 step 16.
VLLM_GRID_256 = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160,
                 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, 288, 304, 320, 336, 352, 368, 384,
                 400, 416, 432, 448, 464, 480, 496, 512]
# (batch, eager ms, PIECEWISE ms, FULL ms, summed eager kernel ms at FULL's shape)
# eager/FULL: 6.00, 5.00, 2.20, 1.40, 1.0667 -> below 1.5x from 128, below 1.1x from 256.
LATENCY_SERIES = [(1, 6.0, 4.0, 1.0, 0.8), (8, 6.0, 4.2, 1.2, 1.0), (64, 6.6, 4.6, 3.0, 2.7),
                  (128, 7.0, 5.6, 5.0, 4.5), (256, 8.0, 7.8, 7.5, 7.0)]


def case(nodeid, outcome="passed", **extra) -> dict:
    return {"nodeid": nodeid, "outcome": outcome, "duration": 0.1, **extra}


def measured(kind, value, nodeid="suites/test_x.py::test_measure[reference]") -> dict:
    return case(nodeid, records=[{"kind": kind, **v} for v in (value if isinstance(value, list) else [value])])


def make_run(tests, runtime="reference", device=H200, complete=True) -> dict:
    return {"schema_version": records.SCHEMA_VERSION, "runtime": runtime, "version": "0.1.0", "capabilities": {"capture_sizes": True, "execution": False},
            "device": device, "torch": "2.11.0", "python": "3.12.3",
            "git_commit": "0123456789abcdef0123456789abcdef01234567", "args": ["suites/"], "started": 0.0,
            "seconds": 12.5, "complete": complete, "summary": dict(Counter(t["outcome"] for t in tests)),
            "tests": list(tests)}


def latency_tests(series=LATENCY_SERIES, runtime="reference") -> list[dict]:
    tests = []
    for batch, eager, piecewise, full, floor in series:
        for mode, ms in (("eager", eager), ("piecewise", piecewise), ("full", full)):
            extra = {"pipelined_ms": 0.9 * ms, "replay_ms_median": 0.85 * ms} if mode == "full" else {}
            tests.append(measured("latency", {
                "mode": mode, "batch": batch, "padded": batch, "runtime_mode": mode.upper(), "kernel_launches": 10,
                "graph_launches": 1, "memcpy_calls": 2, "eager_kernel_ms": floor, "step_ms_median": ms,
                "step_ms_min": ms, "rounds": 30, "step_ms_cv": 0.05 if (mode, batch) == ("eager", 1) else 0.01, **extra,
            }, nodeid=f"suites/test_step_latency.py::test_decode_step_latency[{runtime}-{mode}-b={batch}]"))
    return tests


def serving_tests(piecewise_tok_s=1898.67, full_tok_s=1992.27) -> list[dict]:
    # vLLM PR #20059's FA2 figures: +4.9% output tok/s, mean TPOT 17.08 -> 16.57 ms (-3.0%).
    def entry(mode, tok_s, tpot):
        return {"mode": mode, "requests": 100, "seconds": 10.87, "steps": 900, "output_tok_s": tok_s,
                "total_tok_s": 2 * tok_s, "requests_s": 9.2, "mean_ttft_ms": 78.69, "mean_tpot_ms": tpot,
                "p99_tpot_ms": 78.21, "mean_itl_ms": 12.83}
    return [measured("serving", entry("piecewise", piecewise_tok_s, 17.08), "suites/test_serving.py::t[piecewise]"),
            measured("serving", entry("full_and_piecewise", full_tok_s, 16.57), "suites/test_serving.py::t[fap]")]


def render_runs(tmp_path, *runs, **kwargs) -> str:
    """The Markdown of the runs, without plots: drawing them is most of a render, and the plot tests
    below call write_report themselves."""
    rendered = render.write_report(list(runs), tmp_path, plots=False, **kwargs)
    return rendered.markdown.read_text()


# -- header and conformance ----------------------------------------------------------------------


def test_matrix_has_one_column_per_run_and_readable_cells(tmp_path):
    reference = make_run([
        *(case(f"suites/test_padding.py::test_p[reference-{i}]") for i in range(3)),
        case("suites/test_dispatch.py::test_d[reference-0]", "failed", reason="boom"),
        case("suites/test_dispatch.py::test_d[reference-1]"),
        case("suites/test_dispatch.py::test_d[reference-2]"),
    ])
    skip = "Skipped: runtime 'myengine' does not declare capability capture_sizes, which the padding suite needs"
    myengine = make_run([case(f"suites/test_padding.py::test_p[myengine-{i}]", "skipped", reason=skip) for i in range(3)],
                        runtime="myengine", device="cpu (x86_64), policy only")
    markdown = render_runs(tmp_path, reference, myengine)

    assert markdown.startswith("# Conformance report: reference 0.1.0, myengine 0.1.0\n")
    assert "| suite | reference @ H200 | myengine @ cpu |" in markdown
    assert "| suites/test_dispatch.py | 1 failed, 2 passed | not run |" in markdown
    # The skip reason loses its "Skipped: " prefix and is cut at 60 characters.
    assert ("| suites/test_padding.py | 3 passed | skipped (runtime 'myengine' does not declare capability "
            "capture_sizes…) |") in markdown
    assert "- complete; 12.5 s; 1 failed, 5 passed" in markdown
    assert "commit 0123456789ab," not in markdown and "commit 0123456789ab\n" in markdown


def test_two_runs_of_one_runtime_on_one_device_get_distinct_columns(tmp_path):
    run = make_run([case("suites/test_padding.py::test_p[reference]")])
    assert "| suite | reference @ H200 #1 | reference @ H200 #2 |" in render_runs(tmp_path, run, run)


def test_failures_show_the_reason_and_a_reproduction_command(tmp_path):
    with_line = "\n".join([*(f"frame {i:02d}" for i in range(40)),
                           "  reproduce: pytest 'suites/test_padding.py::test_p[bad-seqs8]' --runtime tests.broken:Bad"])
    run = make_run([
        case("suites/test_padding.py::test_p[bad-seqs8]", "failed", reason=with_line),
        case("suites/test_fallback.py::test_f[bad]", "error", reason="fixture 'engines' raised"),
    ], runtime="bad")
    markdown = render_runs(tmp_path, run)

    assert "### suites/test_padding.py::test_p[bad-seqs8]" in markdown
    assert "```sh\npytest 'suites/test_padding.py::test_p[bad-seqs8]' --runtime tests.broken:Bad\n```" in markdown
    # The last 25 lines of the reason: frames 16..39 and the reproduce line.
    assert "frame 16" in markdown and "frame 15" not in markdown
    # Without a "reproduce:" line the command is built from the node id and the runtime.
    assert "error; reproduce:" in markdown
    assert "```sh\npytest 'suites/test_fallback.py::test_f[bad]' --runtime bad\n```" in markdown


def test_an_incomplete_run_says_so(tmp_path):
    markdown = render_runs(tmp_path, make_run([case("suites/test_padding.py::test_p[reference]")], complete=False))
    assert "> INCOMPLETE: reference @ H200 stopped early" in markdown
    assert "- INCOMPLETE (the run stopped early); 12.5 s; 1 passed" in markdown


# -- measurements --------------------------------------------------------------------------------


def test_padding_section_for_vllms_grid(tmp_path):
    markdown = render_runs(tmp_path, make_run([measured("grid", {"config": "max_num_seqs=256", "sizes": VLLM_GRID_256})]))
    assert "Grid `max_num_seqs=256`: 51 sizes, largest 512; worst waste 43.75% (batch 9 -> 16)." in markdown
    assert "SPEC check: batch 500 -> padded 512, waste 12 tokens (2.34%)" in markdown
    assert "| 5..8 | 8 | 3 | 37.50% |" in markdown  # 3 of 8 rows padding at batch 5
    assert "| 497..512 | 512 | 15 | 2.93% |" in markdown  # 15 / 512
    assert "| 1 | 1 | 0 | 0.00% |" in markdown


def test_batch_500_above_a_small_grid_runs_eager():
    assert measurements.waste_line([1, 2, 4, 8]) == "batch 500 -> above the largest size 8: runs eager, unpadded"


def test_resolution_table_always_has_the_four_support_columns(tmp_path):
    def resolved(requested, support, result, variant="default"):
        return measured("resolution", {"variant": variant, "requested": requested, "support": support,
                                       "resolved": result}, nodeid=f"suites/test_mode_resolution.py::t[{requested}-{support}-{variant}]")
    run = make_run([
        resolved("FULL", "ALWAYS", "FULL"), resolved("FULL", "UNIFORM_BATCH", "FULL_AND_PIECEWISE"),
        resolved("FULL", "NEVER", "error"), resolved("NONE", "NEVER", "NONE"),
        resolved("PIECEWISE", "NEVER", "NONE", variant="no attention in splitting_ops"),
    ])
    markdown = render_runs(tmp_path, run)
    assert ("| requested \\ support | ALWAYS | UNIFORM_BATCH | UNIFORM_SINGLE_TOKEN_DECODE | NEVER |\n"
            "|---|---|---|---|---|\n"
            "| NONE | — | — | — | NONE |\n"
            "| FULL | FULL | FULL_AND_PIECEWISE | — | error |\n") in markdown
    assert "Variant `no attention in splitting_ops`" in markdown
    assert "| requested \\ support | NEVER |\n|---|---|\n| PIECEWISE | NONE |\n" in markdown


def test_latency_table_headline_and_crossover(tmp_path):
    run = make_run([*latency_tests(), measured("batch1_speedup", {"eager_ms": 6.0, "full_ms": 1.0, "speedup": 6.0})])
    markdown = render_runs(tmp_path, run)

    assert "- eager / FULL speed-up: 6.00x at batch 1, 2.20x at batch 64, 1.07x at batch 256" in markdown
    # FULL at batch 1: step 1.0, in a stream 0.9, replay 0.85 ms; eager kernels 0.8 ms.
    assert ("- FULL at batch 1, against the summed GPU kernel time of an eager step: step (then wait) 1.25x, "
            "step in a stream 1.12x, its graph replay (device time, in a stream) 1.06x") in markdown
    assert "- crossover: eager / FULL below 1.5x from batch 128" in markdown  # 7.0 / 5.0 = 1.40
    assert "- crossover: eager / FULL below 1.1x from batch 256" in markdown  # 8.0 / 7.5 = 1.07
    assert "Batch-1 check: eager 6.000 ms, FULL 1.000 ms, 6.00x." in markdown
    assert "| 64 | 64 | 6.600 | 4.600 | 3.000 | 2.700 | 2.550 | 2.700 | 2.20x | 1.11x | 1.00x |" in markdown
    # Coefficients of variation 0.01 and 0.05 in the series: the median of 15 figures is 0.01.
    assert "- noise: coefficient of variation of the step timings, median 1.0%, largest 5.0% (15 figures)" in markdown


def test_crossover_not_reached_when_graphs_always_pay(tmp_path):
    steady = [(1, 6.0, 4.0, 1.0, 0.8), (256, 9.0, 8.5, 6.0, 5.5)]  # 6.00x and 1.50x: never below 1.5x
    rows = measurements.latency_rows(make_run(latency_tests(steady)))
    assert [measurements.crossover(rows, 1.5), measurements.crossover(rows, 1.1)] == [None, None]
    markdown = render_runs(tmp_path, make_run(latency_tests(steady)))
    assert "- crossover: eager / FULL below 1.5x not reached" in markdown
    assert "- crossover: eager / FULL below 1.1x not reached" in markdown


def test_capture_launches_serving_and_batch_invariance_sections(tmp_path):
    capture = {"mode": "FULL_AND_PIECEWISE", "preset": "small", "graphs": {"FULL": 35, "PIECEWISE": 459},
               "seconds": 2.02, "memory_bytes": 1495269376, "graph_backend": "cuda",
               "observed_captures": 494}  # 1495269376 / 2**30 = 1.39 GiB
    launches = {"batch": 4, "graph_backend": "emulated",
                "counts": {"NONE": {"kernels": 163, "graphs": 0, "copies": 4, "ops_in_graphs": 0},
                           "FULL": {"kernels": 4, "graphs": 1, "copies": 4, "ops_in_graphs": 150}}}
    invariance = [{"batch": 5, "padded": 8, "mode": "FULL", "difference": 1e-6},
                  {"batch": 7, "padded": 8, "mode": "FULL", "difference": 3e-6}]
    run = make_run([measured("capture", capture, "suites/test_capture_accounting.py::t[a]"),
                    measured("capture", capture, "suites/test_capture_accounting.py::t[b]"),  # the same: one row
                    measured("launches", launches), measured("batch_invariance", invariance), *serving_tests()])
    markdown = render_runs(tmp_path, run)

    assert "| FULL_AND_PIECEWISE | small | cuda | 35 | 459 | 494 | 2.02 | 1.39 GiB |" in markdown
    assert markdown.count("| FULL_AND_PIECEWISE | small |") == 1
    assert "| 4 | FULL | 4 | 1 | 150 | 4 | emulator: aten ops |" in markdown
    assert ("| mode | requests | duration (s) | steps | req/s | output tok/s | total tok/s | mean TTFT (ms) | "
            "mean TPOT (ms) | P99 TPOT (ms) | mean ITL (ms) |") in markdown
    assert "| piecewise | 100 | 10.87 | 900 | 9.20 | 1,898.67 | 3,797.34 | 78.69 | 17.08 | 78.21 | 12.83 |" in markdown
    assert "FULL_AND_PIECEWISE vs PIECEWISE: output tok/s +4.9%, mean TPOT -3.0%" in markdown
    assert "| 8 | FULL | 5, 7 | 3e-06 |" in markdown
    assert ("Not recorded in this run: grid (test_padding.py did not run); resolution (test_mode_resolution.py "
            "did not run); anchor (test_numerical_anchor.py did not run); latency (test_step_latency.py did not "
            "run); batch1_speedup (test_step_latency.py did not run).") in markdown


def test_a_measurement_whose_suite_ran_and_recorded_nothing_says_so(tmp_path):
    run = make_run([case("suites/test_padding.py::test_spec_waste_examples[reference]", "skipped",
                         reason="runtime 'reference' does not declare capability vllm_rules"),
                    case("suites/test_serving.py::t[eager]", "passed")])
    markdown = render_runs(tmp_path, run)
    assert "grid (test_padding.py was skipped)" in markdown
    assert "serving (test_serving.py ran (1 passed) but recorded nothing)" in markdown


def test_reports_of_schema_version_1_are_converted(tmp_path):
    # Version 1 stored raw properties: one scalar per batch in the oldest form, a record-like dict later.
    old = make_run([case("suites/test_batch_invariance.py::t[reference]", properties={
        "batch_invariance b=5 pad=8 FULL": 2e-6, "batch_invariance b=6 pad=8 FULL": 0.0}),
        case("suites/test_padding.py::t[reference]", properties={"grid": {"config": "c", "sizes": [1, 2, 4]}})])
    del old["schema_version"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    run = render.load_run(path)
    assert run["converted_from"] == 1
    assert measurements.recorded(run, "grid") == [{"config": "c", "sizes": [1, 2, 4]}]
    assert "| 8 | FULL | 5, 6 | 2e-06 |" in render_runs(tmp_path, run)


def test_a_report_from_a_newer_harness_is_refused(tmp_path):
    path = tmp_path / "new.json"
    path.write_text(json.dumps({**make_run([]), "schema_version": records.SCHEMA_VERSION + 1}))
    with pytest.raises(render.RunFileError, match="schema_version 3; this harness reads up to 2"):
        render.load_run(path)


def test_plots_are_png_files_linked_from_the_markdown(tmp_path):
    run = make_run([*latency_tests(), measured("grid", {"config": "max_num_seqs=256", "sizes": VLLM_GRID_256})])
    rendered = render.write_report([run], tmp_path)
    names = ["latency-reference-H200.png", "speedup-reference-H200.png", "padding-waste-reference-H200.png"]
    assert sorted(p.name for p in rendered.plots) == sorted(names)
    markdown = rendered.markdown.read_text()
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == PNG_SIGNATURE
        assert f"]({name})" in markdown


def test_plots_asked_away_are_not_drawn_or_linked(tmp_path):
    run = make_run([*latency_tests(), measured("grid", {"config": "max_num_seqs=256", "sizes": VLLM_GRID_256})])
    rendered = render.write_report([run], tmp_path, plots=False)
    assert rendered.plots == [] and [p.name for p in tmp_path.iterdir()] == ["summary.md"]
    markdown = rendered.markdown.read_text()
    assert ".png" not in markdown and "### Padding" in markdown


def test_no_plots_without_latency_or_grid(tmp_path):
    render.write_report([make_run([case("suites/test_dispatch.py::test_d[reference]")])], tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]


# -- baseline ------------------------------------------------------------------------------------


def test_compare_flags_a_20_percent_slowdown_and_not_a_5_percent_one(tmp_path):
    baseline = make_run([*latency_tests([(1, 6.0, 4.0, 1.0, 0.8)]), *serving_tests(2000.0, 2000.0)])
    # FULL at batch 1: 1.0 -> 1.2 ms (20% slower); eager 6.0 -> 6.3 ms (5%); PIECEWISE unchanged.
    # Serving: piecewise 2000 -> 1900 tok/s (5% lower), full_and_piecewise 2000 -> 1600 (20% lower).
    current = make_run([*latency_tests([(1, 6.3, 4.0, 1.2, 0.8)]), *serving_tests(1900.0, 1600.0)])
    regressions = render.compare([current], [baseline], threshold=0.10)

    assert [(r["kind"], r["mode"], r["batch"], r["metric"]) for r in regressions] == [
        ("latency", "full", 1, "step_ms_median"), ("serving", "full_and_piecewise", "100 requests", "output_tok_s")]
    assert [round(r["change"], 6) for r in regressions] == [0.2, 0.2]
    markdown = render_runs(tmp_path, current, regressions=regressions)
    assert "## Regressions against baseline" in markdown
    assert "- reference @ H200: latency full batch 1: step_ms_median 1.000 -> 1.200 (20.0% worse, the bar 10.0%)" in markdown


def capture_of(preset: str) -> dict:
    return measured("capture", {"mode": "FULL_AND_PIECEWISE", "preset": preset, "graphs": {"FULL": 1}},
                    nodeid="suites/test_step_latency.py::test_decode_step_latency[reference-full-b=1]")


def test_compare_matches_the_same_model_and_the_same_request_stream():
    """A medium run is not slower than a small baseline, and a stream of 100 requests is not less
    throughput than one of 200: such pairs are not compared at all."""
    small = make_run([capture_of("small"), *latency_tests([(1, 6.0, 4.0, 1.0, 0.8)]), *serving_tests(2000.0, 2000.0)])
    medium = make_run([capture_of("medium"), *latency_tests([(1, 12.0, 8.0, 2.0, 1.6)])])
    assert render.compare([medium], [small]) == []
    assert render.compare([medium], [small, medium]) == []  # its own model's baseline is found among others
    longer = make_run([capture_of("small"), *serving_tests(4000.0, 4000.0)])
    for test in longer["tests"]:
        for entry in test["records"]:
            if entry["kind"] == "serving":
                entry["requests"] = 200
    assert render.compare([small], [longer]) == []
    assert [r["kind"] for r in render.compare([small], [make_run([capture_of("small"), *serving_tests(4000.0, 4000.0)])])] \
        == ["serving", "serving"]
    assert render.run_labels([small, medium]) == ["reference @ H200 (small)", "reference @ H200 (medium)"]


def test_no_regression_beyond_the_threshold_is_said_plainly(tmp_path):
    run = make_run(latency_tests([(1, 6.0, 4.0, 1.0, 0.8)]))
    assert render.compare([run], [run]) == []
    assert "## Regressions against baseline\n\nnone beyond 10%." in render_runs(tmp_path, run, regressions=[])


# -- the command line ----------------------------------------------------------------------------


def write_json(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_cli_writes_summary_and_fails_on_regression(tmp_path, capsys):
    baseline = write_json(tmp_path / "base.json", make_run(latency_tests([(1, 6.0, 4.0, 1.0, 0.8)])))
    current = write_json(tmp_path / "run.json", make_run(latency_tests([(1, 6.0, 4.0, 1.2, 0.8)])))
    out = tmp_path / "out"

    assert render.main([current, "--out", str(out), "--baseline", baseline, "--title", "Nightly"]) == 0
    assert capsys.readouterr().out == f"{out / 'summary.md'}\n"
    assert (out / "summary.md").read_text().startswith("# Nightly\n")
    assert render.main([current, "--out", str(out), "--baseline", baseline, "--fail-on-regression"]) == 1
    assert "regression: reference @ H200: latency full batch 1" in capsys.readouterr().err
    assert render.main([current, "--out", str(out), "--baseline", baseline, "--threshold", "0.25",
                        "--fail-on-regression"]) == 0


@pytest.mark.parametrize("content, message", [
    (None, "cannot read run report"), ("{not json", "is not valid JSON"), ('{"a": 1}', "is not a conformance run report"),
], ids=["missing", "invalid-json", "not-a-report"])
def test_cli_exits_4_on_a_bad_run_file(tmp_path, capsys, content, message):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert render.main([str(path), "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_python_dash_m_harness_render(tmp_path):
    run = write_json(tmp_path / "run.json", make_run([case("suites/test_padding.py::test_p[reference]")]))
    done = subprocess.run([sys.executable, "-m", "harness.reports.render", run, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, str(tmp_path / "out" / "summary.md")), done.stderr
    missing = subprocess.run([sys.executable, "-m", "harness.reports.render", str(tmp_path / "nope.json"), "--out", "x"],
                             capture_output=True, text=True)
    assert missing.returncode == 4 and "Traceback" not in missing.stderr and "nope.json" in missing.stderr


# -- through the plugin --------------------------------------------------------------------------


GRID_TEST = f"""
from harness.reports.records import Grid

def test_grid(record):
    record(Grid(config="max_num_seqs=256", sizes={VLLM_GRID_256!r}))
"""


def test_a_real_run_renders_the_padding_section(pytester):
    pytester.makepyfile(GRID_TEST)
    result = pytester.runpytest("--report-dir", "out")  # the plugin and the reference runtime by their entry points
    assert result.ret == 0
    markdown = (pytester.path / "out" / "conformance-reference.md").read_text()
    assert "### Padding" in markdown and "51 sizes, largest 512" in markdown
    assert "SPEC check: batch 500 -> padded 512, waste 12 tokens (2.34%)" in markdown
    (plot,) = (pytester.path / "out").glob("padding-waste-reference-*.png")
    assert plot.read_bytes()[:8] == PNG_SIGNATURE and f"]({plot.name})" in markdown


def test_a_real_run_with_no_plots_writes_the_rest(pytester):
    pytester.makepyfile(GRID_TEST)
    assert pytester.runpytest("--report-dir", "out", "--no-plots").ret == 0
    markdown = (pytester.path / "out" / "conformance-reference.md").read_text()
    assert "### Padding" in markdown and "51 sizes, largest 512" in markdown and ".png" not in markdown
    assert sorted(p.name for p in (pytester.path / "out").iterdir()) == ["conformance-reference.json",
                                                                         "conformance-reference.md"]


def test_a_real_run_fails_on_a_regression_against_its_baseline(pytester):
    baseline = make_run(latency_tests([(1, 6.0, 4.0, 1.0, 0.8)]))
    write_json(pytester.path / "base.json", baseline)
    # The same FULL entry at batch 1, 50% slower; the test itself passes.
    pytester.makepyfile("""
        from harness.reports.records import Latency

        def test_latency(record):
            record(Latency(mode="full", batch=1, padded=1, runtime_mode="FULL", step_ms_median=1.5, step_ms_min=1.5))
    """)
    result = pytester.runpytest("--report-dir", "out", "--baseline", "base.json", "--fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*regressions against baseline (beyond 10%)*",
                                 "reference @ *: latency full batch 1: step_ms_median 1.000 -> 1.500 (50.0% worse, the bar 10.0%)"])
    assert "## Regressions against baseline" in (pytester.path / "out" / "conformance-reference.md").read_text()
    # Without --fail-on-regression the regression is reported and the run still passes.
    assert pytester.runpytest("--baseline", "base.json").ret == 0


def test_a_missing_baseline_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--baseline", "nope.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--baseline: cannot read run report nope.json*"])


def test_a_regression_must_exceed_the_measured_noise():
    def run(ms, cv):
        return make_run([measured("latency", {"mode": "full", "batch": 1, "padded": 1, "runtime_mode": "FULL",
                                              "step_ms_median": ms, "step_ms_min": ms, "step_ms_cv": cv})])
    # 1.00 -> 1.15 ms is 15% worse: past a 10% threshold, but not past 2 x (0.05 + 0.05) = 20% of noise.
    assert measurements.compare([run(1.15, 0.05)], [run(1.0, 0.05)], 0.10) == []
    (regression,) = measurements.compare([run(1.15, 0.0)], [run(1.0, 0.0)], 0.10)
    assert regression["bar"] == 0.10 and round(regression["change"], 2) == 0.15



def host_run(host_ms, eager_ms=6.0, full_ms=1.0, split=False):
    """A run whose eager step (kernel floor 0.8 ms) is paced by the host; FULL at 1.0-1.5 ms is not.
    With `split`, each step also says how long the host took before it returned (host_step_ms):
    nearly all of the eager step, 0.1 ms of the FULL one."""
    def entry(mode, ms, host_part):
        return measured("latency", {"mode": mode, "batch": 1, "padded": 1, "runtime_mode": mode.upper(),
                                    "step_ms_median": ms, "step_ms_min": ms, "step_ms_cv": 0.0,
                                    "eager_kernel_ms": 0.8, "host_ref_ms": host_ms,
                                    **({"host_step_ms": host_part} if split else {})},
                        nodeid=f"suites/test_step_latency.py::test_decode_step_latency[reference-{mode}-b=1]")
    return make_run([entry("eager", eager_ms, 0.95 * eager_ms), entry("full", full_ms, 0.1)])


@pytest.mark.parametrize("split", [False, True], ids=["paced-both-times", "host-part-measured"])
def test_a_host_paced_figure_that_slowed_with_the_host_is_reported_not_counted(tmp_path, capsys, split):
    """The host's reference loop 2x slower: the eager step (paced by the host) 2x slower is the
    machine's doing, reported apart and not failing the run; FULL 50% slower (device-paced) counts."""
    baseline, current = host_run(4.0, split=split), host_run(8.0, eager_ms=12.0, full_ms=1.5, split=split)
    found = {r["mode"]: r for r in measurements.compare([current], [baseline], 0.10)}
    assert found["eager"]["host_explains"] and round(found["eager"]["host_ratio"], 2) == 2.0
    # A device-paced figure is never excused by the host: not read beside it, or its host part too small.
    assert not found["full"].get("host_explains")
    assert measurements.counted(list(found.values())) == [found["full"]]
    markdown = render_runs(tmp_path, current, regressions=list(found.values()))
    assert "1 beyond 10%:\n\n- reference @ H200: latency full batch 1" in markdown
    assert ("1 more beyond it, paced by the host" in markdown
            and "took 2.00x its baseline time, and beyond what that accounts for the step is" in markdown
            and "within the bar: the host explains it" in markdown)
    # Through the command line: only the host-paced one left, so --fail-on-regression passes.
    base = write_json(tmp_path / "b.json", baseline)
    run = write_json(tmp_path / "r.json", host_run(8.0, 12.0, split=split))
    assert render.main([run, "--out", str(tmp_path / "o"), "--baseline", base, "--fail-on-regression"]) == 0
    assert "host-paced, not counted: reference @ H200: latency eager batch 1" in capsys.readouterr().err


@pytest.mark.parametrize("baseline, current", [
    (host_run(4.0), host_run(4.0, eager_ms=12.0)),  # the host as fast as before: the code got slower
    (host_run(4.0), host_run(4.8, eager_ms=12.0)),  # 1.2x slower host: 6 ms would be 7.2, and 12 is 80% beyond
    (host_run(None), host_run(8.0, eager_ms=12.0)),  # a baseline from before host timing: nothing to excuse it
    (host_run(4.0, split=True), host_run(4.8, eager_ms=12.0, split=True)),  # the host's part, 5.7 ms, now 6.8
], ids=["same-host", "host-slower-by-less", "baseline-without-host-figure", "host-part-slower-by-less"])
def test_a_host_paced_slowdown_counts_unless_the_host_explains_it(baseline, current):
    (regression,) = measurements.compare([current], [baseline], 0.10)
    assert regression["mode"] == "eager" and measurements.counted([regression]) == [regression]


def test_the_host_part_of_a_step_decides_what_a_slower_host_explains():
    """A step between device- and host-paced (a PIECEWISE step of 4.3 ms over 2.2 ms of kernels,
    4 ms of it on the host) is explained by a 2x slower host at 7.3 ms; a FULL step whose host part
    was 0.1 ms is not explained at 2 ms, whatever the host did: its code got slower."""
    def run(host_ms, mode, ms, host_part, floor):
        split = {"host_step_ms": host_part} if host_part is not None else {}
        return make_run([measured("latency", {"mode": mode, "batch": 64, "padded": 64, "runtime_mode": "X",
                                              "step_ms_median": ms, "step_ms_min": ms, "step_ms_cv": 0.0,
                                              "eager_kernel_ms": floor, "host_ref_ms": host_ms, **split})])
    (piecewise,) = measurements.compare([run(3.8, "piecewise", 7.3, 7.0, 2.2)], [run(1.9, "piecewise", 4.3, 4.0, 2.2)])
    assert piecewise["host_explains"] and piecewise["host_adjusted"] < 0  # 4.3 + 4.0 x 1.0 = 8.3 ms expected
    (full,) = measurements.compare([run(3.8, "full", 2.0, 1.9, 0.8)], [run(1.9, "full", 1.0, 0.1, 0.8)])
    assert not full["host_explains"] and round(full["host_adjusted"], 2) == 0.9  # 1.1 ms expected
    # Without the split, the PIECEWISE baseline (under twice its kernels' time) did not count as paced
    # by the host, and nothing excused it: the nightly of 2026-12-01 failed on four such figures.
    (legacy,) = measurements.compare([run(3.8, "piecewise", 7.3, None, 2.2)], [run(1.9, "piecewise", 4.3, None, 2.2)])
    assert "host_ratio" not in legacy and measurements.counted([legacy]) == [legacy]


def test_the_host_reference_is_a_positive_duration():
    from harness.reports.timing import host_reference_ms
    assert 0 < host_reference_ms(repeats=1) < 10_000


@pytest.mark.parametrize("args, message", [
    (["--threshold", "-0.1"], "--threshold must be a fraction >= 0"),
    (["--out", "FILE"], "that is a file; name a directory"),
], ids=["negative-threshold", "out-is-a-file"])
def test_cli_refuses_bad_options_in_one_line(tmp_path, capsys, args, message):
    run = write_json(tmp_path / "run.json", make_run([]))
    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / a) if a == "FILE" else a for a in args]
    assert render.main([run, "--out", str(tmp_path / "out"), *args]) == 4
    assert message in capsys.readouterr().err


def test_cli_exits_4_on_a_report_with_malformed_records(tmp_path, capsys):
    bad = make_run([case("suites/test_padding.py::t[reference]", records=[{"kind": "grid", "config": "c"}])])
    assert render.main([write_json(tmp_path / "bad.json", bad), "--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err
    assert "is malformed" in err and "Traceback" not in err


def test_known_failures_and_emulator_figures_are_labelled(tmp_path):
    run = make_run([case("suites/test_x.py::t[reference]", "xfailed", reason="known failure [never] by design"),
                    measured("capture", {"mode": "FULL", "preset": "tiny", "graphs": {"FULL": 5}, "seconds": 0.3,
                                         "memory_bytes": 3 * 2**20, "graph_backend": "emulated"}),
                    measured("capture", {"mode": "PIECEWISE", "preset": "tiny", "graphs": {"PIECEWISE": 5},
                                         "seconds": 0.3, "memory_bytes": -4096, "graph_backend": "cuda"})])
    markdown = render_runs(tmp_path, run)
    assert "## Known failures" in markdown and "known failure [never] by design" in markdown
    assert "0.30 (emulator)" in markdown and "3.00 MiB held by emulated graphs (not GPU memory)" in markdown
    assert "-4096 bytes (not a plausible measurement)" in markdown and "-0.00 GiB" not in markdown


def test_report_dir_that_is_a_file_is_a_usage_error(pytester):
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "taken").write_text("")
    result = pytester.runpytest("--report-dir", "taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--report-dir taken: that is a file; name a directory*"])


@pytest.mark.parametrize("full_host_ms, note", [(4.0, "timed while the host ran 2.0x slower than over the run"),
                                                (2.1, None)])
def test_a_full_figure_timed_in_a_slow_phase_of_the_host_says_so(tmp_path, full_host_ms, note):
    """A lent host changes speed within seconds; the FULL batch-1 ratio is read beside how fast the
    host ran while it was timed, against the run's median."""
    def entry(mode, batch, host_ms):
        return {"mode": mode, "batch": batch, "padded": batch, "runtime_mode": mode.upper(), "step_ms_median": 1.0,
                "step_ms_min": 1.0, "eager_kernel_ms": 0.8, "host_ref_ms": host_ms}
    entries = [entry("eager", b, 2.0) for b in (1, 2, 4, 8)] + [entry("full", 1, full_host_ms)]
    markdown = render_runs(tmp_path, make_run([measured("latency", entries)]))
    line = next(line for line in markdown.splitlines() if line.startswith("- FULL at batch 1"))
    assert (note in line) if note else ("host ran" not in line)
