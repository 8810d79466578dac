#!/usr/bin/env bash
# The whole vllm-engine lane in one device call, on a machine where .vllm_gpu/install.sh has put
# vLLM 0.25.0 into /tmp/site (plugins/vllm-engine/README.md): every suite against real vLLM as its
# users get it (Triton's float32 dots in TF32, declared), the numerical anchor again in a strict
# lane (TRITON_F32_DEFAULT=ieee, declared IEEE), within one deadline.
#
#   export VLLM_ENGINE_DEADLINE=$(( $(date +%s) + 585 ))
#   INSTALL_CHECK=0 bash .vllm_gpu/install.sh --require-complete && bash scripts/vllm_engine_gpu.sh "$OUT"
#
# VLLM_ENGINE_DEADLINE (epoch seconds) is when everything must have ended, install included; without
# it the script allows itself VLLM_ENGINE_BUDGET_S (540) from its own start. Stages (an H200):
#   env      ~15 s    versions and an import check                                    -> run.log
#   smoke    ~120 s   each config mode built once as the suites build them, captured, six steps
#                     against transformers and an eager step each, closed; the memory each close()
#                     leaves (one engine kept open beside the others, as the suites keep their shared
#                     ones); fills the compile caches the suites then hit             -> smoke.log
#   strict   ~150 s   at the same time as smoke, in its own process and caches: the anchor suite with
#                     TRITON_F32_DEFAULT=ieee, so the runtime declares IEEE and is held to its tolerance
#                                                                                     -> strict.log,
#                     conformance-vllm-engine-ieee.json; VLLM_ENGINE_STRICT=0 leaves it out (a call
#                     that runs V1's lane beside this one, scripts/vllm_lanes_gpu.sh)
#   suites   ~280 s   after the strict lane, VLLM_ENGINE_WORKERS (4) xdist workers on the GPU, every
#                     suite (the benchmark lane collected and skipped: it is a lane of its own; tests
#                     that do not apply to vLLM deselected and counted), stopped with SIGINT before
#                     the deadline so the report is still written                    -> suites.log,
#                     conformance-vllm-engine.{json,md}
#   Every build, capture, close and first step is appended to events.log as it happens.
# At most eight files reach OUT (plots and the strict lane's Markdown stay in a scratch folder: render
# them from the JSON with harness.reports.render). Exit status: the suites' pytest status, or the
# strict lane's where the suites passed.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_call.sh"
gpu_call_begin "${1:-}" "bash scripts/vllm_engine_gpu.sh OUT_DIR"
deadline=${VLLM_ENGINE_DEADLINE:-$(( start + ${VLLM_ENGINE_BUDGET_S:-540} ))}
left() { echo $(( deadline - $(date +%s) )); }
say() { echo "$(date +%H:%M:%S) [+$(( $(date +%s) - start ))s, $(left)s left] $*" | tee -a "$out/run.log"; }
cap() { local a=$1 b=$2; b=$(( b < 30 ? 30 : b )); echo $(( a < b ? a : b )); }  # the smaller budget, 30 s at least
scratch=$(mktemp -d)

engine_python_path /tmp/site vllm-engine
events_file CUDAGRAPH_VLLM_EVENTS
: > "$out/run.log"

say "== env"
timeout 90 python - >> "$out/run.log" 2>&1 <<'EOF'
import os, sys
from cudagraph_vllm_engine import settings
settings.apply_environment()
import torch, transformers, triton
import vllm
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| triton", triton.__version__, "| transformers", transformers.__version__, "| vllm", vllm.__version__,
      "from", os.path.dirname(vllm.__file__))
print("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
      "free/total GiB", [round(x / 2**30, 1) for x in torch.cuda.mem_get_info()])
EOF
if [ $? -ne 0 ]; then
    say "vLLM does not import (run.log): was .vllm_gpu/install.sh run on this machine?"
    exit 2
fi

# The strict lane: its own compile caches (Triton compiles the attention kernels again with IEEE dots),
# started now so that it runs beside the smoke stage and is done before the suites measure memory.
strict=""
if [ "${VLLM_ENGINE_STRICT:-1}" = 1 ]; then
say "== strict lane (TRITON_F32_DEFAULT=ieee), beside the smoke stage"
(
    export TRITON_F32_DEFAULT=ieee TRITON_CACHE_DIR="$scratch/triton-ieee" VLLM_CACHE_ROOT="$scratch/vllm-cache-ieee"
    export CUDAGRAPH_VLLM_EVENTS="$scratch/events-ieee.log" VLLM_LOGGING_LEVEL=WARNING
    timeout -s INT -k 20 "$(cap 260 $(( $(left) - 300 )))" python -m pytest suites/test_numerical_anchor.py \
        --runtime cudagraph_vllm_engine.runtime:VllmEngineRuntime --graph-backend cuda --preset small \
        -p no:xdist -p no:cacheprovider --report-dir "$scratch/strict" -q -rs --tb=short --show-capture=no \
        --test-timeout 200 > "$out/strict.log" 2>&1
    echo "strict lane: pytest exit $?" >> "$out/strict.log"
) &
strict=$!
else
    say "== strict lane left out (VLLM_ENGINE_STRICT=0)"
fi

say "== smoke"
timeout -s INT -k 15 "$(cap 200 $(( $(left) - 280 )))" python -m cudagraph_vllm_engine.smoke > "$out/smoke.log" 2>&1
smoke_status=$?
grep "^SMOKE" "$out/smoke.log" | grep -E "summary|FAILED|memory|done|policy" | cut -c1-300 | tee -a "$out/run.log"
[ "$smoke_status" -ne 0 ] && say "smoke stage exited $smoke_status (124/130: stopped at its budget); the suites run anyway"

if [ -n "$strict" ]; then
    say "== waiting for the strict lane"
    wait "$strict"
    tail -n 4 "$out/strict.log" | cut -c1-300 | tee -a "$out/run.log"
    strict_status=$(sed -n 's/^strict lane: pytest exit //p' "$out/strict.log" | tail -1)
    cp "$scratch/strict/conformance-vllm-engine.json" "$out/conformance-vllm-engine-ieee.json" 2>/dev/null \
        || say "the strict lane wrote no report"
fi

left_now=$(cap 100000 $(( $(left) - 20 )))
workers=${VLLM_ENGINE_WORKERS:-4}
say "== suites (at most ${left_now}s, $workers workers on the GPU)"
# The policy suites first (a few seconds each), then the most telling execution suites, so that a run
# stopped at its deadline has them done.
suites=(test_capture_sizes test_padding test_dispatch test_mode_resolution test_data_parallel
        test_numerical_anchor test_replay_equivalence test_capture_accounting test_padding_isolation
        test_fallback test_backend_support test_capture_side_effects test_static_addresses
        test_launch_overhead test_batch_invariance test_data_parallel_execution test_step_latency test_serving)
ordered_suites "${suites[@]}"  # any suite added later runs too, last
# vLLM's INFO lines (per engine build) would swamp the failure reports; its warnings still show.
# WORKERS processes share the GPU (xdist): an engine build is mostly host work (imports, compile cache
# reads, model load), so several at once shorten the lane; a test that reads the device's free memory
# runs alone on it (harness/session/device_share.py). Tests that do not apply to vLLM are deselected
# (--only-declared), counted by reason in the report.
VLLM_LOGGING_LEVEL=WARNING timeout -s INT -k 30 "$left_now" python -m pytest "${paths[@]}" \
    --runtime cudagraph_vllm_engine.runtime:VllmEngineRuntime --graph-backend cuda --preset small \
    -n "$workers" -p no:cacheprovider --benchmark-skip --only-declared --report-dir "$scratch/suites" -q -rs \
    --tb=short --show-capture=no --test-timeout 200 > "$out/suites.log" 2>&1
status=$?
cp "$scratch"/suites/conformance-vllm-engine.{json,md} "$out/" 2>/dev/null || say "the suites wrote no report"
tail -n 25 "$out/suites.log" | cut -c1-300
grep -E "^[0-9]+ (passed|failed)|passed|error" "$out/suites.log" | tail -1 | tee -a "$out/run.log"
say "== done: suites pytest exit $status, strict lane exit ${strict_status:-none}; files in $out"
rm -rf "$scratch"
[ "$status" -ne 0 ] && exit "$status"
exit "${strict_status:-0}"
