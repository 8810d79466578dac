#!/usr/bin/env bash
# Every suite against every runtime that runs on a GPU (the example engines and the plugins), in
# parallel: correctness only, the benchmark lane is the nightly's (scripts/nightly_gpu.sh).
#
#   bash scripts/gpu_matrix.sh OUT_DIR
#
# Needs torch with CUDA, transformers, pytest and hypothesis; the project need not be installed
# (the runtimes are named module:factory and found on PYTHONPATH). Writes OUT_DIR/NAME/ per runtime
# (JSON and Markdown), OUT_DIR/NAME.log, and OUT_DIR/summary.md rendered from all of them.
set -uo pipefail
if [ $# -ne 1 ]; then echo "usage: bash scripts/gpu_matrix.sh OUT_DIR" >&2; exit 2; fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/plugins/transformers-graph:$PWD/plugins/torch-compile:$PWD/examples/bucket_engine${PYTHONPATH:+:$PYTHONPATH}"
runtimes=(
    "bucket-engine=bucket_engine.runtime:BucketRuntime"
    "minimal=examples.minimal_runtime:MinimalRuntime"
    "transformers-eager=cudagraph_transformers.runtime:TransformersEager"
    "transformers-graph=cudagraph_transformers.runtime:TransformersGraph"
    "transformers-compile=cudagraph_transformers.runtime:TransformersCompile"
    "reference-compile=cudagraph_torch_compile.runtime:ReferenceCompile"
    "sglang-like=tests.sglang_like_engine:SGLangLikeRuntime"
)
status=0
pids=()
for entry in "${runtimes[@]}"; do
    name=${entry%%=*}
    # reference-compile compiles every new shape of every engine (seconds each): xdist workers share
    # the GPU (a test that measures its free memory runs alone: harness/session/device_share.py).
    # transformers-compile stays in one process, as in the run its known failures come from: under
    # four workers one launch count came out otherwise (reports/h200/README.md, the matrix).
    case $name in reference-compile) workers=(-n "${MATRIX_COMPILE_WORKERS:-4}") ;; *) workers=(-p no:xdist) ;; esac
    python -m pytest suites/ --runtime "${entry#*=}" --graph-backend cuda "${workers[@]}" -p no:cacheprovider \
        --benchmark-skip --report-dir "$out/$name" -q -rs >"$out/$name.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
python -m harness.reports.render "$out"/*/conformance-*.json --out "$out" --title "GPU matrix" || status=1
exit "$status"
