#!/usr/bin/env bash
# The one script that runs on the GPU machine (the `device` tool): builds ditops there, runs the
# whole test suite (GPU tests included), verifies bit-exactness against the PyTorch eager chain,
# benchmarks against eager and torch.compile, and prints a short table. Results go to $OUT (and
# are copied into bench/results/ by the developer, with device, date and commit). At most 7
# files go to $OUT: the device tool brings back 8.
#   usage: bash scripts/device_run.sh [--quick]
set -uo pipefail
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || cat .commit 2>/dev/null || echo unknown)
DATE=$(date -u +%Y-%m-%d)
export DITOPS_CACHE_DIR=$(mktemp -d)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/summary.txt"

echo "== build"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
cmake --build build-dev -j 16 >> "$OUT/build.log" 2>&1 || { grep -E -A5 'error' "$OUT/build.log" | head -80; exit 1; }
build-dev/ditops info | tee -a "$OUT/summary.txt"

echo "== tests (CPU + GPU)"
ctest --test-dir build-dev -j 8 --output-on-failure > "$OUT/ctest.log" 2>&1
CTEST_RC=$?
tail -25 "$OUT/ctest.log"

echo "== JIT timing: first compile and warm disk-cache load of one key"
DITOPS_JIT_VERBOSE=1 build-dev/ditops demo 2>&1 | tee -a "$OUT/summary.txt"
DITOPS_JIT_VERBOSE=1 build-dev/tests/test_jit --gtest_filter='*JitTiming*' 2>&1 | tail -15 | tee -a "$OUT/summary.txt"

echo "== C++ benchmark"
build-dev/ditops bench qknorm_rope --reps 100 --commit "$COMMIT" --json "$OUT/bench_cpp.json" | tee "$OUT/bench_cpp.txt"

echo "== PyTorch: bit-exactness vs eager, graphs, streams, eager and torch.compile beside ditops"
python3 bench/qknorm_rope_torch.py --lib build-dev/libditops.so --commit "$COMMIT" --json "$OUT/torch.json" \
  ${1:+--skip-bench} 2>&1 | tee "$OUT/torch.txt" | grep -v '^MISMATCH' | tail -60
PY_RC=${PIPESTATUS[0]}
grep -c '^MISMATCH' "$OUT/torch.txt" && grep '^MISMATCH' "$OUT/torch.txt" | head -10

echo "== summary: ctest rc=$CTEST_RC python rc=$PY_RC commit=$COMMIT date=$DATE"
