#!/usr/bin/env bash
# Builds the qknorm tuning variants in parallel and runs them one after another (on the GPU).
set -u
cd "$(dirname "$0")"
build() { nvcc -O3 -std=c++17 -arch=sm_90a -I../../kernels -I. "$2" qknorm_tune.cu -o "/tmp/qk_tune_$1" 2>&1 | grep -E "error" ; }
build c2 -DDITOPS_QK_CHUNK=2 & build c4 -DDITOPS_QK_CHUNK=4 & build c8 -DDITOPS_QK_CHUNK=8 & wait
for v in c2 c4 c8; do /tmp/qk_tune_$v; done
