#!/usr/bin/env bash
# Install the vllm-policy lane (plugins/vllm-policy): vLLM itself without any of its dependencies
# (no CUDA packages, and the installed torch is kept: vLLM 0.33 asks for torch 2.14, a CUDA build),
# the packages that importing vllm.config, vllm.v1.cudagraph_dispatcher (the V1 runner's policy) and
# vllm.v1.worker.gpu.cudagraph_utils / dp_utils / lora_utils (the V2 runner's) needs (found by trying
# those imports on a machine with the project installed; V2's need nothing more, not even Triton),
# then the plugin in editable mode.
# Idempotent: what is already installed at these versions is left alone. Not part of CI.
#
#   bash scripts/install.sh && bash scripts/setup_vllm_policy.sh
#   python -m pytest suites/test_capture_sizes.py suites/test_padding.py suites/test_dispatch.py \
#       suites/test_mode_resolution.py suites/test_data_parallel.py --runtime vllm-policy \
#       --report-dir reports/vllm-policy -p no:cacheprovider
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
source scripts/lib/keep_torch.sh

pip_install "vllm==$VLLM_VERSION"
# What the imports need (a clean venv after scripts/install.sh lacks all of these), with vLLM's
# own version specifiers where it has them; the rest are what those packages import. Several are
# compiled wheels (pyzmq, msgspec, uvloop, xgrammar, ...); none is a CUDA package.
pip_install \
    cbor2 psutil "pyzmq>=25.0.0" cachetools msgspec uvloop pybase64 einops cloudpickle \
    "prometheus_client>=0.18.0" partial-json-parser "requests>=2.33.0" "certifi>=2026.10.19" urllib3 \
    idna charset-normalizer sniffio "aiohttp>=3.14.4" "multidict>=6.9.1" yarl propcache aiohappyeyeballs \
    aiosignal frozenlist attrs "openai>=2.25.0" "oss-harmony>=0.0.11" "fastapi>=0.133.0,<0.137.0" \
    "starlette>=1.0.1" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11" "llguidance>=1.7.0,<1.8.0"
pip_install -e plugins/vllm-policy

check_torch_kept
"$PYTHON" - <<'EOF'
import importlib.metadata as metadata
import logging

logging.disable(logging.ERROR)  # vLLM says it has no compiled extension and no Triton: expected here
from harness.protocol import PolicyConfig  # noqa: E402

from cudagraph_vllm_policy.runtime import VllmPolicyRuntime  # noqa: E402

names = [ep.name for ep in metadata.entry_points(group="cudagraph_conformance.runtimes")]
assert "vllm-policy" in names, names
runtime = VllmPolicyRuntime()
sizes = runtime.capture_sizes(PolicyConfig(max_num_seqs=256))
assert (len(sizes), sizes[-1]) == (51, 512), sizes
for runner, count in (("v1", 56), ("v2", 60)):  # q = 3: V1 rounds the sizes, V2 does not
    config = PolicyConfig(max_num_seqs=256, max_num_batched_tokens=8192, num_speculative_tokens=2, runner=runner)
    assert len(runtime.capture_sizes(config)) == count, (runner, runtime.capture_sizes(config))
print(f"vllm-policy ready: vLLM {metadata.version('vllm')}, torch {metadata.version('torch')}")
EOF
