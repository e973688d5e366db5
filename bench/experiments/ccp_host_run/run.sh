#!/usr/bin/env bash
# Builds and runs host_run.cpp: kernels/causal_conv3d_cat_pad.cuh's device code on the host (no
# GPU; a few minutes on 2 cores, mostly thread start-up). The kernel header is copied beside
# this folder's stand-ins of common/memory.cuh and common/types.cuh (its quoted includes look
# beside it first); extra arguments go to g++, e.g. -DDITOPS_CCP_STEP_ORDER=1.
#   bash bench/experiments/ccp_host_run/run.sh [-DNAME=VALUE ...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kernels=$here/../../../kernels
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$here/common" "$tmp/common"
cp "$kernels/causal_conv3d_cat_pad.cuh" "$tmp/"
cp "$kernels/common/fast_divide.h" "$tmp/common/"
g++ -std=c++20 -O1 -pthread -I"$tmp" -include "$here/shim.h" "$@" "$here/host_run.cpp" -o "$tmp/host_run"
"$tmp/host_run"
