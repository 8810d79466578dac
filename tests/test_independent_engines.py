"""Engines written from the docs alone pass every suite they declare, with no known failures.

The bucket engine (examples/bucket_engine, tests/test_broken_example_engines.py) keys graphs by
token count and runs mixed batches in graphs; the SGLang-shaped engine here keys them by batch
size and runs only decode batches in graphs (FULL resolves to FULL_DECODE_ONLY), so a suite that
assumes mixed batches replay a graph fails it.
"""
from pathlib import Path

from tests import catching

SUITES = Path(__file__).resolve().parent.parent / "suites"


def test_the_sglang_shaped_engine_passes_every_suite_it_declares(pytester):
    report = catching.run_suites(pytester, "tests.sglang_like_engine:SGLangLikeRuntime",
                                 sorted(p.name for p in SUITES.glob("test_*.py")), "--tb=native")
    assert report["complete"]
    assert [(t["nodeid"], t.get("reason", "")[:500]) for t in report["tests"] if t["outcome"] in ("failed", "error")] == []
    outcome = {t["nodeid"].split("::", 1)[1]: t for t in report["tests"]}
    # Its mixed batches run eager: no replay to move an input under, said as a skip, not a failure.
    moved = outcome["test_a_moved_input_fails_loudly_or_is_not_read[sglang-like-mixed]"]
    assert moved["outcome"] == "skipped" and "ran eager under FULL_DECODE_ONLY" in moved["reason"]
    assert outcome["test_a_moved_input_fails_loudly_or_is_not_read[sglang-like-uniform]"]["outcome"] == "passed"
    assert sum(t["outcome"] == "passed" for t in report["tests"]) >= 75
