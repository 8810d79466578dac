"""Every suite runs within the seats it is given: against the reference engine with a real
scheduler's seat limit (tests/seated_engine.py), no suite fails. Before this held, the padded
request rows and data-parallel execution suites kept more requests live than max_num_seqs, and the
full KV cache could only be filled with more: each failed or skipped on vLLM and LMDeploy, whose
runtimes refuse such steps, while the reference runtime passed them."""
from __future__ import annotations

from tests import catching

# The suites that once kept more requests live than max_num_seqs; every suite passed it on 2026-12-06.
SEATS_TIGHT = ["test_padded_request_rows.py", "test_full_kv_cache.py", "test_data_parallel_execution.py"]


def test_the_suites_keep_within_max_num_seqs_live_requests(pytester):
    report = catching.run_suites(pytester, "tests.seated_engine:SeatedRuntime", SEATS_TIGHT, "--tb=native")
    assert report["complete"]
    assert [(t["nodeid"], t.get("reason", "")[:500]) for t in report["tests"] if t["outcome"] in ("failed", "error")] == []
    outcome = {t["nodeid"].split("::", 1)[1]: t for t in report["tests"]}
    full = [t for name, t in outcome.items() if name.startswith("test_padded_graph_steps_on_a_full_cache")]
    assert full and all(t["outcome"] == "passed" for t in full), [(t["nodeid"], t.get("reason")) for t in full]
