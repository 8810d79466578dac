# Sourced by the GPU scripts, before their warm-up. Where PYTHONDONTWRITEBYTECODE is set (the lent
# H200s set it, and their torch has no compiled bytecode installed), every Python process compiles
# each module it imports from source again. The bytecode goes to a cache of its own instead,
# outside site-packages and the checkout (PYTHONPYCACHEPREFIX), so only a machine's first run (the
# scripts' warm-up) compiles.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/cudagraph-conformance/pycache}
fi
