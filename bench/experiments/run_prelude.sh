# The prelude of the one-call device scripts that pack their work folder (gelu_table_run.sh):
# `RUN_NAME=name; source bench/experiments/run_prelude.sh` sets T0, OUT (made),
# W (a scratch folder), COMMIT (.commit, else git's), the JIT cache and unbuffered Python, el (seconds
# since T0), and on exit packs W into OUT/$RUN_NAME.tgz with the total time.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
W=$(mktemp -d)
COMMIT=$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export DITOPS_CACHE_DIR=${DITOPS_CACHE_DIR:-/tmp/ditops-$RUN_NAME-cache} PYTHONUNBUFFERED=1
el() { echo $(( $(date +%s) - T0 )); }
finish() { tar -C "$W" -czf "$OUT/$RUN_NAME.tgz" . ; echo "== total $(el) s"; }
trap finish EXIT
# build_gt TARGET...: the GPU's name into W/gpu.txt, then the library and the named test binaries (no
# AOT kernels, no Python module, no benchmarks) in build-gt/; a failed build ends the script.
build_gt() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu.txt"
  { cmake -S . -B build-gt -G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_AOT=OFF -DDITOPS_BUILD_PYTHON=OFF \
      -DDITOPS_BUILD_BENCH=OFF && cmake --build build-gt -j 16 --target ditops "$@"; } \
    > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; exit 1; }
  echo "== built at $(el) s"
}
