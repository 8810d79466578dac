#!/usr/bin/env bash
# Install LMDeploy 0.18.0's PyTorch engine on the GPU machine from the carried folder
# .lmdeploy_gpu/carry (made here by `python scripts/lmdeploy/fetch.py`), every file checked against
# scripts/lmdeploy/SHA256SUMS first, into SITE (default /tmp/site_l; put it on PYTHONPATH).
# No network, no pip resolution: the 17 wheels go in with --no-deps, LMDeploy's stripped tree is
# unpacked beside them. Idempotent: a SITE already installed from the same SHA256SUMS is left alone.
#
#   bash scripts/lmdeploy/install.sh [SITE]
# Exit status: 0 installed (or already), 2 a carried file missing or not matching its hash.
set -euo pipefail
cd "$(dirname "$0")/../.."
site=${1:-${LMDEPLOY_SITE:-/tmp/site_l}}
python=${PYTHON:-python3}
sums=scripts/lmdeploy/SHA256SUMS
stamp="$site/.cudagraph-lmdeploy-sha256sums"
want=$(sha256sum "$sums" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "lmdeploy: already installed in $site from the same SHA256SUMS"
    exit 0
fi
missing=()
while read -r _ path; do
    [ -f "$path" ] || missing+=("$path")
done < "$sums"
if [ "${#missing[@]}" -ne 0 ]; then
    echo "lmdeploy: not carried: ${missing[*]} (run 'python scripts/lmdeploy/fetch.py' where the network is, and" \
         "carry .lmdeploy_gpu/carry)" >&2
    exit 2
fi
if ! sha256sum --quiet --strict -c "$sums"; then
    echo "lmdeploy: a carried file does not match scripts/lmdeploy/SHA256SUMS (above): not installed" >&2
    exit 2
fi
mkdir -p "$site"
wheels=$(awk '$2 ~ /\.whl$/ {print $2}' "$sums")
# shellcheck disable=SC2086  # one word a wheel path
"$python" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" $wheels
tar -xzf "$(awk '$2 ~ /\.tar\.gz$/ {print $2}' "$sums")" -C "$site"
echo "$want" > "$stamp"
echo "lmdeploy: installed into $site: $(wc -l < "$sums") files checked, LMDeploy" \
     "$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$site/lmdeploy/version.py")"
