"""Render reports/peer-tests/ from a run of vLLM's, SGLang's and LMDeploy's own policy tests against ours.

    python scripts/peer_tests_report.py            # writes reports/peer-tests/peer-tests.{md,json}

The cases live in tests/peer_tests/ (docs/spec.md section 12); tests/test_peer_tests.py checks that
the committed report is what this prints now.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.peer_tests import report  # noqa: E402

OUT = ROOT / "reports" / "peer-tests"


def main() -> int:
    results = report.run()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "peer-tests.md").write_text(report.render_markdown(results))
    (OUT / "peer-tests.json").write_text(report.render_json(results))
    print(f"wrote {OUT / 'peer-tests.md'} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
