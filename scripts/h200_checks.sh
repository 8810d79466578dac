#!/usr/bin/env bash
# Everything but the vLLM lane, in one device call on an H200 (about 8 minutes): LMDeploy's lane
# alone; then, side by side (correctness only), the emulator's fidelity table, the GPU self-tests
# and the hostile file, every GPU runtime of the matrix and the reference suites on CUDA graphs;
# then the small benchmark lane alone (timing), compared with the last nightly.
#
#   python scripts/lmdeploy/fetch.py      # here, once: .lmdeploy_gpu/carry
#   bash scripts/h200_checks.sh OUT       # the device call: carry [".lmdeploy_gpu/carry"], timeout 600
#
# Everything lands in OUT/r and comes back as OUT/results.tgz (the device returns at most eight
# files), with every log's last lines in OUT/summary.log. H200_CHECKS_SKIP names stages to leave out
# (lmdeploy, fidelity, selftests, hostile, matrix, suites, bench), for a rerun of the rest. Since
# reference-compile runs every suite in the matrix (its time: reports/h200/matrix/summary.md),
# the LMDeploy lane and the matrix no longer fit one call together: skip one of them.
set -uo pipefail
OUT=${1:?usage: bash scripts/h200_checks.sh OUT}
cd "$(dirname "$0")/.."
R=$OUT/r
mkdir -p "$R"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$R/stages.log"; }
wanted() { case " ${H200_CHECKS_SKIP:-} " in *" $1 "*) return 1 ;; esac; return 0; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, transformers, triton; print('torch', torch.__version__, '| transformers',
        transformers.__version__, '| triton', triton.__version__)"
    git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: not a git checkout"
} > "$R/gpu.txt" 2>&1
# The presets' checkpoints and matplotlib's font cache: one-time work of a fresh machine, done once here.
python3 -c "from harness.expectations.presets import checkpoint; [checkpoint(p) for p in ('tiny', 'small')]
import matplotlib.font_manager" > "$R/prepare.log" 2>&1

if wanted lmdeploy; then
    stamp "lmdeploy lane"
    LMDEPLOY_GPU_BUDGET_S=260 timeout 290 bash scripts/lmdeploy_gpu.sh "$R/lmdeploy" > "$R/lmdeploy.log" 2>&1
    stamp "lmdeploy lane: exit $? ($(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$R/lmdeploy/suites.log" 2>/dev/null | tail -1))"
fi

stamp "side by side: fidelity, self-tests, hostile, matrix, reference suites"
pids=()
if wanted fidelity; then
    timeout 200 bash scripts/emulator_fidelity_gpu.sh "$R/fidelity" > "$R/fidelity.log" 2>&1 & pids+=($!)
fi
if wanted selftests; then
    timeout 220 python3 -m pytest tests/test_graphs.py tests/test_reference_engine.py tests/test_emulator_fidelity.py \
        tests/test_engine_memory.py plugins/torch-compile/tests -q -rs -p no:cacheprovider -p no:xdist \
        > "$R/gpu_selftests.log" 2>&1 & pids+=($!)
fi
if wanted hostile; then
    timeout 130 bash scripts/hostile_gpu.sh "$R/hostile" > "$R/hostile_gpu.log" 2>&1 & pids+=($!)
fi
if wanted matrix; then
    timeout "${H200_MATRIX_S:-380}" bash scripts/gpu_matrix.sh "$R/matrix" > "$R/matrix.log" 2>&1 & pids+=($!)
fi
if wanted suites; then
    timeout 200 python3 -m pytest suites/ --graph-backend cuda -p no:xdist -p no:cacheprovider --benchmark-skip \
        --report-dir "$R/suites" -q -rs > "$R/suites.log" 2>&1 & pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid"; done
stamp "side by side done: suites $(tail -1 "$R/suites.log" 2>/dev/null)"

if wanted bench; then
    stamp "small benchmark lane, alone"
    mkdir -p "$R/bench-small"
    timeout 110 python3 -m pytest suites/test_step_latency.py suites/test_serving.py --graph-backend cuda \
        --bench-preset small --benchmark-only -p no:xdist -p no:cacheprovider --report-dir "$R/bench-small" \
        --benchmark-json "$R/bench-small/benchmark.json" -q --durations=10 > "$R/bench-small.log" 2>&1
    stamp "bench small: $(tail -1 "$R/bench-small.log")"
    python3 -m harness.reports.render "$R"/suites/conformance-*.json "$R"/bench-small/conformance-*.json \
        --out "$R/nightly" --title "H200 checks" --baseline reports/h200/nightly/bench-small/conformance-reference.json \
        > "$R/render.log" 2>&1
fi
for f in "$R"/*.log "$R"/*/*.log; do [ -f "$f" ] && { echo "== $f"; tail -5 "$f"; }; done > "$OUT/summary.log" 2>&1
tar czf "$OUT/results.tgz" -C "$OUT" r
stamp "done"
