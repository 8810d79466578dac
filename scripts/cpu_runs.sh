#!/usr/bin/env bash
# The README's two CPU commands, timed against the machine they run on (scripts/time_breakdown.py
# --targets: the yardstick loop before and after each run, every figure also in loop-times), their
# output kept as the evidence for the CPU figures the README quotes (python scripts/figures.py
# renders them from reports/cpu/*/).
#
#   bash scripts/cpu_runs.sh [OUT_DIR]     # default reports/cpu/<today, UTC>; RUNS=3 for three runs each
#
# Run after scripts/install.sh, on the machine whose figures you mean to quote; host.txt records its
# cores and how busy it was, since a shared machine's times say as much about its load as the tests.
# Everything lands in OUT_DIR at the end: the self-tests check the README against the committed
# logs, and a log appearing in the tree halfway through the run is one the README does not quote yet.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-reports/cpu/$(date -u +%F)}
python scripts/time_breakdown.py --targets --runs "${RUNS:-1}" --out "$out"
status=$?
echo "logs in $out (then: python scripts/figures.py); time_breakdown exit $status (1: a target not met in every run)"
exit "$status"
