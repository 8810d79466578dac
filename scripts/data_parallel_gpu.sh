#!/usr/bin/env bash
# The data-parallel execution suite on GPUs: one rank per GPU (2 to 4), NCCL, CUDA graphs.
#
#   bash scripts/data_parallel_gpu.sh OUT_DIR [extra pytest arguments]
#
# Needs torch with CUDA, pytest, hypothesis and transformers; the project need not be installed
# (the repository root goes on PYTHONPATH and the root conftest.py registers the plugin and the
# reference runtime). Writes OUT_DIR/conformance-reference.json and .md: per step, each rank's
# batch, the mode the ranks agreed, each rank's padded size and the padding the consensus cost.
set -euo pipefail
out=${1:?usage: scripts/data_parallel_gpu.sh OUT_DIR [pytest arguments]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast (the ranks set it too)

python - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "pytest", "hypothesis", "transformers") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)}")
import torch
if torch.cuda.device_count() < 2:
    sys.exit(f"the NCCL lane needs two GPUs; torch sees {torch.cuda.device_count()}")
print(f"torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
EOF

python -m pytest suites/test_data_parallel_execution.py --runtime reference --graph-backend cuda \
    -p no:xdist -p no:cacheprovider --report-dir "$out" -v -rs "$@"
