#!/usr/bin/env bash
# layernorm_modulate's stepped loop (opt-in DITOPS_LNM_STEPPED=1: pointer steps, two rows an iteration;
# docs/layernorm_modulate.md) against the measured loop on a GPU, in one device call (about 6 minutes
# with the build):
#
#   OUT=DIR bash bench/experiments/lnm_stepped_run.sh
#
# builds the library, test_layernorm_modulate_gpu and test_ops (no AOT kernels, no Python module;
# build-gt/); runs the GPU test and the driver's layernorm_modulate* cases with the variable off and on;
# then bench/layernorm_modulate_fp8_rowwise_torch.py and bench/layernorm_modulate_torch.py, off and on
# in turn, LNM_ROUNDS rounds (default 2; one process each: the variable is read once per device), the
# first "on" run of each with its torch.equal checks; then compute-sanitizer (memcheck, racecheck)
# over the GPU test and the driver's cases with it on, until LNM_DEADLINE_S (default 560 s).
# Writes OUT/lnm_stepped.tgz (logs, records b_<script>_<off|on>_<round>.json and their _checks) and
# prints each run's verdict line. The benches load libditops by ctypes: no wheels needed. The records
# do not name the variable: give the "on" ones the impl ditops:jit:stepped before records.py convert
# (as the GELU table's runs were folded in beside ditops:jit).
RUN_NAME=lnm_stepped
source "$(dirname "$0")/run_prelude.sh"
build_gt test_layernorm_modulate_gpu test_ops
for on in 0 1; do
  DITOPS_LNM_STEPPED=$on build-gt/tests/test_layernorm_modulate_gpu > "$W/gtest_$on.txt" 2>&1
  echo "GPU test, DITOPS_LNM_STEPPED=$on: rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$W/gtest_$on.txt" | tr '\n' ' ')"
  DITOPS_LNM_STEPPED=$on timeout 150 build-gt/tests/test_ops --gtest_filter='*every_cuda_implementation*/layernorm_modulate*' \
    > "$W/driver_$on.txt" 2>&1
  echo "driver cases, DITOPS_LNM_STEPPED=$on: rc $? $(grep -cE '^\[       OK' "$W/driver_$on.txt") ok, $(grep -cE '^\[  FAILED  \] ' "$W/driver_$on.txt") failed lines"
done
for script in layernorm_modulate_fp8_rowwise layernorm_modulate; do
  for round in $(seq 1 "${LNM_ROUNDS:-2}"); do
    for on in 0 1; do
      name=$([ $on = 1 ] && echo on || echo off)
      skip=1; [ $on = 1 ] && [ "$round" = 1 ] && skip=0  # the checks once, on the new kernels
      DITOPS_LNM_STEPPED=$on DITOPS_BENCH_SKIP_CHECKS=$skip DITOPS_BENCH_METHODS=${LNM_METHODS:-rotated_graph} \
        DITOPS_BENCH_IMPLS=ditops timeout 120 python3 "bench/${script}_torch.py" --lib build-gt/libditops.so \
        --json "$W/b_${script}_${name}_$round.json" --commit "$COMMIT" > "$W/b_${script}_${name}_$round.txt" 2>&1
      echo "$script $name round $round: rc $? at $(el) s $(grep -E 'PASS|FAIL' "$W/b_${script}_${name}_$round.txt" | tail -1)"
    done
  done
done
left=$(( ${LNM_DEADLINE_S:-560} - $(el) - 15 ))
if [ $left -ge 40 ]; then
  DITOPS_LNM_STEPPED=1 timeout $(( left + 10 )) python3 scripts/sanitize.py --build build-gt --out "$W/sanitizer" \
    --budget-s $left --filter '*every_cuda_implementation*/layernorm_modulate*:LayerNormModulateGpu.*' 2>&1 | tail -12
else
  echo "compute-sanitizer: not run ($left s left)"
fi
