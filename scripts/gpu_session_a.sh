#!/usr/bin/env bash
# One device call: the emulator's fidelity table, the GPU self-tests, the runtime matrix and the
# reference suites in parallel (correctness only), then the nightly benchmark lane alone (timing).
# Everything lands in OUT/r and comes back as OUT/results.tgz, with the logs' tails in OUT/summary.log.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_session_a.sh OUT}
R=$OUT/r
mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt" 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$R/gpu.txt"
stamp "phase 1: fidelity, GPU self-tests, matrix, reference suites (parallel)"
bash scripts/emulator_fidelity_gpu.sh "$R/fidelity" > "$R/fidelity.log" 2>&1 & p1=$!
python -m pytest tests/test_graphs.py tests/test_reference_engine.py tests/test_emulator_fidelity.py -q -rs \
    -p no:cacheprovider -p no:xdist > "$R/gpu_selftests.log" 2>&1 & p2=$!
bash scripts/gpu_matrix.sh "$R/matrix" > "$R/matrix.log" 2>&1 & p3=$!
python -m pytest suites/ --graph-backend cuda -p no:xdist -p no:cacheprovider --benchmark-skip \
    --report-dir "$R/suites" -q -rs > "$R/suites.log" 2>&1 & p4=$!
wait $p4; stamp "reference suites done: $(tail -1 "$R/suites.log")"
wait $p1 $p2 $p3
stamp "phase 1 done"
for preset in small medium; do
    stamp "bench $preset"
    timeout 280 python -m pytest suites/test_step_latency.py suites/test_serving.py --graph-backend cuda \
        --bench-preset "$preset" --benchmark-only -p no:xdist -p no:cacheprovider --report-dir "$R/bench-$preset" \
        --benchmark-json "$R/bench-$preset/benchmark.json" -q > "$R/bench-$preset.log" 2>&1
    stamp "bench $preset: $(tail -1 "$R/bench-$preset.log")"
done
python -m harness.reports.render "$R"/suites/conformance-*.json "$R"/bench-*/conformance-*.json --out "$R/nightly" \
    --title "Nightly GPU run" --baseline reports/h200/nightly/bench-small/conformance-reference.json \
    --baseline reports/h200/nightly/bench-medium/conformance-reference.json > "$R/render.log" 2>&1
stamp "rendered"
for f in "$R"/*.log; do echo "== $f"; tail -4 "$f"; done > "$OUT/summary.log"
tar czf "$OUT/results.tgz" -C "$OUT" r
stamp "done"
