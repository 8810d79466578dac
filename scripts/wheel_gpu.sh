#!/usr/bin/env bash
# The installed suites on a GPU: build the wheel, install it with the example engine into a fresh
# environment (the machine's torch, with --system-site-packages), run the bucket engine's suites on
# CUDA graphs from a temporary directory, run the same from this checkout, and compare the two
# reports (same tests, same outcomes, same suites digest). Everything lands in OUT_DIR.
#
#   bash scripts/wheel_gpu.sh OUT_DIR        # about two minutes on an H200; needs the project installed
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: scripts/wheel_gpu.sh OUT_DIR}")
mkdir -p "$out"
work=$(mktemp -d)
python -m pip wheel --no-deps --no-build-isolation --no-index -q -w "$work/dist" . > "$out/build.log" 2>&1 || { echo "wheel build failed"; exit 1; }
python -m venv --system-site-packages --without-pip "$work/env"
python -m pip --python "$work/env/bin/python" install --no-deps --no-index --no-build-isolation --ignore-installed -q \
    "$work"/dist/*.whl ./examples/bucket_engine >> "$out/build.log" 2>&1 || { echo "install failed"; exit 1; }
options=(--runtime bucket-engine --graph-backend cuda -p no:xdist --benchmark-skip --hypothesis-seed 12345 -q -rs)
mkdir -p "$work/engine-repo"
(cd "$work/engine-repo" && env -u PYTHONPATH "$work/env/bin/cudagraph-conformance" "${options[@]}" \
    --report-dir "$out/wheel") > "$out/wheel.log" 2>&1
wheel=$?
python -m pytest suites/ "${options[@]}" -p no:cacheprovider --report-dir "$out/repo" > "$out/repo.log" 2>&1
repo=$?
python - "$out" <<'PY' | tee "$out/compare.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
wheel, repo = (json.loads((out / side / "conformance-bucket-engine.json").read_text()) for side in ("wheel", "repo"))
outcomes = lambda r: {t["nodeid"]: t["outcome"] for t in r["tests"]}
print(f"wheel: {wheel['summary']} in {wheel['seconds']:.1f} s, git_commit {wheel['git_commit']}")
print(f"repo:  {repo['summary']} in {repo['seconds']:.1f} s, git_commit {repo['git_commit']}")
print("same outcomes:", outcomes(wheel) == outcomes(repo), "; same suites digest:", wheel["suites_digest"] == repo["suites_digest"])
PY
rm -rf "$work"
echo "wheel run exit $wheel, checkout run exit $repo"
[ "$wheel" -eq 0 ] && [ "$repo" -eq 0 ]
