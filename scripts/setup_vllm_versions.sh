#!/usr/bin/env bash
# Two vLLM releases' policy code on the CPU, for scripts/vllm_versions_compare.py and for running the
# policy suites against vLLM 0.25's own code (--runtime vllm-engine-policy) without a GPU:
#
#   DIR/venv       a virtual environment over this one's packages (torch, the project), plus the packages
#                  importing vLLM's config and worker modules needs (scripts/setup_vllm_policy.sh's list)
#   DIR/vllm-0.25  vLLM 0.25.0's Python files, DIR/vllm-0.33 vLLM 0.33.0's (each wheel unpacked, no
#                  compiled kernels: the policy code never calls one); put one first on PYTHONPATH
#
#   bash scripts/install.sh && bash scripts/setup_vllm_versions.sh /tmp/vllm-versions
#   /tmp/vllm-versions/venv/bin/python scripts/vllm_versions_compare.py --vllm025 /tmp/vllm-versions/vllm-0.25 \
#       --vllm033 /tmp/vllm-versions/vllm-0.33 --out reports/policy-compare
#   PYTHONPATH=/tmp/vllm-versions/vllm-0.25:.:plugins/vllm-engine:plugins/vllm-engine-v1 /tmp/vllm-versions/venv/bin/python -m pytest \
#       suites/test_capture_sizes.py suites/test_padding.py suites/test_dispatch.py suites/test_mode_resolution.py \
#       --runtime cudagraph_vllm_engine.runtime:VllmEnginePolicyRuntime --report-dir reports/vllm-engine-policy
#   (the same with cudagraph_vllm_engine_v1.runtime:VllmEngineV1PolicyRuntime: 0.25's V1 runner), and
#   /tmp/vllm-versions/venv/bin/python scripts/vllm_versions_compare.py --oracle vllm-0.25/v1 \
#       --vllm025 /tmp/vllm-versions/vllm-0.25 --out reports/policy-compare
#
# Idempotent; downloads two wheels (about 430 MB) the first time. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bash scripts/setup_vllm_versions.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[ -x "$dir/venv/bin/python" ] || python3 -m venv --system-site-packages "$dir/venv"
# The torch of this environment is kept (the venv sees it); each package's own dependencies are resolved.
"$dir/venv/bin/python" -m pip install --quiet \
    cbor2 psutil "pyzmq>=25.0.0" cachetools msgspec uvloop pybase64 einops cloudpickle \
    "prometheus_client>=0.18.0" partial-json-parser "requests>=2.33.0" "certifi>=2026.10.19" urllib3 \
    idna charset-normalizer sniffio "aiohttp>=3.14.4" "multidict>=6.9.1" yarl propcache aiohappyeyeballs \
    aiosignal frozenlist attrs "openai>=2.25.0" "oss-harmony>=0.0.11" "fastapi>=0.133.0,<0.137.0" \
    "starlette>=1.0.1" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11" "llguidance>=1.7.0,<1.8.0"
for version in 0.25.0 0.33.0; do
    target="$dir/vllm-${version%.0}"
    [ -f "$target/vllm/__init__.py" ] && continue
    "$dir/venv/bin/python" -m pip download --quiet --no-deps "vllm==$version" -d "$dir/wheels"
    mkdir -p "$target"
    "$dir/venv/bin/python" - "$dir/wheels" "$version" "$target" <<'EOF'
import glob, sys, zipfile
wheels, version, target = sys.argv[1:]
(wheel,) = glob.glob(f"{wheels}/vllm-{version}-*.whl")
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(target, [n for n in archive.namelist() if n.startswith("vllm/") and not n.endswith(".so")])
EOF
done
for version in 0.25 0.33; do
    PYTHONPATH="$dir/vllm-$version:$PWD:$PWD/plugins/vllm-engine:$PWD/plugins/vllm-policy" "$dir/venv/bin/python" -c \
        "import logging; logging.disable(logging.ERROR); import vllm.config, vllm.v1.worker.gpu.cudagraph_utils; print('vLLM', vllm.__version__, 'imports from', vllm.__file__)"
done
