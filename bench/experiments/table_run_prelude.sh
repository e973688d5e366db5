# Sourced by the act tables' device scripts (gelu_table_run.sh, silu_table_run.sh):
#   . bench/experiments/table_run_prelude.sh NAME
# sets T0, OUT (made), W (a scratch folder), COMMIT (.commit's, else git's), a JIT cache of NAME's
# own, and an exit trap that packs W into OUT/NAME.tgz; prints the GPU into W/gpu.txt.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
W=$(mktemp -d)
COMMIT=$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
RUN_NAME=${1:?usage: . bench/experiments/table_run_prelude.sh NAME}
export DITOPS_CACHE_DIR=${DITOPS_CACHE_DIR:-/tmp/ditops-$RUN_NAME-cache} PYTHONUNBUFFERED=1
finish() { tar -C "$W" -czf "$OUT/$RUN_NAME.tgz" . ; echo "== total $(( $(date +%s) - T0 )) s"; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu.txt"
