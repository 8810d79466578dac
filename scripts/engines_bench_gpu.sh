#!/usr/bin/env bash
# The benchmark lane on a real engine and on the reference, in one device call (issue 56): step
# latency (eager, PIECEWISE where the engine has it, FULL) at the batches of CUDAGRAPH_BENCH_BATCHES
# (default 1,8,64,256), replay device time, the eager kernel floor, capture time and memory, the
# harness's cost per observed FULL step at batch 1, serving, and where the host's time goes in one
# step (`host_profile` records: eager and FULL at the smallest and largest batch, five step calls
# each under cProfile after the timed rounds, a few seconds in all); then the reference's lane on the
# same machine for a same-machine comparison. Render them beside each other afterwards, here:
#     python scripts/engines_report.py REF.json VLLM.json LMDEPLOY.json --out reports/h200/engines
#
#   bash scripts/engines_bench_gpu.sh vllm OUT        # warm machine, vLLM in /tmp/site (plugins/vllm-engine/README.md)
#   bash scripts/engines_bench_gpu.sh lmdeploy OUT    # carry [".lmdeploy_gpu/carry"]: installed here first
#
# Files in OUT (at most 7): run.log (every stage, as it goes), install.log (lmdeploy), bench-ENGINE.log,
# conformance-ENGINE.json, bench-reference.log, conformance-reference.json, benchmark-ENGINE.json.
# Budget ENGINES_BENCH_BUDGET_S (290) from the start; the reference gets what is left, 70 s at least
# (ENGINES_BENCH_REFERENCE=0 leaves it out). ENGINES_BENCH_K selects tests with pytest's -k (e.g.
# "not serving" where the budget is short; the deselected tests are counted in the report). CUDAGRAPH_BENCH_BATCHES="" would not give the whole sweep:
# name its batches (suites/test_step_latency.py SWEEP).
# Exit status: the engine lane's pytest status (2: the engine does not install or import).
set -uo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: bash scripts/engines_bench_gpu.sh vllm|lmdeploy OUT_DIR}
out=${2:?usage: bash scripts/engines_bench_gpu.sh vllm|lmdeploy OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
budget=${ENGINES_BENCH_BUDGET_S:-290}
preset=${ENGINES_BENCH_PRESET:-small}
export CUDAGRAPH_BENCH_BATCHES=${CUDAGRAPH_BENCH_BATCHES:-1,8,64,256}
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 VLLM_LOGGING_LEVEL=WARNING
python=${PYTHON:-python3}
left() { echo $(( budget - ($(date +%s) - start) )); }
say() { echo "$(date +%H:%M:%S) [+$(( $(date +%s) - start ))s, $(left)s left] $*" | tee -a "$out/run.log"; }
: > "$out/run.log"
scratch=$(mktemp -d)

case "$engine" in
    vllm)
        runtime=cudagraph_vllm_engine.runtime:VllmEngineRuntime name=vllm-engine
        export PYTHONPATH="/tmp/site:$PWD:$PWD/plugins/vllm-engine${PYTHONPATH:+:$PYTHONPATH}"
        export CUDAGRAPH_VLLM_EVENTS="$scratch/events.log" ;;
    lmdeploy)
        runtime=cudagraph_lmdeploy_engine.runtime:LmdeployEngineRuntime name=lmdeploy-engine
        site=${LMDEPLOY_SITE:-/tmp/site_l}
        export PYTHONPATH="$site:$PWD:$PWD/plugins/lmdeploy-engine${PYTHONPATH:+:$PYTHONPATH}"
        export CUDAGRAPH_LMDEPLOY_EVENTS="$scratch/events.log"
        say "== install LMDeploy into $site"
        if ! PYTHON="$python" timeout 60 bash scripts/lmdeploy/install.sh "$site" > "$out/install.log" 2>&1; then
            tail -3 "$out/install.log" | tee -a "$out/run.log"
            say "LMDeploy did not install (install.log): was .lmdeploy_gpu/carry carried?"
            exit 2
        fi ;;
    *) echo "engines_bench_gpu: engine '$engine' is not one of: vllm, lmdeploy" >&2; exit 2 ;;
esac

say "== env: $engine, preset $preset, batches $CUDAGRAPH_BENCH_BATCHES"
timeout 90 "$python" - "$runtime" >> "$out/run.log" 2>&1 <<'EOF'
import importlib, sys
import torch
module, _, cls = sys.argv[1].partition(":")
runtime = getattr(importlib.import_module(module), cls)()
print("torch", torch.__version__, "cuda", torch.version.cuda, "| gpu", torch.cuda.get_device_name(0),
      "free/total GiB", [round(x / 2**30, 1) for x in torch.cuda.mem_get_info()])
print("runtime", runtime.name, "| capabilities", runtime.capabilities)
EOF
if [ $? -ne 0 ]; then
    tail -5 "$out/run.log"
    say "the $engine runtime does not import (run.log above)"
    exit 2
fi

lane() {  # RUNTIME NAME SECONDS: the benchmark lane, stopped with SIGINT at SECONDS so its report is written
    local seconds=$3; seconds=$(( seconds < 60 ? 60 : seconds ))
    say "== benchmark lane: $2 (at most ${seconds}s)"
    mkdir -p "$scratch/$2"  # pytest-benchmark opens its JSON file before the harness makes the report dir
    timeout -s INT -k 20 "$seconds" "$python" -m pytest suites/test_step_latency.py suites/test_serving.py \
        --runtime "$1" --graph-backend cuda --bench-preset "$preset" --benchmark-only -p no:xdist \
        -p no:cacheprovider --report-dir "$scratch/$2" --benchmark-json "$scratch/$2/benchmark.json" \
        ${ENGINES_BENCH_K:+-k "$ENGINES_BENCH_K"} --test-timeout 240 \
        -q -rs --tb=short --show-capture=no --durations=10 > "$out/bench-$2.log" 2>&1
    local status=$?
    cp "$scratch/$2/conformance-$2.json" "$out/" 2>/dev/null || say "$2: the lane wrote no report"
    grep -E "^(SKIPPED|FAILED|ERROR)" "$out/bench-$2.log" | cut -c1-240 | head -20 | tee -a "$out/run.log"
    tail -1 "$out/bench-$2.log" | tee -a "$out/run.log"
    "$python" - "$out/conformance-$2.json" >> "$out/run.log" 2>&1 <<'EOF'
import json, sys
from harness.reports.measurements import recorded
run = json.load(open(sys.argv[1]))
for e in sorted(recorded(run, "latency"), key=lambda e: (e["mode"], e["batch"])):
    print(f"  {e['mode']:9} b={e['batch']:<3} pad={e['padded']:<3} step {e['step_ms_median']:.4f} ms "
          f"replay {e.get('replay_ms_median')} floor {e.get('eager_kernel_ms')} n/a {e.get('unavailable')}")
for p in sorted(recorded(run, "host_profile"), key=lambda p: (p["mode"], p["batch"])):
    top = "; ".join(f"{r['own_ms']:.3f} ms {r['where']}:{r['line']} {r['function']}" for r in p["by_own"][:3])
    print(f"  host_profile {p['mode']:5} b={p['batch']:<3} own {p['own_ms']:.3f} ms/step "
          f"(host step {p.get('host_step_ms')}) top: {top}")
for kind in ("capture", "harness_cost", "batch1_speedup", "serving"):
    for e in recorded(run, kind):
        print(f"  {kind}: {e}")
EOF
    say "$2: pytest exit $status"
    return "$status"
}

lane "$runtime" "$name" $(( $(left) - 70 ))
status=$?
cp "$scratch/$name/benchmark.json" "$out/benchmark-$name.json" 2>/dev/null
# The nightly job runs the reference's lane itself (ENGINES_BENCH_REFERENCE=0).
[ "${ENGINES_BENCH_REFERENCE:-1}" = 1 ] && lane reference reference "$(left)"
say "== done: $name lane exit $status; render here with scripts/engines_report.py"
rm -rf "$scratch"
exit "$status"
