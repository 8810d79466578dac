#!/usr/bin/env bash
# The nightly GPU job: every suite on CUDA graphs, the benchmark lane for the small and medium
# presets, then one report rendered from the runs' JSON and compared with the last baseline; the real
# engines' benchmark lanes where the runner provides vLLM / LMDeploy, each against its own last run.
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

# The real engines' benchmark lanes, where the runner provides them (.github/workflows/nightly-gpu.yml):
# vLLM importable from NIGHTLY_VLLM_SITE (default /tmp/site, plugins/vllm-engine/README.md's install),
# LMDeploy from .lmdeploy_gpu/carry (python scripts/lmdeploy/fetch.py). Each is compared with its own
# previous run, NIGHTLY_ENGINE_BASELINES/conformance-ENGINE.json (default reports/h200/engines), never
# with another engine's.
engine_baselines=${NIGHTLY_ENGINE_BASELINES:-reports/h200/engines}
for engine in vllm lmdeploy; do
    case "$engine" in
        vllm) name=vllm-engine; PYTHONPATH="${NIGHTLY_VLLM_SITE:-/tmp/site}" python -c "import vllm" 2>/dev/null ;;
        lmdeploy) name=lmdeploy-engine; [ -d .lmdeploy_gpu/carry ] ;;
    esac
    if [ $? -ne 0 ]; then
        echo "nightly: $name's benchmark lane not run: the runner does not provide it (see .github/workflows/nightly-gpu.yml)"
        continue
    fi
    ENGINES_BENCH_REFERENCE=0 ENGINES_BENCH_BUDGET_S=${NIGHTLY_ENGINE_BUDGET_S:-900} \
        bash scripts/engines_bench_gpu.sh "$engine" "$out/engines/$name" || status=$?
    engine_render=(python -m harness.reports.render "$out/engines/$name/conformance-$name.json" --out "$out/engines/$name"
                   --title "Nightly GPU run: $name's benchmark lane")
    [ -f "$engine_baselines/conformance-$name.json" ] && engine_render+=(--baseline "$engine_baselines/conformance-$name.json")
    "${engine_render[@]}" --fail-on-regression || status=$?
done

render=(python -m harness.reports.render "$out"/suites/conformance-*.json "$out"/bench-*/conformance-*.json
        --out "$out" --title "Nightly GPU run")
for baseline in "${baselines[@]}"; do
    render+=(--baseline "$baseline")
done
"${render[@]}" --fail-on-regression || status=$?
exit "$status"
