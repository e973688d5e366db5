#!/usr/bin/env bash
# Builds the tuning experiments and runs them one after another (on the GPU machine):
#   bash bench/experiments/run_tune.sh qknorm   the qknorm_rope unit sizes (three builds in parallel)
#   bash bench/experiments/run_tune.sh adaln [PART]  layernorm_modulate, norm_scale_shift, qk-head,
#                                        residual_gate_add variants (PART: see adaln_tune.cu's main)
#   bash bench/experiments/run_tune.sh ab PART BASE  PART of adaln_tune.cu built against BASE/kernels (an
#                                        earlier commit's kernels, e.g. from git archive) and against
#                                        this tree's, run one after the other (A/B in one session)
#   bash bench/experiments/run_tune.sh ccp      causal_conv3d_cat_pad: windows per lane and step, the
#                                        warps' step order, the general kernel's resident blocks
#                                        (four builds in parallel, ccp_tune.cu)
#   bash bench/experiments/run_tune.sh profile  Nsight Compute (ncu) on the norm_scale_shift rows
#                                        (library schedules: FLUX plain / residual / nvfp4, Wan nvfp4, 512 x 3072 residual / nvfp4)
set -u
cd "$(dirname "$0")"
case "${1:-adaln}" in
  qknorm)
    build() { nvcc -O3 -std=c++17 -arch=sm_90a -I../../kernels -I. "$2" qknorm_tune.cu -o "/tmp/qk_tune_$1" 2>&1 | grep -E "error" ; }
    build c2 -DQK_TUNE_CHUNK=2 & build c4 -DQK_TUNE_CHUNK=4 & build c8 -DQK_TUNE_CHUNK=8 & wait
    for v in c2 c4 c8; do /tmp/qk_tune_$v; done ;;
  adaln)  # --default-stream per-thread: rotated_graph_us captures the <<<>>> launches
    nvcc -O3 -std=c++17 -arch=sm_90a --default-stream per-thread -DDITOPS_TUNE_NSS -I../../kernels adaln_tune.cu \
      -o /tmp/adaln_tune && /tmp/adaln_tune ${2:-} ;;
  ab)
    build() { nvcc -O3 -std=c++17 -arch=sm_90a --default-stream per-thread -DDITOPS_TUNE_NSS -I"$1" adaln_tune.cu -o "$2"; }
    base=$(cd "$3" && pwd)/kernels
    build "$base" /tmp/adaln_tune_base & build ../../kernels /tmp/adaln_tune_new & wait
    echo "== A: $base"; /tmp/adaln_tune_base "$2"
    echo "== B: this tree"; /tmp/adaln_tune_new "$2" ;;
  ccp)
    build() { nvcc -O3 -std=c++17 -arch=sm_90a -I../../kernels -I. $2 ccp_tune.cu -o "/tmp/ccp_tune_$1" 2>&1 | grep -E "error" ; }
    build u2o0 "-DDITOPS_CCP_UNROLL_GENERAL=2 -DDITOPS_CCP_UNROLL_ALIGNED=4 -DDITOPS_CCP_STEP_ORDER=0" &
    build u2o1 "-DDITOPS_CCP_UNROLL_GENERAL=2 -DDITOPS_CCP_UNROLL_ALIGNED=4 -DDITOPS_CCP_STEP_ORDER=1" &
    build u1o0 "-DDITOPS_CCP_UNROLL_GENERAL=1 -DDITOPS_CCP_UNROLL_ALIGNED=2 -DDITOPS_CCP_STEP_ORDER=0 -DCCP_TUNE_MIN_BLOCKS_GENERAL=5 -DDITOPS_CCP_UNROLL_PARTS=1 -DCCP_TUNE_MIN_BLOCKS_PARTS=4" &
    build u1o1 "-DDITOPS_CCP_UNROLL_GENERAL=1 -DDITOPS_CCP_UNROLL_ALIGNED=2 -DDITOPS_CCP_STEP_ORDER=1 -DCCP_TUNE_MIN_BLOCKS_GENERAL=5 -DDITOPS_CCP_UNROLL_PARTS=1 -DCCP_TUNE_MIN_BLOCKS_PARTS=4" &
    wait
    for v in u2o0 u2o1 u1o0 u1o1; do /tmp/ccp_tune_$v; done ;;
  profile)  # --clock-control none: the device tool's METHOD.md asks to leave the clocks alone
    nvcc -O3 -std=c++17 -arch=sm_90a --default-stream per-thread -DDITOPS_TUNE_NSS -lineinfo -I../../kernels \
      adaln_tune.cu -o /tmp/adaln_tune &&
      ncu --clock-control none -k regex:nss_variant --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis /tmp/adaln_tune profile ;;
esac
