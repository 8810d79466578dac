#!/usr/bin/env bash
# vLLM 0.25's two model runners under the suites in one device call, side by side on one GPU: the V1
# lane (scripts/vllm_v1_gpu.sh) and the V2 lane without its strict anchor lane
# (scripts/vllm_engine_gpu.sh with VLLM_ENGINE_STRICT=0), on one deadline. Their GPU locks are shared
# (CUDAGRAPH_DEVICE_SHARE_DIR), so a test that measures the device's free memory runs alone across
# both lanes; each lane compiles into caches of its own. Each lane's files are packed into one
# archive: the device tool brings back at most eight files.
#
#   export VLLM_ENGINE_DEADLINE=$(( $(date +%s) + 545 ))
#   INSTALL_CHECK=0 bash .vllm_gpu/install.sh --require-complete && bash scripts/vllm_lanes_gpu.sh "$OUT"
#
# Files in OUT: run.log (this script's lines, then each lane's run.log), v1.out and v2.out (each
# lane's own output), v1.tar.gz and v2.tar.gz (each lane's folder: run.log, smoke.log, suites.log,
# events.log, its conformance report). VLLM_V1_WORKERS and VLLM_V2_WORKERS (4 each) are each lane's
# xdist workers. Exit status: 0 when both lanes' suites passed, else the V1 lane's or the V2 lane's.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_call.sh"
gpu_call_begin "${1:-}" "bash scripts/vllm_lanes_gpu.sh OUT_DIR"
export VLLM_ENGINE_DEADLINE=${VLLM_ENGINE_DEADLINE:-$(( start + ${VLLM_ENGINE_BUDGET_S:-540} ))}
say() { echo "$(date +%H:%M:%S) [+$(elapsed)s] $*" | tee -a "$out/run.log"; }
: > "$out/run.log"
scratch=$(mktemp -d)
export CUDAGRAPH_DEVICE_SHARE_DIR="$scratch/device-share"

lane() {  # NAME SCRIPT [VAR=VALUE...]: one lane in the background, its compile caches its own
    local name=$1 script=$2
    shift 2
    mkdir -p "$out/$name"
    env "$@" VLLM_CACHE_ROOT="$scratch/vllm-cache-$name" TRITON_CACHE_DIR="$scratch/triton-$name" \
        bash "$script" "$out/$name" > "$out/$name.out" 2>&1
}

say "== V1 and V2 lanes side by side, until $(date -d "@$VLLM_ENGINE_DEADLINE" +%H:%M:%S)"
lane v1 scripts/vllm_v1_gpu.sh VLLM_ENGINE_WORKERS="${VLLM_V1_WORKERS:-4}" &
v1=$!
lane v2 scripts/vllm_engine_gpu.sh VLLM_ENGINE_STRICT=0 VLLM_ENGINE_WORKERS="${VLLM_V2_WORKERS:-4}" &
v2=$!
wait "$v1"; v1_status=$?
say "V1 lane exit $v1_status"
wait "$v2"; v2_status=$?
say "V2 lane exit $v2_status"

for name in v1 v2; do
    echo "---- $name/run.log" >> "$out/run.log"
    cat "$out/$name/run.log" >> "$out/run.log" 2>/dev/null
    tar czf "$out/$name.tar.gz" -C "$out" "$name" && rm -rf "${out:?}/$name"
done
rm -rf "$scratch"
[ "$v1_status" -ne 0 ] && exit "$v1_status"
exit "$v2_status"
