# The preamble of a GPU call, shared by the engine lanes (scripts/vllm_engine_gpu.sh,
# scripts/lmdeploy_gpu.sh). Source it after `set -uo pipefail`:
#
#   source "$(dirname "$0")/lib/gpu_call.sh"
#   gpu_call_begin "${1:-}" "bash scripts/NAME.sh OUT_DIR"   # the shell at the repository root, $out, $start
#   engine_python_path "$site" vllm-engine                   # carried packages, the tree and the plugin
#   events_file CUDAGRAPH_VLLM_EVENTS                        # $out/events.log, empty, named by the variable
#   ordered_suites test_numerical_anchor test_dispatch       # $paths: these first, then every other suite

gpu_call_begin() {  # OUT_DIR (relative to the repository root), the usage line
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
    if [ -z "${1:-}" ]; then
        echo "usage: $2" >&2
        exit 1
    fi
    mkdir -p "$1"
    out=$(cd "$1" && pwd)
    start=$(date +%s)
}

elapsed() { echo $(( $(date +%s) - start )); }

engine_python_path() {  # SITE PLUGIN_FOLDER: both ahead of what PYTHONPATH held; unbuffered output
    export PYTHONPATH="$1:$PWD:$PWD/plugins/$2${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
}

events_file() {  # VARIABLE: the runtime appends every build, capture and first step to $out/events.log
    export "$1=$out/events.log"
    : > "$out/events.log"
}

ordered_suites() {  # NAMES: suites/NAME.py in this order (most telling first), then any other suite
    paths=()
    local name path
    for name in "$@"; do paths+=("suites/$name.py"); done
    for path in suites/test_*.py; do
        case " ${paths[*]} " in *" $path "*) ;; *) paths+=("$path") ;; esac
    done
}
