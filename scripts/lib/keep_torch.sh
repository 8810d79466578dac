# Sourced by the setup scripts of lanes that install an engine's package next to the project:
# packages go in without their dependencies, and the torch installed before must still be there
# after (an engine's pin would pull a multi-GB CUDA build over it).
PYTHON=${PYTHON:-python3}
pip_install() { "$PYTHON" -m pip install --quiet --no-deps "$@"; }
torch_version() { "$PYTHON" -c "import torch; print(torch.__version__)"; }

TORCH_BEFORE=$(torch_version) || { echo "no torch installed: run scripts/install.sh first" >&2; exit 1; }

check_torch_kept() {
    local after
    after=$(torch_version)
    if [ "$TORCH_BEFORE" != "$after" ]; then
        echo "torch changed from $TORCH_BEFORE to $after; this script must never replace it" >&2
        exit 1
    fi
}
