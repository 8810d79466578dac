#!/usr/bin/env bash
# The nightly GPU job: every suite on CUDA graphs, the benchmark lane for the small and medium
# presets, then one report rendered from the runs' JSON and compared with the last baseline.
#
#   bash scripts/nightly_gpu.sh OUT_DIR [BASELINE.json ...]
#
# Run from a checkout where the project is installed (scripts/install.sh), or where the root
# conftest.py can register it. Exits non-zero if a suite fails or a benchmark regressed past 10%.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bytecode_cache.sh
out=${1:-reports/nightly}
shift || true
baselines=("$@")
mkdir -p "$out"
status=0

# One-time work of a machine's first run, done before anything is timed: writing the presets'
# checkpoints goes through transformers (its import took 10-20 s on a lent H200), matplotlib
# builds its font cache on first use (15 s there), and collecting the suites compiles what the
# runs import (scripts/lib/bytecode_cache.sh); each would land in the first run's time.
python -c "from harness.expectations.presets import checkpoint; [checkpoint(p) for p in ('tiny', 'small', 'medium')]
import matplotlib.font_manager" || status=$?
python -m pytest suites/ --graph-backend cuda -p no:cacheprovider --collect-only -q > /dev/null || status=$?

python -m pytest suites/ --graph-backend cuda -p no:xdist -p no:cacheprovider --benchmark-skip \
    --report-dir "$out/suites" -q -rs || status=$?

for preset in small medium; do
    mkdir -p "$out/bench-$preset"
    python -m pytest suites/test_step_latency.py suites/test_serving.py --graph-backend cuda --bench-preset "$preset" \
        --benchmark-only -p no:xdist -p no:cacheprovider --report-dir "$out/bench-$preset" \
        --benchmark-json "$out/bench-$preset/benchmark.json" -q --durations=15 || status=$?
done

render=(python -m harness.reports.render "$out"/suites/conformance-*.json "$out"/bench-*/conformance-*.json
        --out "$out" --title "Nightly GPU run")
for baseline in "${baselines[@]}"; do
    render+=(--baseline "$baseline")
done
"${render[@]}" --fail-on-regression || status=$?
exit "$status"
