#!/bin/bash
# Issue 31's broken engines and runtimes against the suites, harness and checkpoint of another
# checkout (MAIN, default /work/main), then against this checkout's: each passes there and is
# caught here. Run from this checkout: bash reports/issue31/slip_past_main.sh > reports/issue31/slip_past_main.log
MAIN=${MAIN:-/work/main}; BRANCH=$(pwd); MUT=$(mktemp -d)
cp tests/broken_example_engines.py "$MUT/mutx.py"; cp tests/broken_example_models.py "$MUT/mutm.py"
cp tests/broken_runtimes.py "$MUT/mut_policy.py"
export OMP_NUM_THREADS=1
echo "main: $(git -C "$MAIN" log --oneline -1)"; echo "branch: $(git log --oneline -1)"
run() {  # tree pythonpath runtime suites...
  local tree=$1 path=$2 runtime=$3; shift 3
  (cd "$tree" && PYTHONPATH=$path python -m pytest "$@" --runtime "$runtime" -p no:xdist -q -p no:cacheprovider -p no:randomly 2>&1 | tail -1)
}
for v in PowerOfTwoLookup GraphsKeyedByExponent DecodeGraphSkipsNewRows SmallestFirstUncopiedTop LastDecodeRefused \
         NoLengthCheck RopeTableOneShort LastSlotNotAttended; do
  echo "$v  main: $(run "$MAIN" "$MAIN:$MUT:$BRANCH/examples/bucket_engine" "mutx:$v" suites/)"
  echo "$v  branch: $(run "$BRANCH" "$BRANCH:$BRANCH/examples/bucket_engine" "tests.broken_example_engines:$v" suites/)"
done
for v in IgnoresRmsNormEps IgnoresHiddenAct IgnoresAttentionBias IgnoresMlpBias IgnoresRopeTheta IgnoresRopeType \
         HeadNotTied ScaleFromHiddenSize NormWeightsNotLoaded; do
  echo "$v  main: $(run "$MAIN" "$MAIN:$MUT:$BRANCH/examples/bucket_engine" "mutm:$v" suites/test_numerical_anchor.py)"
  echo "$v  branch: $(run "$BRANCH" "$BRANCH:$BRANCH/examples/bucket_engine" "tests.broken_example_models:$v" suites/test_numerical_anchor.py)"
done
P="suites/test_capture_sizes.py suites/test_padding.py suites/test_dispatch.py suites/test_mode_resolution.py suites/test_data_parallel.py"
echo "V2DecodeKeysPastTheMax  main: $(run "$MAIN" "$MAIN:$MUT" mut_policy:V2DecodeKeysPastTheMax $P)"
echo "V2DecodeKeysPastTheMax  branch: $(run "$BRANCH" "$BRANCH" tests.broken_runtimes:V2DecodeKeysPastTheMax $P)"
rm -rf "$MUT"
