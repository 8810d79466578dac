#!/usr/bin/env bash
# Install what the project needs. A torch that is already installed (a CUDA build on a GPU
# machine, say) is kept; only where there is none do we take the CPU build, torch 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    # PyTorch's CPU index first: PyPI's Linux wheels of torch bring CUDA's libraries (gigabytes).
    # Where that index cannot be reached, what pip is configured with (PyPI, a machine's own wheels).
    "$PYTHON" -m pip install --quiet --retries 0 --timeout 20 --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple "torch==2.13.0" 2>/dev/null \
        || "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
# The self-tests build the project's wheel offline with this environment's setuptools, the backend
# pyproject.toml names (from 70.1 it builds wheels without the `wheel` package); a virtual
# environment of Python 3.12 or newer has none, and one of 3.11 an older one.
if ! "$PYTHON" -c "import setuptools, sys; sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))" \
        >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet "setuptools>=70.1" \
        || echo "install.sh: could not install setuptools>=70.1 (offline?);" \
                "the self-tests that build the wheel need it" >&2
fi
"$PYTHON" -m pip install --quiet --no-build-isolation -e . 2>/dev/null \
    || "$PYTHON" -m pip install --quiet -e .
# The runtime plugins and the example engine, as third parties would ship them (vLLM itself is
# not installed here: scripts/setup_vllm_policy.sh does that, outside the default lane).
for plugin in plugins/*/ examples/bucket_engine/; do
    "$PYTHON" -m pip install --quiet --no-build-isolation --no-deps -e "$plugin" 2>/dev/null \
        || "$PYTHON" -m pip install --quiet --no-deps -e "$plugin"
done
# Warm the bytecode caches once. Where PYTHONDONTWRITEBYTECODE is set (as on CI machines), nothing
# else writes them, and every process of a test run (the xdist workers, the self-tests' pytest
# subprocesses and in-process sessions) would compile the project again and pytest would rewrite
# the asserts of every module of its plugins' packages (all of hypothesis) again: 1-2 s a process.
# Collecting the tests also finds a broken install early; its errors are reported by the test run.
PYTHONDONTWRITEBYTECODE= "$PYTHON" -m compileall -q -x '/(\.git|\.vllm_gpu|reports|build)/' . >/dev/null || true
PYTHONDONTWRITEBYTECODE= "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true
