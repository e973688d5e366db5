#!/usr/bin/env bash
# The model benches of the FP8 and FLUX.2 issues (43, 45) in one device call, inside 10 minutes:
#
#   OUT=DIR bash bench/experiments/models_run.sh [STEP...]
#
# STEP (default: all, in this order; each capped by the time left to MODELS_DEADLINE_S, default 560 s):
#   flux_fp8     FLUX.1 widths, 2 blocks, 4608 tokens: bf16 eager / compile / ditops + graph beside the
#                FP8 variants (plain chain, ditops FP8 eager / + graph / + compile, torchao rowwise +
#                compile), the 28-step quality loop
#   flux2        FLUX.2-dev widths, 2 blocks, 4608 tokens: the six bf16 variants (issue 45)
#   flux_full    FLUX.1 full depth (19 + 38 blocks), 4608 tokens, regional compile: bf16 compile and
#                eager + ditops + graph, the plain FP8 chain and ditops FP8 + graph (H200 at 0c25fcb: 91 s)
#   flux_full_torchao  the same model: ditops FP8 + graph beside torchao rowwise + compile (H200: 230 s;
#                with flux_full's variants in one step it ran past one call's 10 minutes)
#   wan_fp8      Wan 14B widths, 2 blocks, 32760 tokens, FP8 beside bf16 (every variant and the 8-step
#                loop: more than 107 s on the H200 at 0c25fcb, which ran out in torchao + compile)
#   qwen_fp8     Qwen-Image, 2 blocks, 4608 tokens, FP8 beside bf16
#   flux2_fp8    FLUX.2-dev widths, 2 blocks, FP8 beside bf16 (eager, compile, the plain chain, ditops
#                FP8 eager / + graph / + compile), the 8-step quality loop (at 2670cc6 on the H100: 57 s)
#   flux2_fp8_torchao  the same model: ditops FP8 + graph beside torchao rowwise + compile and the plain
#                chain (at 39d1a9a on a fresh H100: 250 s; with flux2_fp8's variants in one step it ran
#                past 385 s, inside torchao's compile)
#   flux, wan    issue 44's 2-block benches at the bench's shapes (4608 tokens; Wan at 14B widths), the
#                six bf16 variants (at e59a09c on the H100: 70 and 45 s)
#   qwen, ltx2, hunyuan  the other models' 2-block benches at the bench's shapes (issue 44)
#   wan32k       Wan 14B widths, 2 blocks, 32760 tokens, bf16 only: eager, compile, eager + ditops + graph
#   wan_full     Wan 14B widths at full depth (40 blocks), 4608 tokens, regional compile, bf16 only
# Uses build-dev (scripts/device_run.sh's build) when it has the Python module, else builds the module
# without AOT kernels in build-py. Wheels: .whl/ (tvm_ffi, diffusers) and .whl-extra/ (torchao).
# MODELS_ARGS (optional): more bench arguments, appended to every step's command (the last --variants
# given wins: e.g. MODELS_ARGS="--variants eager,compile,fp8chain,fp8+graph,torchao+compile").
# Writes to OUT: summary.txt, models.json (every step's records), models_logs.tar.gz (each step's output).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEADLINE=$(( T0 + ${MODELS_DEADLINE_S:-560} ))
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1 DITOPS_CACHE_DIR=${DITOPS_CACHE_DIR:-/tmp/ditops-device-cache}
COMMIT=$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export DITOPS_COMMIT=$COMMIT  # the records name the tree measured (the device copy's git history is not it)
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
finish() {
  python3 - "$OUT/models.json" "$LOGS"/*.json <<'PY'
import json, os, sys
records = []
for path in sys.argv[2:]:
    if os.path.exists(path):
        data = json.load(open(path))
        records += data if isinstance(data, list) else [data]
json.dump(records, open(sys.argv[1], "w"), indent=1)
PY
  tar -C "$LOGS" -czf "$OUT/models_logs.tar.gz" .
  say "== total $(( $(date +%s) - T0 )) s"
}
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
say "commit $COMMIT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
ls .whl-extra/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site-extra .whl-extra/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-extra
if ls build-dev/python/ditops/*.so > /dev/null 2>&1; then
  BUILD=build-dev
else
  BUILD=build-py
  { cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_AOT=OFF -DDITOPS_BUILD_TESTS=OFF \
      -DDITOPS_BUILD_BENCH=OFF -DDITOPS_BUILD_PYTHON=AUTO -DPython3_EXECUTABLE="$(command -v python3)" &&
    cmake --build build-py -j 16; } > "$LOGS/build.log" 2>&1 || { say "BUILD FAILED"; tail -30 "$LOGS/build.log"; exit 1; }
fi
export PYTHONPATH=$BUILD/python:$PYTHONPATH
say "== python module from $BUILD at $(( $(date +%s) - T0 )) s"

B="python3 -m ditops.diffusers.bench --iters 20 --warmup 3"
declare -A CMD=(
  [flux_fp8]="$B --model flux --blocks 2 --tokens 4608 --fp8 --loop-steps 28"
  [flux2]="$B --model flux2 --blocks 2 --tokens 4608"
  [flux_full]="$B --model flux --full-depth --tokens 4608 --fp8 --compile-scope regional --iters 10 --profile-iters 1 --loop-steps 0 --variants compile,eager+ditops+graph,fp8chain,fp8+graph"
  [flux_full_torchao]="$B --model flux --full-depth --tokens 4608 --fp8 --compile-scope regional --iters 10 --profile-iters 1 --loop-steps 0 --variants fp8+graph,torchao+compile"
  [wan_fp8]="$B --model wan --blocks 2 --tokens 32760 --fp8 --loop-steps 8 --iters 10"
  [qwen_fp8]="$B --model qwen --blocks 2 --tokens 4608 --fp8 --loop-steps 28"
  [flux2_fp8]="$B --model flux2 --blocks 2 --tokens 4608 --fp8 --loop-steps 8 --variants eager,compile,fp8chain,fp8,fp8+graph,fp8+compile"
  [flux2_fp8_torchao]="$B --model flux2 --blocks 2 --tokens 4608 --fp8 --loop-steps 0 --variants fp8chain,fp8+graph,torchao+compile"
  [flux]="$B --model flux --blocks 2"
  [wan]="$B --model wan --blocks 2"
  [qwen]="$B --model qwen --blocks 2"
  [ltx2]="$B --model ltx2 --blocks 2"
  [hunyuan]="$B --model hunyuan --blocks 2"
  [wan32k]="$B --model wan --blocks 2 --tokens 32760 --iters 10 --variants eager,compile,eager+ditops+graph"
  [wan_full]="$B --model wan --full-depth --iters 5 --profile-iters 1 --variants eager,compile,eager+ditops+graph"
)
STEPS=${*:-flux_fp8 flux2 flux_full wan_fp8 qwen_fp8 flux2_fp8 flux2_fp8_torchao}
for step in $STEPS; do
  left=$(( DEADLINE - $(date +%s) ))
  [ $left -ge 45 ] || { say "$step: not started ($left s left)"; continue; }
  s0=$(date +%s)
  timeout -k 10 $left ${CMD[$step]} ${MODELS_ARGS:-} --json "$LOGS/$step.json" > "$LOGS/$step.txt" 2>&1
  rc=$?
  say "== $step rc=$rc in $(( $(date +%s) - s0 )) s$( [ $rc = 124 ] && echo ' (timed out)')"
  grep -E "ms per forward|x (eager|compile)|torch.equal|equal|cosine|psnr|peak|Error|error" "$LOGS/$step.txt" | tail -40 | tee -a "$OUT/summary.txt"
done
