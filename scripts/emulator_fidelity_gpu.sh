#!/usr/bin/env bash
# The emulator's fidelity table on a GPU machine: every graph-bug program on real CUDA graphs and
# on the CPU emulator, and the two rendered side by side (harness/graphs/fidelity.py).
#
#   bash scripts/emulator_fidelity_gpu.sh OUT_DIR
#
# Writes OUT_DIR/emulator_fidelity.json (CUDA), OUT_DIR/emulator_fidelity_emulated.json and
# OUT_DIR/emulator_fidelity.md. Needs only torch with CUDA: the project need not be installed.
# Exits non-zero if a run fails, or if a row's verdicts differ where the table does not expect it.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/emulator_fidelity_gpu.sh OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

python -m harness.graphs.fidelity --backend cuda --json "$out/emulator_fidelity.json"
python -m harness.graphs.fidelity --backend emulated --json "$out/emulator_fidelity_emulated.json"
python -m harness.graphs.fidelity --compare "$out/emulator_fidelity_emulated.json" "$out/emulator_fidelity.json" \
    --markdown "$out/emulator_fidelity.md"
echo "wrote $out/emulator_fidelity.json, $out/emulator_fidelity_emulated.json, $out/emulator_fidelity.md"
if grep -q "NO (unexpected)" "$out/emulator_fidelity.md"; then
    echo "some rows differ where the table expects agreement: see $out/emulator_fidelity.md" >&2
    exit 1
fi
