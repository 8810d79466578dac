#!/usr/bin/env bash
# Issue 31 on a GPU machine, within about 8 minutes: the emulator's fidelity table on real CUDA
# graphs (its four new memory-pool rows among them), then the suites on CUDA graphs for the
# reference runtime, the bucket engine and the SGLang-shaped engine (the new checkpoint, the
# larger engines, the context's end), each with its JSON and Markdown report.
#
#   bash reports/issue31/issue31_gpu.sh OUT_DIR
#
# Writes OUT_DIR/fidelity/ (emulator_fidelity.json, _emulated.json, .md: commit them to
# reports/h200/), OUT_DIR/<runtime>.log and OUT_DIR/<runtime>/conformance-<runtime>.{json,md}.
# Exits non-zero if a step fails; the logs say which.
set -uo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash reports/issue31/issue31_gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=".:examples/bucket_engine${PYTHONPATH:+:$PYTHONPATH}"
status=0

timeout 120 bash scripts/emulator_fidelity_gpu.sh "$out/fidelity" > "$out/fidelity.log" 2>&1 || status=1
for runtime in reference bucket_engine.runtime:BucketRuntime tests.sglang_like_engine:SGLangLikeRuntime; do
    name=${runtime##*:}
    timeout 120 python -m pytest suites/ --runtime "$runtime" --graph-backend cuda --benchmark-skip -p no:xdist -q \
        --report-dir "$out/$name" > "$out/$name.log" 2>&1 || status=1
    tail -1 "$out/$name.log"
done
exit $status
