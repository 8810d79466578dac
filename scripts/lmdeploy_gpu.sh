#!/usr/bin/env bash
# The whole lmdeploy-engine GPU run in one device call: install LMDeploy 0.18.0's PyTorch engine
# from the carried folder, check it imports, a smoke stage, then every suite against it, within a
# time budget (default 540 s). Made to be read after a blind first run: every stage logs LMDeploy's
# live state to OUT_DIR, so one run, even a failing one, says what to fix.
#
#   python scripts/lmdeploy/fetch.py                 # here, once: makes .lmdeploy_gpu/carry (9.6 MiB)
#   bash scripts/lmdeploy_gpu.sh OUT_DIR             # the device call: carry [".lmdeploy_gpu/carry"], timeout 600
#
# Stages (the times are budgets, not measurements):
#   install  <=60 s   hashes checked, /tmp/site_l (scripts/lmdeploy/install.sh) -> OUT_DIR/install.log
#   env      <=60 s   versions, each module of the engine's path imported and timed,
#                     LMDeploy's environment switches, the GPU                  -> OUT_DIR/env.log
#   smoke    <=150 s  engines built through the runtime (small preset: NONE, FULL_DECODE_ONLY,
#                     FULL_AND_PIECEWISE; tiny: FULL_DECODE_ONLY, a probe of head size 16), captured,
#                     8 steps each against transformers and an eager step   -> OUT_DIR/smoke.log, and
#                     LMDeploy's live state as JSON lines (capture sizes its runner computed, graph
#                     keys, per step: decoding, key, path, padded size, padded rows) -> OUT_DIR/live.jsonl
#   suites   the rest pytest over every suite on the small preset (LMDEPLOY_PRESET), the most telling first, the
#                     tests that do not apply to LMDeploy deselected and counted in the report
#                     (--only-declared), stopped with SIGINT at the budget so the report is still
#                     written                                                  -> OUT_DIR/suites.log,
#                     OUT_DIR/report/conformance-lmdeploy-engine.{json,md} (and its plots)
#   matrix   <=20 s   LMDeploy beside vLLM and the reference, rendered from the committed reports
#                     -> OUT_DIR/report/matrix/summary.md
#   Every build, capture and first step is appended to OUT_DIR/events.log as it happens.
# Exit status: pytest's (0 when everything passed or was a known failure), 2 when LMDeploy does not
# install or import, 124/130 when the suites were stopped at the budget.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_call.sh"
gpu_call_begin "${1:-}" "bash scripts/lmdeploy_gpu.sh OUT_DIR"
budget=${LMDEPLOY_GPU_BUDGET_S:-540}
smoke_budget=${LMDEPLOY_SMOKE_S:-150}
preset=${LMDEPLOY_PRESET:-small}  # the suites' model; the smoke stage probes tiny too
site=${LMDEPLOY_SITE:-/tmp/site_l}
python=${PYTHON:-python3}  # the interpreter with the machine's CUDA torch (the vLLM lane's)
mkdir -p "$out/report"

engine_python_path "$site" lmdeploy-engine
events_file CUDAGRAPH_LMDEPLOY_EVENTS
export TQDM_DISABLE=1  # LMDeploy's warm-up progress bars would bury the logs

echo "== install ($(elapsed)s)"
if ! PYTHON="$python" timeout 60 bash scripts/lmdeploy/install.sh "$site" > "$out/install.log" 2>&1; then
    tail -5 "$out/install.log"
    echo "LMDeploy did not install (see $out/install.log): was .lmdeploy_gpu/carry carried?"
    exit 2
fi
tail -1 "$out/install.log"

echo "== env ($(elapsed)s)"
timeout 60 "$python" - > "$out/env.log" 2>&1 <<'EOF'
import importlib, importlib.metadata as md, os, sys, time, traceback
from cudagraph_lmdeploy_engine import settings
settings.apply_environment()
import torch, transformers, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "| triton",
      triton.__version__, "| transformers", transformers.__version__)
print("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
      "free/total GiB", [round(x / 2**30, 1) for x in torch.cuda.mem_get_info()])
failed = []
for name in ("lmdeploy", "lmdeploy.messages", "lmdeploy.pytorch.config", "lmdeploy.pytorch.envs",
             "lmdeploy.pytorch.model_inputs", "lmdeploy.pytorch.engine.config_builder",
             "lmdeploy.pytorch.engine.executor", "lmdeploy.pytorch.engine.model_agent",
             "lmdeploy.pytorch.backends.cuda.graph_runner.runner", "lmdeploy.pytorch.backends.cuda.graph_runner.full_graph",
             "lmdeploy.pytorch.models.llama", "lmdeploy.pytorch.kernels.cuda.pagedattention",
             "cudagraph_lmdeploy_engine.engine", "cudagraph_lmdeploy_engine.runtime"):
    begin = time.perf_counter()
    try:
        module = importlib.import_module(name)
        print(f"IMPORT ok {name} ({time.perf_counter() - begin:.2f}s) from {getattr(module, '__file__', '?')}")
    except Exception:
        failed.append(name)
        print(f"IMPORT FAILED {name}\n{traceback.format_exc()}")
if "lmdeploy" not in failed:
    import lmdeploy
    print("lmdeploy", lmdeploy.__version__, "from", os.path.dirname(lmdeploy.__file__))
for dist in ("pydantic", "pydantic-core", "xgrammar", "apache-tvm-ffi", "mmengine-lite", "pyzmq", "einops",
             "safetensors", "tokenizers", "flash-attn", "flash-attn-3", "hypothesis", "pytest", "pytest-benchmark"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist} not installed")
if "lmdeploy.pytorch.envs" not in failed:
    from lmdeploy.pytorch import envs
    print("LMDeploy switches: fake_capture", envs.fake_capture, "| decode torch.compile",
          envs.enable_decode_torch_compile, "| skip_warmup", envs.skip_warmup)
sys.exit(1 if failed else 0)
EOF
env_status=$?
grep -E "^(python|gpu|lmdeploy |IMPORT FAILED|LMDeploy switches)" "$out/env.log" | cut -c1-300
if [ "$env_status" -ne 0 ]; then
    echo "LMDeploy's engine path does not import (see $out/env.log)"
    exit 2
fi

echo "== smoke ($(elapsed)s, at most ${smoke_budget}s)"
timeout -s INT -k 15 "$smoke_budget" "$python" -m cudagraph_lmdeploy_engine.smoke --live "$out/live.jsonl" \
    > "$out/smoke.log" 2>&1
smoke_status=$?
grep "^SMOKE" "$out/smoke.log" | grep -E "summary|failed|capture|done|built" | cut -c1-400
[ "$smoke_status" -ne 0 ] && echo "smoke stage exited $smoke_status (124/130: stopped at its budget); the suites run anyway"

left=$(( budget - $(elapsed) - 20 ))  # 20 s kept for the matrix
echo "== suites ($(elapsed)s, at most ${left}s)"
# Most telling first, so a run stopped at the budget has the numerical and graph checks done.
suites=(test_numerical_anchor test_replay_equivalence test_capture_accounting test_padding_isolation
        test_fallback test_backend_support test_capture_side_effects test_static_addresses
        test_launch_overhead test_batch_invariance test_dispatch test_padding test_capture_sizes
        test_mode_resolution test_data_parallel test_data_parallel_execution test_serving test_step_latency)
ordered_suites "${suites[@]}"  # any suite added later runs too, last
timeout -s INT -k 30 "$left" "$python" -m pytest "${paths[@]}" \
    --runtime cudagraph_lmdeploy_engine.runtime:LmdeployEngineRuntime --graph-backend cuda --preset "$preset" \
    -p no:xdist -p no:cacheprovider --benchmark-skip --only-declared --report-dir "$out/report" -q -rs --tb=short \
    --show-capture=no --test-timeout 240 > "$out/suites.log" 2>&1
status=$?
tail -n 60 "$out/suites.log" | cut -c1-300

echo "== matrix ($(elapsed)s)"
report="$out/report/conformance-lmdeploy-engine.json"
if [ -f "$report" ]; then
    timeout 20 "$python" -m harness.reports.render reports/h200/nightly/suites/conformance-reference.json \
        reports/h200/vllm/conformance-vllm-engine.json "$report" --out "$out/report/matrix" \
        --title "LMDeploy beside vLLM and the reference (H200)" > /dev/null 2>&1 \
        || echo "matrix not rendered (render it here: see reports/h200/lmdeploy/README.md)"
fi
echo "== done in $(elapsed)s: pytest exit $status; logs in $out"
exit "$status"
