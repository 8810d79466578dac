#!/usr/bin/env bash
# The README's two CPU commands, timed, their output kept as the evidence for the CPU figures the
# README quotes (python scripts/figures.py renders them from reports/cpu/*/).
#
#   bash scripts/cpu_runs.sh [OUT_DIR]     # default reports/cpu/<today, UTC>
#
# Run after scripts/install.sh, on the machine whose figures you mean to quote; host.txt records its
# cores and how busy it was, since a shared machine's times say as much about its load as the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/cpu/$(date -u +%F)}
scratch=$(mktemp -d)
versions=$(python -c 'import platform, torch; print(f"Python {platform.python_version()}, torch {torch.__version__}")')
echo "$(nproc) CPU cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the runs; $versions" > "$scratch/host.txt"
# Everything lands in OUT_DIR at the end: the self-tests check the README against the committed
# logs, and a log appearing in the tree halfway through the run is one the README does not quote yet.
python -m pytest suites/ --runtime reference -n 2 --report-dir "$scratch/report" -p no:cacheprovider \
    > "$scratch/first-command.log" 2>&1
first=$?
python -m pytest -n 2 -p no:cacheprovider > "$scratch/all-tests.log" 2>&1
all=$?
mkdir -p "$out"
mv "$scratch/host.txt" "$scratch/first-command.log" "$scratch/all-tests.log" "$out/"
rm -rf "$scratch"
echo "first command: exit $first; every test: exit $all; logs in $out (then: python scripts/figures.py)"
[ "$first" -eq 0 ] && [ "$all" -eq 0 ]
