#!/usr/bin/env bash
# Install the sglang-policy lane (plugins/sglang-policy): SGLang itself without any of its
# dependencies (no CUDA packages; the installed torch is kept), the packages that importing
# sglang.srt.server_args and sglang.srt.arg_groups.{cuda_graph_hook,memory_hook} needs (found by
# trying those imports in a fresh virtual environment over scripts/install.sh's packages), then
# the plugin in editable mode. Triton is imported at the top of sglang.srt.utils; it imports
# without a GPU. Idempotent. Not part of CI.
#
#   bash scripts/install.sh && bash scripts/setup_sglang_policy.sh
#   python -m pytest suites/test_capture_sizes.py suites/test_padding.py suites/test_dispatch.py \
#       suites/test_mode_resolution.py suites/test_data_parallel.py --runtime sglang-policy \
#       --report-dir reports/sglang-policy -p no:cacheprovider
#
# SGLang's runner modules (sglang.srt.model_executor.runner) also import torchvision, whose PyPI
# wheels need a CUDA torch; the plugin reproduces their rules instead (its README says which).
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
source scripts/lib/keep_torch.sh

pip_install "sglang==$SGLANG_VERSION" "triton==3.9.0"
pip_install psutil pybase64 starlette msgspec pyzmq aiohttp multidict yarl propcache aiohappyeyeballs \
    aiosignal frozenlist
pip_install -e plugins/sglang-policy

check_torch_kept
"$PYTHON" - <<'PY'
import importlib.metadata as metadata
import logging

logging.disable(logging.WARNING)
from harness.protocol import PolicyConfig  # noqa: E402

from cudagraph_sglang_policy.runtime import SglangPolicyRuntime  # noqa: E402

names = [ep.name for ep in metadata.entry_points(group="cudagraph_conformance.runtimes")]
assert "sglang-policy" in names, names
sizes = SglangPolicyRuntime().capture_sizes(PolicyConfig(max_num_seqs=256))
assert (len(sizes), sizes[-1]) == (36, 256), sizes
print(f"sglang-policy ready: SGLang {metadata.version('sglang')}, torch {metadata.version('torch')}")
PY
