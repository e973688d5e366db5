#!/usr/bin/env bash
# causal_conv3d_cat_pad (issue 46) in one device call, about 4 minutes on an H200:
#
#   OUT=DIR bash bench/experiments/ccp_ab_run.sh BASE_TREE
#
# builds this tree (the library, the op's test binary and the op test driver; no AOT kernels, no
# Python module) and BASE_TREE's library (a whole earlier tree, e.g. `git archive` of the commit
# before the window kernels unpacked into .base/NAME and carried: its host code differs) side by
# side; runs the op's tests (its GPU test, the driver's cases of the op: ctest); then
# bench/causal_conv3d_cat_pad_torch.py with BASE_TREE's library as "ditops:base" beside this
# tree's, eager, torch.compile and a device copy at every case of the grid, each case checked with
# torch.equal for both builds first, timed cold graph only over 2 buffer sets
# (DITOPS_BENCH_METHODS, DITOPS_BENCH_COLD_SETS: the 54 cases in the time of one call); then,
# unless CCP_TUNE=0 (about 30 s less), the knobs of bench/experiments/ccp_tune.cu (run_tune.sh ccp:
# windows per lane and step, step order, resident blocks, the grid), built beside the library; it
# runs the parts and the general kernel side by side at every unaligned case (the row-length bound
# kCcpPartsMaxRowBytes is where they cross), and the chunks kernel beside them at every NCTHW case
# (ccp_chunks_fit: whether ccp_path takes it over parts), and the summary ends with those rows.
# Writes to OUT (default ./device-out), 7 files: summary.txt (phases, ctest and bench verdicts, the
# acceptance table), torch_causal_conv3d_cat_pad.json (records) and its _checks.json (torch.equal
# per case and build), torch.txt (the bench's output), ctest.log, tune.txt (ccp_tune's table per
# build), build_logs.tar.gz. Each phase's timeout ends it by CCP_DEADLINE_S (default 570) after the
# start, inside the device tool's 10 minutes.
set -uo pipefail
T0=$(date +%s)
BASE=$(cd "${1:?usage: bench/experiments/ccp_ab_run.sh BASE_TREE}" && pwd)
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)  # the build logs, tarred into OUT
DEADLINE=$(( $(date +%s) + ${CCP_DEADLINE_S:-570} ))
left() { local t=$(( DEADLINE - $(date +%s) - ${1:-0} )); echo $(( t > 30 ? t : 30 )); }  # seconds to the deadline, less $1
export DITOPS_CACHE_DIR=${DITOPS_CACHE_DIR:-/tmp/ditops-ccp-cache} PYTHONUNBUFFERED=1
COMMIT=$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
finish() { tar -C "$LOGS" -czf "$OUT/build_logs.tar.gz" . ; say "== total $(( $(date +%s) - T0 )) s"; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
say "commit $COMMIT, base $BASE"
JOBS=${JOBS:-12}  # this tree's build; the base's gets half
FLAGS="-G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_AOT=OFF -DDITOPS_BUILD_PYTHON=OFF -DDITOPS_BUILD_BENCH=OFF"
( cmake -S "$BASE" -B /tmp/ccp-base $FLAGS -DDITOPS_BUILD_TESTS=OFF && cmake --build /tmp/ccp-base -j $(( (JOBS + 1) / 2 )) --target ditops ) \
  > "$LOGS/build_base.log" 2>&1 &
BASE_PID=$!
TUNE_PID=
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "${CCP_TUNE:-1}" = 1 ]; then  # its four nvcc builds, beside the libraries'
  # name, general unroll, aligned unroll, step order, general min blocks, parts unroll, parts min blocks,
  # chunks windows per lane (u2o0 the library's knobs; u1o0 the aligned kernel at one window a lane)
  ( cd bench/experiments && for v in "u2o0 2 4 0 4 2 3 2" "u2o1 2 4 1 4 2 3 8" "u1o0 1 1 0 5 1 4 4" "u1o1 1 2 1 5 1 4 6"; do
      set -- $v
      "$NVCC" -O3 -std=c++17 -arch=sm_90a -I../../kernels -I. -DDITOPS_CCP_UNROLL_GENERAL=$2 -DDITOPS_CCP_UNROLL_ALIGNED=$3 \
        -DDITOPS_CCP_STEP_ORDER=$4 -DCCP_TUNE_MIN_BLOCKS_GENERAL=$5 -DDITOPS_CCP_UNROLL_PARTS=$6 \
        -DCCP_TUNE_MIN_BLOCKS_PARTS=$7 -DDITOPS_CCP_UNROLL_CHUNKS=$8 ccp_tune.cu -o /tmp/ccp_tune_$1 &
    done; wait ) > "$LOGS/build_tune.log" 2>&1 &
  TUNE_PID=$!
fi
( cmake -S . -B build-ccp $FLAGS -DDITOPS_BUILD_TESTS=ON &&
    cmake --build build-ccp -j $JOBS --target ditops test_causal_conv3d_cat_pad test_ops ) > "$LOGS/build.log" 2>&1 ||
  { say "BUILD FAILED"; grep -E -A5 "error" "$LOGS/build.log" | head -40 | tee -a "$OUT/summary.txt"; exit 1; }
wait $BASE_PID || { say "BASE BUILD FAILED"; grep -E -A5 "error" "$LOGS/build_base.log" | head -40 | tee -a "$OUT/summary.txt"; exit 1; }
say "== built in $(( $(date +%s) - T0 )) s"

# The op's GPU test and its driver cases (both kinds of the driver's tests, the op's four parts of each).
timeout "$(left 300)" ctest --test-dir build-ccp -j 4 --output-on-failure --timeout 230 \
  -R 'CausalConv3dCatPad|ops\.[a-z_]*/causal_conv3d_cat_pad_part' > "$OUT/ctest.log" 2>&1
say "ctest rc=$? ($(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)) at $(( $(date +%s) - T0 )) s"
grep -E "Failed|\*\*\*Exception|Timeout|differ|written" "$OUT/ctest.log" | head -20 | tee -a "$OUT/summary.txt"

# torch.equal and the timings, this tree's kernels against the base's.
DITOPS_BENCH_METHODS=${DITOPS_BENCH_METHODS:-cold_graph} DITOPS_BENCH_COLD_SETS=${DITOPS_BENCH_COLD_SETS:-2} \
  timeout "$(left $([ -n "$TUNE_PID" ] && echo 60 || echo 0))" python3 bench/causal_conv3d_cat_pad_torch.py \
  --lib build-ccp/libditops.so --lib-base /tmp/ccp-base/libditops.so --commit "$COMMIT" \
  --json "$OUT/torch_causal_conv3d_cat_pad.json" > "$OUT/torch.txt" 2>&1
say "bench rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^(verification|graph replay|bench cases|VERIFY|MISMATCH)" "$OUT/torch.txt" | head -20 | tee -a "$OUT/summary.txt"
sed -n '/^acceptance/,/^ACCEPTANCE/p' "$OUT/torch.txt" | tee -a "$OUT/summary.txt"

if [ -n "$TUNE_PID" ]; then
  wait $TUNE_PID
  : > "$OUT/tune.txt"
  for v in u2o0 u2o1 u1o0 u1o1; do [ -x /tmp/ccp_tune_$v ] && timeout "$(left)" /tmp/ccp_tune_$v >> "$OUT/tune.txt" 2>&1; done
  # The chunks / parts / general A/B (build u2o0: the library's knobs), one-step and resident grids;
  # then the chunks rows of the other builds (8, 4 and 6 windows per lane).
  awk '/^variant/{n++} n==1 && / (chunks|parts|general|aligned) /' "$OUT/tune.txt" | tee -a "$OUT/summary.txt"
  awk '/^variant/{n++; v=$0} n>1 && !/^variant/ && / chunks / {print v " | " $0}' "$OUT/tune.txt" | sed 's/variant: unroll general [^|]*chunks \([0-9]*\)[^|]*|/chunks unroll \1 |/' | tee -a "$OUT/summary.txt"
  say "tune at $(( $(date +%s) - T0 )) s: $(grep -c '^variant' "$OUT/tune.txt") builds, $(grep -vE '^variant' "$OUT/tune.txt" | grep -cE ' (general|aligned|parts|chunks) ') rows, $(grep -vE '^variant' "$OUT/tune.txt" | grep -E ' (general|aligned|parts|chunks) ' | awk '$NF != 0' | wc -l) with bytes differing from the reference"
fi
