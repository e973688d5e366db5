#!/usr/bin/env bash
# The SiLU table of fp8_rowwise_quant's SwiGLU rows (kernels/common/act_table.cuh, opt-in
# DITOPS_SILU_TABLE=1) on two grids, in one device call (about 3 minutes with the builds):
#
#   OUT=DIR bash bench/experiments/silu_table_run.sh
#
# builds the library with the op's tests twice (no AOT kernels, no Python module): build-gt with
# the table's CTAs on the persistent grid (the default), build-g2 with
# -DDITOPS_FRQ_SILU_TABLE_PERSISTENT=0 (a CTA a row over a grid of every row, each building its own
# table); runs the table check (every bf16 value against the evaluated SiLU) and the op's driver
# cases with the table on in each build, then bench/fp8_rowwise_quant_torch.py's swiglu cases three
# times (DITOPS_SILU_TABLE is read once per device, so one process each): evaluated (build-gt,
# DITOPS_SILU_TABLE=0), table persistent (build-gt, =1), table a CTA a row (build-g2, =1), rotated
# graph, torch.equal checks first. Writes OUT/silu_table.tgz: the build logs, gtest.txt,
# driver_{gt,g2}.txt, frq_{eval,persistent,rows}.txt and their records (.json, _checks.json).
. "$(dirname "$0")/table_run_prelude.sh" silu_table
FLAGS="-G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_AOT=OFF -DDITOPS_BUILD_PYTHON=OFF -DDITOPS_BUILD_BENCH=OFF"
( cmake -S . -B build-g2 $FLAGS -DCMAKE_CXX_FLAGS=-DDITOPS_FRQ_SILU_TABLE_PERSISTENT=0 &&
    cmake --build build-g2 -j 8 --target ditops test_ops ) > "$W/build_g2.log" 2>&1 &
{ cmake -S . -B build-gt $FLAGS && cmake --build build-gt -j 8 --target ditops test_fp8_rowwise_quant test_ops; } \
  > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; exit 1; }
wait $! || { tail -30 "$W/build_g2.log"; exit 1; }
echo "== built at $(( $(date +%s) - T0 )) s"
build-gt/tests/test_fp8_rowwise_quant 2>&1 | tee "$W/gtest.txt" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|differs"
for b in gt g2; do
  DITOPS_SILU_TABLE=1 timeout 120 build-$b/tests/test_ops --gtest_filter='*every_cuda_implementation*/fp8_rowwise_quant_*' \
    > "$W/driver_$b.txt" 2>&1
  echo "driver cases, build-$b, DITOPS_SILU_TABLE=1: rc $? $(grep -cE '^\[       OK' "$W/driver_$b.txt") ok, $(grep -cE '^\[  FAILED  \] ' "$W/driver_$b.txt") failed lines"
done
for v in eval:gt:0 persistent:gt:1 rows:g2:1; do
  IFS=: read -r name b on <<< "$v"
  DITOPS_SILU_TABLE=$on DITOPS_BENCH_CASES='swiglu' DITOPS_BENCH_METHODS=rotated_graph timeout ${BENCH_S:-100} \
    python3 bench/fp8_rowwise_quant_torch.py --lib build-$b/libditops.so --commit "$COMMIT" \
    --json "$W/frq_$name.json" > "$W/frq_$name.txt" 2>&1
  echo "== bench $name (build-$b, DITOPS_SILU_TABLE=$on) rc $? at $(( $(date +%s) - T0 )) s"
  grep -E "VERIFY|MISMATCH|ditops:jit|device_copy" "$W/frq_$name.txt" | tail -8
done
