#!/usr/bin/env bash
# The whole vllm-engine GPU run in one command, on a machine where .vllm_gpu/install.sh has put
# vLLM 0.25.0 into /tmp/site (plugins/vllm-engine/README.md): a smoke stage, then every suite
# against real vLLM, all within a time budget (default 510 s, so that unpacking vLLM's second part
# and this script fit one 10-minute device call).
#
#   INSTALL_CHECK=0 bash .vllm_gpu/install.sh --require-complete && bash scripts/vllm_engine_gpu.sh OUT_DIR
#
# Stages and their expected times on an H200 (a fresh machine; the caches the smoke stage fills
# under /tmp/vllm_cache, ~/.triton and /tmp/torchinductor_* make the suites' builds cheaper):
#   env      ~15 s   versions and an import check                       -> OUT_DIR/env.log
#   smoke    ~120 s  each config mode built once (vLLM's model inspection ~30 s once, torch.compile
#                    ~15 s for the first mode, a few seconds for the others; Triton's first
#                    kernels ~20 s), captured, 6 steps against transformers and an eager step
#                    each                                               -> OUT_DIR/smoke.log
#                    (stopped at VLLM_ENGINE_SMOKE_S, default 180 s; the suites run anyway)
#   suites   ~250 s  pytest over every suite (about 30 engine builds of a few seconds each, since
#                    many tests ask for a fresh engine; the benchmark lane is skipped), stopped
#                    with SIGINT at the budget's end so the report is still written
#                                                                       -> OUT_DIR/suites.log,
#                    OUT_DIR/conformance-vllm-engine.{json,md}
#   Every build, capture and first step is also appended to OUT_DIR/events.log as it happens.
# Exit status: pytest's (0 when everything passed or was a known failure), or 124/130 on timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/vllm_engine_gpu.sh OUT_DIR}
budget=${VLLM_ENGINE_BUDGET_S:-510}
smoke_budget=${VLLM_ENGINE_SMOKE_S:-180}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

export PYTHONPATH="/tmp/site:$PWD:$PWD/plugins/vllm-engine${PYTHONPATH:+:$PYTHONPATH}"
export CUDAGRAPH_VLLM_EVENTS="$out/events.log"
export PYTHONUNBUFFERED=1
: > "$CUDAGRAPH_VLLM_EVENTS"

echo "== env ($(elapsed)s)"
timeout 120 python - > "$out/env.log" 2>&1 <<'EOF'
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
env_status=$?
cat "$out/env.log" | tail -5
if [ "$env_status" -ne 0 ]; then
    echo "vLLM does not import (see $out/env.log): was .vllm_gpu/install.sh run on this machine?"
    exit 2
fi

echo "== smoke ($(elapsed)s, at most ${smoke_budget}s)"
timeout -s INT -k 15 "$smoke_budget" python -m cudagraph_vllm_engine.smoke > "$out/smoke.log" 2>&1
smoke_status=$?
grep "^SMOKE" "$out/smoke.log" | grep -E "summary|FAILED|capture|done|built" | cut -c1-400
[ "$smoke_status" -ne 0 ] && echo "smoke stage exited $smoke_status (124/130: stopped at its budget); the suites run anyway"

left=$(( budget - $(elapsed) ))
echo "== suites ($(elapsed)s, at most ${left}s)"
# Most telling first, so a run stopped at the budget has the numerical and graph checks done.
suites=(test_numerical_anchor test_replay_equivalence test_capture_accounting test_padding_isolation
        test_fallback test_backend_support test_capture_side_effects test_static_addresses
        test_launch_overhead test_batch_invariance test_dispatch test_padding test_capture_sizes
        test_mode_resolution test_data_parallel test_serving test_step_latency)
paths=()
for name in "${suites[@]}"; do paths+=("suites/$name.py"); done
for path in suites/test_*.py; do  # any suite added later runs too, last
    case " ${paths[*]} " in *" $path "*) ;; *) paths+=("$path") ;; esac
done
# vLLM's INFO lines (per engine build) would swamp the failure reports; its warnings still show.
VLLM_LOGGING_LEVEL=WARNING timeout -s INT -k 30 "$left" python -m pytest "${paths[@]}" \
    --runtime cudagraph_vllm_engine.runtime:VllmEngineRuntime --graph-backend cuda --preset small \
    -p no:xdist -p no:cacheprovider --benchmark-skip --report-dir "$out" -q -rs --tb=short \
    --show-capture=no --test-timeout 300 > "$out/suites.log" 2>&1
status=$?
tail -n 60 "$out/suites.log" | cut -c1-300
echo "== done in $(elapsed)s: pytest exit $status; logs in $out"
exit "$status"
