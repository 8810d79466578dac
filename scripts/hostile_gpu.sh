#!/usr/bin/env bash
# The hostile-runtime self-tests on a GPU host: the CUDA ones (an illegal memory access poisons
# only by evidence, a hang in torch.cuda.synchronize() ended by the watchdog in a supervised plain
# run and under xdist, CUDA taint) and every CPU one (leftover processes, deaths by a signal,
# hangs, kinds), which check this host's /proc, pidfds and subreaper too.
#
#   bash scripts/hostile_gpu.sh OUT_DIR
#
# Writes OUT_DIR/hostile.log (pytest -rA, the catch table), OUT_DIR/junit.xml and
# OUT_DIR/host.txt (torch, GPU, kernel). Bounded to 110 s; exits with pytest's status.
set -uo pipefail
out=${1:?usage: scripts/hostile_gpu.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    uname -sr
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
} > "$out/host.txt" 2>&1
timeout 110 python -m pytest tests/test_hostile_runtimes.py tests/test_hostile_processes.py -n 4 \
    -p no:cacheprovider -rA --junitxml "$out/junit.xml" > "$out/hostile.log" 2>&1
status=$?
tail -30 "$out/hostile.log"
exit $status
