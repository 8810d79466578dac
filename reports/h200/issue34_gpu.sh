#!/usr/bin/env bash
# Issue 34 on a GPU machine, in about 2-3 minutes: the suites on CUDA graphs and the benchmark lane
# for the small preset, each timed by scripts/time_breakdown.py with the yardstick loop before and
# after it (every figure also in loop-times: the host's speed beside the seconds). The issue's
# targets: the suites under 20 s, the small lane under 50 s.
#
#   bash reports/h200/issue34_gpu.sh OUT_DIR
#
# Writes OUT_DIR/suites.log and OUT_DIR/bench-small.log (wall, loop, per file, slowest tests), with
# each run's report in OUT_DIR/suites/ and OUT_DIR/bench-small/. Exits non-zero if a run fails.
set -uo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash reports/h200/issue34_gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
source scripts/lib/bytecode_cache.sh
status=0

# One-time work of a machine's first run, before anything is timed (scripts/nightly_gpu.sh says why).
timeout 240 python -c "from harness.expectations.presets import checkpoint; [checkpoint(p) for p in ('tiny', 'small')]
import matplotlib.font_manager" > "$out/warm-up.log" 2>&1 || status=1
timeout 120 python -m pytest suites/ --graph-backend cuda -p no:cacheprovider --collect-only -q >> "$out/warm-up.log" 2>&1 \
    || status=1

timeout 150 python scripts/time_breakdown.py suites/ --graph-backend cuda -p no:xdist --benchmark-skip \
    --report-dir "$out/suites" > "$out/suites.log" 2>&1 || status=1
sed -n 2,4p "$out/suites.log"
timeout 180 python scripts/time_breakdown.py suites/test_step_latency.py suites/test_serving.py --graph-backend cuda \
    --bench-preset small --benchmark-only -p no:xdist --report-dir "$out/bench-small" > "$out/bench-small.log" 2>&1 \
    || status=1
sed -n 2,4p "$out/bench-small.log"
exit $status
