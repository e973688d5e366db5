#!/usr/bin/env bash
# The GELU table of fp8_rowwise_quant (kernels/common/gelu_table.cuh, opt-in DITOPS_GELU_TABLE=1) on a
# GPU, in one device call (about 4 minutes with the build):
#
#   OUT=DIR bash bench/experiments/gelu_table_run.sh
#
# builds the library and test_fp8_rowwise_quant (no AOT kernels, no Python module; build-gt/), runs
# the table's tests (every bf16 value against the evaluated GELU) and the op's driver cases with the
# table on and off, then bench/fp8_rowwise_quant_torch.py twice (DITOPS_GELU_TABLE=0, then 1: the
# feature is read once per device, so one process each): its torch.equal checks (every GELU case
# of 2112 rows or more takes the table with it on) and the GELU cases' timings, rotated graph, beside
# eager, torch.compile and a device copy. Writes OUT/gelu_table.tgz: build.log, gtest.txt,
# torch_off.txt / torch_on.txt and their records (torch_fp8_rowwise_quant_{off,on}.json, _checks).
# GT_FEW_ROWS=1: also a library built with DITOPS_FRQ_TABLE_MIN_ROWS_PER_CTA=0 (calls of few rows, FLUX.1's
# 512 text rows among them, take the table too), its GELU cases with the table on (torch_few.txt).
# Needs .whl (bench/experiments/wheels.sh) only for nothing: the benches load libditops by ctypes.
RUN_NAME=gelu_table
source "$(dirname "$0")/run_prelude.sh"
build_gt test_fp8_rowwise_quant test_ops
build-gt/tests/test_fp8_rowwise_quant 2>&1 | tee "$W/gtest.txt" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|Failure|mismatch"
for on in 0 1; do
  DITOPS_GELU_TABLE=$on timeout 120 build-gt/tests/test_ops --gtest_filter='*every_cuda_implementation*/fp8_rowwise_quant_*' > "$W/driver_$on.txt" 2>&1
  echo "driver cases, DITOPS_GELU_TABLE=$on: rc $? $(grep -cE '^\[       OK' "$W/driver_$on.txt") ok, $(grep -cE '^\[  FAILED  \] ' "$W/driver_$on.txt") failed lines"
done
if [ "${GT_FEW_ROWS:-0}" = 1 ]; then  # the table at few rows too (a build knob), beside the two runs below
  { cmake -S . -B build-gt-few -G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_AOT=OFF -DDITOPS_BUILD_PYTHON=OFF \
      -DDITOPS_BUILD_BENCH=OFF -DDITOPS_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS=-DDITOPS_FRQ_TABLE_MIN_ROWS_PER_CTA=0 &&
    cmake --build build-gt-few -j 16 --target ditops; } > "$W/build_few.log" 2>&1 || tail -5 "$W/build_few.log"
  DITOPS_GELU_TABLE=1 DITOPS_BENCH_CASES='gelu' DITOPS_BENCH_IMPLS=ditops DITOPS_BENCH_METHODS=rotated_graph timeout ${BENCH_S:-150} \
    python3 bench/fp8_rowwise_quant_torch.py --lib build-gt-few/libditops.so --commit "$COMMIT-few-rows" \
    --json "$W/torch_fp8_rowwise_quant_few.json" > "$W/torch_few.txt" 2>&1
  echo "== bench, the table at few rows too: rc $? at $(( $(date +%s) - T0 )) s"
  grep -E "PASS|FAIL|MISMATCH|gelu" "$W/torch_few.txt" | tail -12
fi
for on in 0 1; do
  tag=$([ $on = 1 ] && echo on || echo off)
  DITOPS_GELU_TABLE=$on DITOPS_BENCH_CASES='gelu' DITOPS_BENCH_METHODS=rotated_graph timeout ${BENCH_S:-150} \
    python3 bench/fp8_rowwise_quant_torch.py --lib build-gt/libditops.so --commit "$COMMIT" \
    --json "$W/torch_fp8_rowwise_quant_$tag.json" > "$W/torch_$tag.txt" 2>&1
  echo "== bench DITOPS_GELU_TABLE=$on rc $? at $(( $(date +%s) - T0 )) s"
  grep -E "PASS|FAIL|MISMATCH|gelu" "$W/torch_$tag.txt" | tail -20
done
