#!/usr/bin/env bash
# The vllm-engine-v1 lane (vLLM 0.25's V1 model runner and CudagraphDispatcher) in one device call,
# on a machine where .vllm_gpu/install.sh has put vLLM 0.25.0 into /tmp/site (plugins/vllm-engine/README.md).
#
#   export VLLM_ENGINE_DEADLINE=$(( $(date +%s) + 300 ))
#   bash scripts/vllm_v1_gpu.sh "$OUT/v1"
#
# Stages, each logged with its time to run.log; every build, capture, close and first step to events.log:
#   env     an import check (vLLM, and whether numba is there for the ngram proposer)      -> run.log
#   smoke   FULL_AND_PIECEWISE and FULL_DECODE_ONLY built, captured, six steps against transformers and
#           an eager step each; an ngram engine (k = 2) with q = 3 verify steps             -> smoke.log
#   suites  every suite against vllm-engine-v1 with --only-declared, stopped with SIGINT before the
#           deadline so the report is written                    -> suites.log, conformance-vllm-engine-v1.{json,md}
# Six files at most. Exit status: the suites' pytest status (2 when vLLM does not import).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/vllm_v1_gpu.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
deadline=${VLLM_ENGINE_DEADLINE:-$(( start + ${VLLM_ENGINE_BUDGET_S:-300} ))}
left() { echo $(( deadline - $(date +%s) )); }
say() { echo "$(date +%H:%M:%S) [+$(( $(date +%s) - start ))s, $(left)s left] $*" | tee -a "$out/run.log"; }
cap() { local a=$1 b=$2; b=$(( b < 30 ? 30 : b )); echo $(( a < b ? a : b )); }
scratch=$(mktemp -d)

export PYTHONPATH="/tmp/site:$PWD:$PWD/plugins/vllm-engine:$PWD/plugins/vllm-engine-v1${PYTHONPATH:+:$PYTHONPATH}"
export CUDAGRAPH_VLLM_EVENTS="$out/events.log" PYTHONUNBUFFERED=1 VLLM_USE_V2_MODEL_RUNNER=0
: > "$CUDAGRAPH_VLLM_EVENTS"
: > "$out/run.log"

say "== env (V1 runner)"
timeout 90 python - >> "$out/run.log" 2>&1 <<'PY'
import importlib.util, os, sys
from cudagraph_vllm_engine import settings
settings.apply_environment()
import torch, vllm
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
print("python", sys.version.split()[0], "| torch", torch.__version__, "| vllm", vllm.__version__, "from",
      os.path.dirname(vllm.__file__), "| numba", "present" if importlib.util.find_spec("numba") else "absent",
      "| VLLM_USE_V2_MODEL_RUNNER", os.environ.get("VLLM_USE_V2_MODEL_RUNNER"))
print("gpu", torch.cuda.get_device_name(0), "free/total GiB", [round(x / 2**30, 1) for x in torch.cuda.mem_get_info()])
PY
if [ $? -ne 0 ]; then
    say "vLLM's V1 runner does not import (run.log): was .vllm_gpu/install.sh run on this machine?"
    exit 2
fi

say "== V1 smoke"
timeout -s INT -k 15 "$(cap 150 $(( $(left) - 120 )))" python -m cudagraph_vllm_engine_v1.smoke > "$out/smoke.log" 2>&1
smoke_status=$?
grep "^SMOKE" "$out/smoke.log" | grep -E "summary|FAILED|verify|done|capture" | cut -c1-300 | tee -a "$out/run.log"
[ "$smoke_status" -ne 0 ] && say "V1 smoke exited $smoke_status (124/130: stopped at its budget); the suites run anyway"

left_now=$(cap 100000 $(( $(left) - 15 )))
workers=${VLLM_ENGINE_WORKERS:-4}
say "== suites against vllm-engine-v1 (at most ${left_now}s, $workers workers)"
suites=(test_capture_sizes test_padding test_dispatch test_mode_resolution test_numerical_anchor
        test_replay_equivalence test_padding_isolation test_capture_accounting test_fallback test_static_addresses)
paths=()
for name in "${suites[@]}"; do paths+=("suites/$name.py"); done
for path in suites/test_*.py; do
    case " ${paths[*]} " in *" $path "*) ;; *) paths+=("$path") ;; esac
done
VLLM_LOGGING_LEVEL=WARNING timeout -s INT -k 30 "$left_now" python -m pytest "${paths[@]}" \
    --runtime cudagraph_vllm_engine_v1.runtime:VllmEngineV1Runtime --graph-backend cuda --preset small \
    -n "$workers" -p no:cacheprovider --benchmark-skip --only-declared --report-dir "$scratch/suites" -q -rs \
    --tb=short --show-capture=no --test-timeout 150 > "$out/suites.log" 2>&1
status=$?
cp "$scratch"/suites/conformance-vllm-engine-v1.{json,md} "$out/" 2>/dev/null \
    || { cp "$scratch"/suites/conformance-*.json "$out/" 2>/dev/null; say "no conformance-vllm-engine-v1 report (copied what was written: $(ls "$scratch/suites" 2>/dev/null | tr '\n' ' '))"; }
tail -n 25 "$out/suites.log" | cut -c1-300
grep -E "passed|failed|error" "$out/suites.log" | tail -1 | tee -a "$out/run.log"
say "== done: V1 smoke exit $smoke_status, suites pytest exit $status; files in $out"
rm -rf "$scratch"
exit "$status"
