#!/usr/bin/env bash
# Install what the project needs. A torch that is already installed (a CUDA build on a GPU
# machine, say) is kept; only where there is none do we take the CPU build, torch 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet --no-build-isolation -e . 2>/dev/null \
    || "$PYTHON" -m pip install --quiet -e .
