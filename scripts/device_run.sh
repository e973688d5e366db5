#!/usr/bin/env bash
# Everything a GPU machine checks and measures, in one command:
#
#   scripts/device_run.sh [OUT_DIR]        (default OUT_DIR: ./device-out)
#
# builds (Release, prebuilt AOT kernels on, the Python package where tvm_ffi imports; build-dev/),
# runs every ctest test (CPU and GPU tests, and `pytest tests/python` as the python_pytest test:
# torch.library, torch.compile, CUDA graphs, streams), checks every op bit for bit against eager
# PyTorch (torch.equal, bench/<op>_torch.py), runs the benchmarks (`ditops bench <op>` for every
# op, and bench/<op>_torch.py: ditops beside eager PyTorch and torch.compile, three timing
# methods), and writes to OUT_DIR:
#   summary.txt build.log ctest.log pytest.xml      the build, the device, the test results
#   bench_cpp.txt bench_cpp_<op>.json               `ditops bench <op>` tables and records
#   torch.txt torch_<op>.json torch_<op>_checks.json  bench/<op>_torch.py output, records, torch.equal results
#   py_overhead.json                                host cost per call of the Python layer
#   records/<op>.json                               all records of this run in the record format
#                                                   (bench/results/README.md; bench/records.py)
#   (verify: torch/verify_<op>[_checks].json, bench_cpp.json, torch.json; the summary per op at the
#   end of summary.txt: python3 bench/summary.py OUT_DIR prints it again)
# and prints a table of the rotated-graph timings at the end. Needs CUDA, cmake, ninja, PyTorch
# with Triton, pytest and the tvm_ffi wheel (installed from .whl/ when present: docs/python.md).
# To keep the records: python3 bench/records.py convert --out bench/results/<device> OUT_DIR/records/*.json
#
# Modes for parts of it (OUT_DIR from $OUT there, default ./device-out), each inside the device
# tool's 10-minute limit:
#   scripts/device_run.sh verify   build; every test but the CPU-only ones CI runs on every change
#                                        (cross-arch NVRTC compiles, docs status, pip install, fuzz
#                                        replay, the cpu_only Python modules), pytest over pytest-xdist
#                                        workers where installed, beside the bit-exactness checks of every op
#                                        against the PyTorch eager chain; then, alone on the GPU, the
#                                        C++ benchmarks of every op (read-roof fraction for GEMMs)
#                                        and the host overhead; ends with bench/summary.py's table
#                                        per op (tests, torch.equal, fastest us and roof fraction).
#                                        ctest -j (cores - pytest workers) beside the workers
#                                        (VERIFY_CTEST_JOBS, VERIFY_PYTEST_WORKERS; the CPU figures
#                                        that decide the split end the tests' part of summary.txt),
#                                        each torch process on VERIFY_TORCH_THREADS (default 1) CPU threads.
#                                        Target: 6 minutes with the build on an H200
#                                        (docs/tuning/device_verify.md has the runs); it ends
#                                        by VERIFY_DEADLINE_S (default 540 s) with the summary of
#                                        what ran, naming what it left out
#   scripts/device_run.sh bench [OP...]  PyTorch eager and torch.compile beside ditops, same
#                                        run (all four ops by default; split them over two calls
#                                        to stay inside the limit)
#   scripts/device_run.sh ops OP...    for the named ops: their tests (ctest names containing the op's
#                                        CamelCase name, and the driver's cases), `ditops bench OP`,
#                                        and bench/OP_torch.py (torch.equal checks, then eager,
#                                        torch.compile and a device copy beside ditops)
#   scripts/device_run.sh sanitize [REGEX]  compute-sanitizer memcheck and racecheck over the GPU
#                                        tests of every op (scripts/sanitize.py): at most one job
#                                        per core, longest first, ending inside 8 minutes with the
#                                        build with a verdict per job; REGEX: a gtest filter instead;
#                                        OUT_DIR/sanitizer.tar.gz (logs), sanitizer_verdicts.json
#   scripts/device_run.sh gpu [REGEX]  the GPU tests matching REGEX and the host-overhead
#                                        figures (C++ facade, Python, torch.ops)
#   scripts/device_run.sh ab DIR... [OPS]  A/B timing of kernel versions in one session (first,
#                                        with AB_TESTS=REGEX, this tree's GPU tests matching it and,
#                                        with AB_VERIFY=1, its torch.equal checks of OPS): each
#                                        DIR/kernels (e.g. `git archive BASE kernels` unpacked
#                                        into .base/NAME, carried) built as build-ab-N beside this
#                                        tree's build-dev ("B"), then each op's bench run for every
#                                        version in turn, twice, without its checks
#                                        (DITOPS_BENCH_CASES / DITOPS_BENCH_IMPLS select cases and
#                                        implementations: bench/torch_bench_common.py);
#                                        AB_FULL=1: each DIR is a whole tree (e.g. `git archive`
#                                        of an earlier commit), for host-code changes; AB_CPP=1:
#                                        time with each tree's `ditops bench OP` instead
set -uo pipefail
SCRIPT_START=$(date +%s)
case "${1:-}" in
  verify|bench|gpu|ab|ops|sanitize) PHASE=$1; shift ;;
  *) PHASE=all; [ $# -gt 0 ] && OUT=$1 && shift ;;
esac
AB_DIRS=()
if [ "$PHASE" = ab ]; then
  while [ $# -gt 0 ] && [ -d "$1/kernels" ]; do AB_DIRS+=("$(cd "$1" && pwd)"); shift; done
  [ ${#AB_DIRS[@]} -gt 0 ] || { echo "ab needs DIR... with DIR/kernels"; exit 2; }
fi
# Every op with a PyTorch benchmark (bench/<op>_torch.py), unless named.
OPS=${*:-$(ls bench/*_torch.py | sed 's#^bench/##; s#_torch\.py$##' | tr '\n' ' ')}
OUT=${OUT:-$(pwd)/device-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
COMMIT=$(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)  # .commit: written by the caller
DATE=$(date -u +%Y-%m-%d)
export DITOPS_CACHE_DIR=${DITOPS_CACHE_DIR:-/tmp/ditops-device-cache}
export PYTHONUNBUFFERED=1
TMP=$(mktemp -d)
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
LIB=build-dev/libditops.so
merge_json() {  # merge_json OUT.json IN1.json IN2.json ...: concatenated record lists
  python3 - "$@" <<'PY'
import json, os, sys
records = []
for path in sys.argv[2:]:
    if os.path.exists(path):
        records += json.load(open(path))
json.dump(records, open(sys.argv[1], "w"), indent=1)
print(f"{len(records)} records -> {sys.argv[1]}")
PY
}

echo "== build ($PHASE, commit $COMMIT)"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; echo "commit $COMMIT date $DATE phase $PHASE"; } | tee -a "$OUT/summary.txt"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_PYTHON=AUTO -DPython3_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
grep -E "ditops: Python" "$OUT/build.log"
# The bench phase needs only the library (its scripts load it through the C ABI) and the CLI.
TARGETS=""
[ "$PHASE" = bench ] && TARGETS="--target ditops ditops_cli ${BENCH_EXTRA_TARGETS:-}"
[ "$PHASE" = ab ] && [ -z "${AB_TESTS:-}" ] && TARGETS="--target ditops"
AB_PIDS=()
for i in "${!AB_DIRS[@]}"; do  # tree i: this one with DIR i's kernels, the library only (its JIT path)
  tree=/tmp/ab-tree-$i
  rm -rf $tree && mkdir -p $tree
  tar --exclude='./build*' --exclude=./.git --exclude=./.deps --exclude=./.whl --exclude=./.base -cf - . | tar -C $tree -xf -
  if [ "${AB_FULL:-0}" = 1 ]; then  # the whole tree of DIR (host code changed, not only kernels)
    rm -rf $tree && mkdir -p $tree && (cd "${AB_DIRS[$i]}" && tar --exclude='./build*' -cf - .) | tar -C $tree -xf -
  else
    rm -rf $tree/kernels && cp -r "${AB_DIRS[$i]}/kernels" $tree/kernels
  fi
  ( cmake -S $tree -B build-ab-$i -G Ninja -DCMAKE_BUILD_TYPE=Release -DDITOPS_BUILD_PYTHON=OFF -DDITOPS_BUILD_TESTS=OFF \
      -DDITOPS_BUILD_AOT=OFF > "$OUT/build_ab$i.log" 2>&1 && cmake --build build-ab-$i -j 6 --target ditops $( [ "${AB_CPP:-0}" = 1 ] && echo ditops_cli ) >> "$OUT/build_ab$i.log" 2>&1 ) &
  AB_PIDS+=($!)
done
cmake --build build-dev -j 16 $TARGETS >> "$OUT/build.log" 2>&1 || { grep -E -A5 'error' "$OUT/build.log" | head -80; exit 1; }
for i in "${!AB_PIDS[@]}"; do
  wait "${AB_PIDS[$i]}" || { grep -E -A5 'error' "$OUT/build_ab$i.log" | head -40; exit 1; }
done
echo "build done at $(( $(date +%s) - SCRIPT_START )) s" | tee -a "$OUT/summary.txt"
build-dev/ditops info | tee -a "$OUT/summary.txt"
# The SM clock, power and temperature once a second while the tests and benchmarks run, summarized
# in summary.txt at the end: an issue-bound kernel (the NVFP4 rows) would follow the SM clock where a
# copy does not, so a difference between runs can be checked against it (runs 70-72: 1980 MHz in
# every busy sample in the H200 runs).
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 1000 > "$TMP/clocks.csv" 2>/dev/null &
CLOCKS_PID=$!
clock_summary() {
  kill $CLOCKS_PID ${CPU_PID:-} 2>/dev/null
  python3 - "$TMP/clocks.csv" <<'PY' | tee -a "$OUT/summary.txt"
import sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append([float(v) for v in line.split(",")])
    except ValueError:
        pass
busy = sorted(r for r in rows if r[1] > 150.0)  # above 150 W: a kernel running
if busy:
    sm = sorted(r[0] for r in busy)
    print(f"gpu while busy ({len(busy)} of {len(rows)} samples, 1 s apart): SM clock min {sm[0]:.0f} "
          f"median {sm[len(sm) // 2]:.0f} max {sm[-1]:.0f} MHz, power max {max(r[1] for r in busy):.0f} W, "
          f"temperature max {max(r[2] for r in busy):.0f} C")
PY
}
trap clock_summary EXIT

# pytest (ctest's python_pytest) over 8 workers where pytest-xdist is installed; JUnit XML for
# bench/summary.py. --dist worksteal (xdist >= 3.2): with the default "load" two workers kept the
# slow diffusers modules queued while six sat idle for the last 220 s (docs/tuning/device_verify.md).
PYTEST_OPTS="--junitxml=$OUT/pytest.xml"
PYTEST_WORKERS=1
if python3 -c "import xdist, sys; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" 2>/dev/null; then
  PYTEST_WORKERS=${VERIFY_PYTEST_WORKERS:-8}
  PYTEST_OPTS="-n $PYTEST_WORKERS --dist worksteal $PYTEST_OPTS"
elif python3 -c "import xdist" 2>/dev/null; then
  PYTEST_WORKERS=${VERIFY_PYTEST_WORKERS:-8}
  PYTEST_OPTS="-n $PYTEST_WORKERS $PYTEST_OPTS"
fi
if [ "$PHASE" = all ]; then
  echo "== tests (CPU + GPU + pytest tests/python)"
  PYTEST_ADDOPTS="$PYTEST_OPTS" ctest --test-dir build-dev -j 6 --output-on-failure --timeout 900 > "$OUT/ctest.log" 2>&1
  CTEST_RC=$?
  grep -E "tests passed|Failed|\*\*\*Exception|Timeout" "$OUT/ctest.log" | tail -25
  grep -q python_pytest "$OUT/ctest.log" || echo "notice: python_pytest did not run (tvm_ffi or PyTorch missing)" | tee -a "$OUT/summary.txt"

  echo "== C++ benchmarks (cold L2 and rotated graphs, median, copy fraction)"
  : > "$OUT/bench_cpp.txt"
  for op in $OPS; do
    build-dev/ditops bench $op --reps 100 --commit "$COMMIT" --json "$OUT/bench_cpp_$op.json" 2>&1 | tee -a "$OUT/bench_cpp.txt"
  done

  echo "== bit-exactness against eager PyTorch (torch.equal) and the benchmarks beside eager and torch.compile"
  : > "$OUT/torch.txt"
  PY_RC=0
  for op in $OPS; do
    echo "---- $op" | tee -a "$OUT/torch.txt"
    python3 bench/${op}_torch.py --lib $LIB --commit "$COMMIT" --json "$OUT/torch_$op.json" >> "$OUT/torch.txt" 2>&1 || PY_RC=1
    grep -v '^MISMATCH' "$OUT/torch.txt" | sed -n "/^---- $op/,\$p" | grep -E "PASS|FAIL|Error|error|Traceback" | tail -5
    echo "mismatch lines: $(sed -n "/^---- $op/,\$p" "$OUT/torch.txt" | grep -c '^MISMATCH')"
  done
  echo "== Python package: host overhead of a torch call"
  DITOPS_COMMIT=$COMMIT DITOPS_BENCH_JSON=$OUT/py_overhead.json PYTHONPATH=build-dev/python:${PYTHONPATH:-} \
    python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_torch_gpu.py -k overhead 2>&1 | tee -a "$OUT/torch.txt" | tail -4

  echo "== records (bench/results/README.md) -> $OUT/records"
  python3 bench/records.py convert --replace --out "$OUT/records" "$OUT"/bench_cpp_*.json "$OUT"/torch_*.json "$OUT/py_overhead.json"
  python3 bench/records.py table "$OUT/records" --method rotated_graph | tee "$OUT/table.md"
  echo "== summary: ctest rc=$CTEST_RC python rc=$PY_RC commit=$COMMIT date=$DATE out=$OUT" | tee -a "$OUT/summary.txt"
  [ $CTEST_RC = 0 ] && [ $PY_RC = 0 ]
  exit $?
elif [ "$PHASE" = verify ]; then
  # Meant to end inside 6 minutes with the build: the tests and the torch.equal checks (correctness only) share
  # the GPU; the benchmarks and the host-overhead figure run after them, alone.
  ALL_OPS=$(build-dev/ditops ops | sed -nE 's/^([a-z0-9_]+): .*/\1/p' | tr '\n' ' ')
  # Each implementation's contract, so the summary counts every check with its own oracle.
  PYTHONPATH=build-dev/python:${PYTHONPATH:-} python3 -c "import ditops, json, sys; json.dump(ditops.list_kernels(), open(sys.argv[1], 'w'))" \
    "$OUT/kernels.json" || echo "notice: kernels.json not written: the summary cannot tell close checks by contract"
  echo "== tests (CPU + GPU + pytest) beside the bit-exactness checks against the PyTorch eager chain"
  # pytest_progress.log: each Python test as it starts and ends (a cut run shows what was running).
  # The CPU-only tests CI runs on every change are left to it (the cross-arch NVRTC compiles, the
  # docs status, pip install, the fuzz replay, the cpu_only Python modules): 480 of 4100
  # test-seconds on 16 cores busy with the GPU jobs (docs/tuning/device_verify.md).
  CPU_ONLY="Compiles?ForEveryTargetArch|CompilesWithNvrtcForTheTargetArchs|^docs_status\$|^python_pip_install\$|^python_pytest_without_torch\$|^fuzz_replay\$"
  # The tests and checks end 90 s before VERIFY_DEADLINE_S (default 540 s after the start, inside
  # the device tool's 10 minutes), so the summary of what ran always comes back: a cut ctest
  # reports "timed out" (rc 124), a check not started is named.
  TESTS_END=$((SCRIPT_START + ${VERIFY_DEADLINE_S:-540} - 90))
  # One busy process per core: ctest's jobs (python_pytest's slot stands for the torch.equal checks
  # beside it; its xdist workers are not counted by ctest) and the pytest workers. At 19999c5 ctest
  # -j 12 beside 8 workers and the checks made about 20 on 16 cores; which share each side needs is
  # decided by the CPU figures the summary prints (docs/tuning/device_verify.md).
  CTEST_JOBS=${VERIFY_CTEST_JOBS:-$(( $(nproc) - PYTEST_WORKERS > 2 ? $(nproc) - PYTEST_WORKERS : 2 ))}
  echo "ctest -j $CTEST_JOBS beside $PYTEST_WORKERS pytest worker(s) on $(nproc) cores" | tee -a "$OUT/summary.txt"
  # The machine's CPU once a second while the tests run (/proc/stat: busy and idle jiffies, runnable threads).
  ( for ((i = 0; i < 900; i++)); do
      echo "$(awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6} /^procs_running/ {print $2}' /proc/stat | tr '\n' ' ')"
      sleep 1
    done > "$TMP/cpu.txt" ) &
  CPU_PID=$!
  # One CPU thread per torch process while the tests run (pytest's workers, the checks; the C++
  # references use std::thread, not OpenMP): at 2670cc6 the CPU tests of the diffusers modules took
  # 35-52 s (95-146 CPU-s) each there against 0.3-0.4 s on a 2-core machine, a torch process per
  # worker spinning 16 OpenMP threads on 16 busy cores (docs/tuning/device_verify.md).
  export OMP_NUM_THREADS=${VERIFY_TORCH_THREADS:-1} OPENBLAS_NUM_THREADS=${VERIFY_TORCH_THREADS:-1} MKL_NUM_THREADS=${VERIFY_TORCH_THREADS:-1}
  DITOPS_PYTEST_PROGRESS=$OUT/pytest_progress.log PYTEST_ADDOPTS="$PYTEST_OPTS -m 'not cpu_only'" \
    timeout -k 10 $(( TESTS_END - $(date +%s) > 30 ? TESTS_END - $(date +%s) : 30 )) \
    ctest --test-dir build-dev -j $CTEST_JOBS -E "$CPU_ONLY" --output-on-failure --timeout 900 > "$OUT/ctest.log" 2>&1 &
  CTEST_PID=$!
  mkdir -p "$OUT/torch"
  : > "$OUT/torch.txt"
  (
    rc=0
    for op in $OPS; do
      echo "---- $op" >> "$OUT/torch.txt"
      left=$(( TESTS_END - $(date +%s) ))
      if [ $left -lt 20 ]; then
        echo "notice: no time left for the torch.equal checks of $op (VERIFY_DEADLINE_S)" | tee -a "$OUT/summary.txt"
        rc=1
        continue
      fi
      timeout -k 5 $(( left < 300 ? left : 300 )) python3 bench/${op}_torch.py --lib $LIB --commit "$COMMIT" --json "$OUT/torch/verify_$op.json" --skip-bench \
        >> "$OUT/torch.txt" 2>&1 || rc=1
    done
    exit $rc
  ) &
  TORCH_PID=$!
  wait $CTEST_PID
  CTEST_RC=$?
  kill $CPU_PID 2>/dev/null
  echo "tests done at $(( $(date +%s) - SCRIPT_START )) s$( [ $CTEST_RC = 124 ] && echo ' (cut by VERIFY_DEADLINE_S: not every test ran)')" \
    | tee -a "$OUT/summary.txt"
  # What decides the split of the cores: how busy they were, and the CPU seconds on each side.
  python3 - "$TMP/cpu.txt" "$OUT/pytest_progress.log" "$(nproc)" <<'PY' | tee -a "$OUT/summary.txt"
import os, re, sys
rows = [list(map(int, line.split())) for line in open(sys.argv[1]) if len(line.split()) == 3]
busy, runnable = [], []
for (b0, i0, _), (b1, i1, r1) in zip(rows, rows[1:]):
    if b1 + i1 > b0 + i0:
        busy.append(100.0 * (b1 - b0) / (b1 + i1 - b0 - i0))
        runnable.append(r1)
if busy:
    cpu_s = (rows[-1][0] - rows[0][0]) / os.sysconf("SC_CLK_TCK")
    print(f"cpu while the tests ran ({len(busy)} samples, 1 s apart, {sys.argv[3]} cores): busy median "
          f"{sorted(busy)[len(busy) // 2]:.0f} %, at least 95 % in {sum(b >= 95 for b in busy)}; runnable threads median "
          f"{sorted(runnable)[len(runnable) // 2]}; {cpu_s:.0f} CPU-seconds in all")
    if os.path.exists(sys.argv[2]):
        wall = cpu = 0.0
        for line in open(sys.argv[2]):
            m = re.search(r" end ([0-9.]+)s cpu ([0-9.]+)s ", line)
            if m:
                wall, cpu = wall + float(m.group(1)), cpu + float(m.group(2))
        print(f"pytest: {wall:.0f} test-seconds, {cpu:.0f} CPU-seconds of its workers ({100 * cpu / max(cpu_s, 1):.0f} % of the machine's)")
if os.path.exists(sys.argv[2]):  # the outcomes, also where a cut run wrote no pytest.xml
    ended, failed, started = {}, [], set()
    for line in open(sys.argv[2]):
        m = re.search(r" end [0-9.]+s cpu [0-9.]+s (passed|failed|skipped|unknown) (\S+)", line)
        if m:
            ended[m.group(1)] = ended.get(m.group(1), 0) + 1
            failed += [m.group(2)] if m.group(1) == "failed" else []
        elif " start " in line:
            started.add(line.split(" start ", 1)[1].strip())
    print("pytest tests ended: " + (", ".join(f"{n} {k}" for k, n in sorted(ended.items())) or "none") +
          f" of {len(started)} started" + "".join(f"\npytest FAILED {t}" for t in failed[:20]))
PY
  grep -E "tests passed|Failed|\*\*\*Exception|Timeout" "$OUT/ctest.log" | tail -25
  grep -E "^[0-9]+: .*(differ|ulp|max)" "$OUT/ctest.log" | head -20
  wait $TORCH_PID
  PY_RC=$?
  unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS
  for op in $OPS; do
    echo "---- $op: $(sed -n "/^---- $op\$/,/^---- /p" "$OUT/torch.txt" | grep -v '^MISMATCH' | grep -E 'PASS|FAIL|Traceback|rror' | tail -3 | tr '\n' ' ')"
    echo "mismatch lines: $(sed -n "/^---- $op\$/,/^---- /p" "$OUT/torch.txt" | grep -c '^MISMATCH')"
  done

  echo "== JIT timing: first compile and warm disk-cache load of one key"
  DITOPS_JIT_VERBOSE=1 build-dev/tests/test_jit --gtest_filter='*JitTiming*' 2>&1 | grep -E "JIT first|jit " | tee -a "$OUT/summary.txt"

  echo "== C++ benchmarks of every op (cold L2, rotated graphs; copy or read-roof fraction)"
  : > "$OUT/bench_cpp.txt"
  # VERIFY_DEADLINE_S (default 540: inside the device tool's 10 minutes): an op's benchmark starts
  # only with 60 s left before it, so the run ends with its summary; the ones left out are named.
  BENCH_END=$((SCRIPT_START + ${VERIFY_DEADLINE_S:-540} - 60))
  for op in $ALL_OPS; do
    if [ "$(date +%s)" -ge "$BENCH_END" ]; then
      echo "notice: no time left for the benchmark of $op (VERIFY_DEADLINE_S)" | tee -a "$OUT/summary.txt"
      continue
    fi
    timeout 120 build-dev/ditops bench $op --reps 100 --commit "$COMMIT" --json "$TMP/cpp_$op.json" >> "$OUT/bench_cpp.txt" 2>&1
  done
  echo "benchmarks done at $(( $(date +%s) - SCRIPT_START )) s" | tee -a "$OUT/summary.txt"
  merge_json "$OUT/bench_cpp.json" "$TMP"/cpp_*.json
  echo "== Python package: host overhead of a torch call"
  DITOPS_COMMIT=$COMMIT DITOPS_BENCH_JSON=$TMP/py_overhead.json PYTHONPATH=build-dev/python:${PYTHONPATH:-} \
    timeout 300 python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_torch_gpu.py -k overhead 2>&1 | tee -a "$OUT/torch.txt" | tail -8
  TIMINGS=()
  for f in "$OUT"/torch/verify_*.json; do [[ $f == *_checks.json ]] || TIMINGS+=("$f"); done
  merge_json "$OUT/torch.json" "${TIMINGS[@]}" "$TMP/py_overhead.json"
  echo "== summary: ctest rc=$CTEST_RC python rc=$PY_RC commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
  python3 bench/summary.py "$OUT" --ops "$(echo $ALL_OPS | tr ' ' ',')" | tee -a "$OUT/summary.txt"
  [ $CTEST_RC = 0 ] && [ $PY_RC = 0 ]
  exit $?
elif [ "$PHASE" = sanitize ]; then
  # compute-sanitizer memcheck and racecheck over the GPU tests of every op, ending by the deadline
  # (SANITIZE_BUDGET_S after this script started, default 470 s: inside 8 minutes with the build)
  # with a verdict per job: scripts/sanitize.py runs the jobs (the test_*_gpu binaries, the *Gpu*
  # suites of the others, the op test driver's parts with their large cases skipped) at most one per
  # core at once, longest first, each capped by the time left and killed (SIGTERM, then SIGKILL) at
  # its cap; a job cut or never started says so and is not clean. REGEX: one gtest filter instead.
  LEFT=$((SCRIPT_START + ${SANITIZE_BUDGET_S:-470} - $(date +%s) - 15))
  [ $LEFT -ge 60 ] || LEFT=60
  python3 scripts/sanitize.py --build build-dev --out "$TMP/sanitizer" --budget-s $LEFT ${1:+--filter "$1"} \
    | tee -a "$OUT/summary.txt"
  SAN_RC=${PIPESTATUS[0]}
  # One file back (the device tool returns at most 8): every log, the verdicts and the table.
  tar -C "$TMP" -czf "$OUT/sanitizer.tar.gz" sanitizer
  cp "$TMP/sanitizer/verdicts.json" "$OUT/sanitizer_verdicts.json"
  echo "== summary: sanitize rc=$SAN_RC commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
  exit $SAN_RC
elif [ "$PHASE" = gpu ]; then
  REGEX=${1:-Gpu}
  echo "== GPU tests matching $REGEX"
  ctest --test-dir build-dev -j 4 -R "$REGEX" --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1
  CTEST_RC=$?
  grep -E "tests passed|Failed|\*\*\*Exception|Timeout" "$OUT/ctest.log" | tail -25
  echo "== host overhead per call"
  build-dev/ditops bench qknorm_rope --host-only --commit "$COMMIT" --json "$TMP/cpp_host.json" | tee "$OUT/bench_cpp.txt"
  DITOPS_COMMIT=$COMMIT DITOPS_BENCH_JSON=$TMP/py_overhead.json PYTHONPATH=build-dev/python:${PYTHONPATH:-} \
    timeout 300 python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_torch_gpu.py -k overhead 2>&1 | tee "$OUT/torch.txt" | grep -E "overhead|passed|failed"
  merge_json "$OUT/bench_cpp.json" "$TMP/cpp_host.json"
  merge_json "$OUT/torch.json" "$TMP/py_overhead.json"
  echo "== summary: ctest rc=$CTEST_RC commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
elif [ "$PHASE" = ops ]; then
  REGEX=""
  for op in $OPS; do
    camel=$(echo "$op" | sed -E 's/(^|_)([a-z0-9])/\U\2/g')
    REGEX="$REGEX${REGEX:+|}$camel|ops\.[a-z_]*/${op}_part"  # the driver's tests of the op, both kinds
  done
  echo "== tests matching $REGEX"
  ctest --test-dir build-dev -j 6 -R "$REGEX" --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1
  CTEST_RC=$?
  grep -E "tests passed|Failed|\*\*\*Exception|Timeout" "$OUT/ctest.log" | tail -25
  : > "$OUT/bench_cpp.txt"
  : > "$OUT/torch.txt"
  PY_RC=0
  for op in $OPS; do
    build-dev/ditops bench $op --reps 100 --commit "$COMMIT" --json "$TMP/cpp_$op.json" 2>&1 | tee -a "$OUT/bench_cpp.txt"
    echo "---- $op" | tee -a "$OUT/torch.txt"
    timeout 300 python3 bench/${op}_torch.py --lib $LIB --commit "$COMMIT" --json "$TMP/torch_$op.json" \
      >> "$OUT/torch.txt" 2>&1 || PY_RC=1
    grep -v '^MISMATCH' "$OUT/torch.txt" | sed -n "/^---- $op/,\$p" | tail -40
    merge_json "$OUT/bench_cpp.json" "$TMP"/cpp_*.json
    merge_json "$OUT/torch.json" "$TMP"/torch_*.json
    cp "$TMP/torch_${op}_checks.json" "$OUT/" 2>/dev/null  # the torch.equal records, for bench/results/<device>/checks/
  done
  echo "== summary: ops ctest rc=$CTEST_RC python rc=$PY_RC commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
elif [ "$PHASE" = ab ]; then
  if [ -n "${AB_TESTS:-}" ]; then  # this tree's kernels checked first: the GPU tests matching AB_TESTS
    echo "== B: tests matching $AB_TESTS"
    ctest --test-dir build-dev -j 4 -R "$AB_TESTS" --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1
    echo "ctest rc=$?" | tee -a "$OUT/summary.txt"
    grep -E "tests passed|Failed|\*\*\*Exception|Timeout" "$OUT/ctest.log" | tail -25
  fi
  if [ "${AB_VERIFY:-0}" = 1 ]; then  # and torch.equal against the eager chain
    for op in $OPS; do
      timeout 300 python3 bench/${op}_torch.py --lib build-dev/libditops.so --commit B --json "$TMP/verify_$op.json" \
        --skip-bench 2>&1 | grep -vE "^MISMATCH" | grep -E "verification|PASS|FAIL|rror" | tail -5 | tee -a "$OUT/summary.txt"
    done
  fi
  if [ "${AB_CPP:-0}" = 1 ]; then  # each tree's own `ditops bench`, alternating, twice
    : > "$OUT/bench_cpp.txt"
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for side in "${!AB_DIRS[@]}" B; do
        cli=build-dev/ditops
        [ $side = B ] || { cli=build-ab-$side/ditops; side=A$side; }
        for op in $OPS; do
          echo "---- $side round $round $op" | tee -a "$OUT/bench_cpp.txt"
          DITOPS_CACHE_DIR=/tmp/ditops-cache-$side timeout 200 $cli bench $op --reps ${AB_REPS:-50} --commit "$side" \
            --json "$TMP/abcpp_${side}_${round}_$op.json" >> "$OUT/bench_cpp.txt" 2>&1
        done
      done
    done
    merge_json "$OUT/bench_cpp.json" "$TMP"/abcpp_*.json
    echo "== summary: ab (C++ benches) commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
    exit 0
  fi
  for i in "${!AB_DIRS[@]}"; do echo "== A$i = ${AB_DIRS[$i]}/kernels (build-ab-$i)"; done
  echo "== B = this tree (build-dev); cases /${DITOPS_BENCH_CASES:-all}/ impls /${DITOPS_BENCH_IMPLS:-all}/"
  : > "$OUT/torch.txt"
  for round in 1 2; do
    for side in "${!AB_DIRS[@]}" B; do
      lib=build-dev/libditops.so
      [ $side = B ] || { lib=build-ab-$side/libditops.so; side=A$side; }
      for op in $OPS; do
        echo "---- $side round $round $op" | tee -a "$OUT/torch.txt"
        DITOPS_CACHE_DIR=/tmp/ditops-cache-$side DITOPS_BENCH_SKIP_CHECKS=1 timeout 300 python3 bench/${op}_torch.py \
          --lib $lib --commit "$side" --json "$TMP/ab_${side}_${round}_$op.json" 2>&1 | tee -a "$OUT/torch.txt" | grep -E "^[0-9A-Za-z].*(ditops|copy)" 
      done
    done
  done
  merge_json "$OUT/torch.json" "$TMP"/ab_*.json
  echo "== summary: ab commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
else
  echo "== PyTorch eager and torch.compile beside ditops (cold and rotated): $OPS"
  : > "$OUT/torch.txt"
  PY_RC=0
  for op in $OPS; do
    echo "---- $op" | tee -a "$OUT/torch.txt"
    timeout 400 python3 bench/${op}_torch.py --lib $LIB --commit "$COMMIT" --json "$TMP/torch_$op.json" \
      >> "$OUT/torch.txt" 2>&1 || PY_RC=1
    grep -v '^MISMATCH' "$OUT/torch.txt" | sed -n "/^---- $op/,\$p" | grep -E "torch_|ditops|copy|PASS|FAIL|Error|error|Traceback" | tail -60
    merge_json "$OUT/torch.json" "$TMP"/torch_*.json  # after every op: a later timeout keeps these
  done
  if [ -n "${BENCH_EXTRA_TARGETS:-}" ]; then  # e.g. a GPU test to re-check in the same call
    for t in $BENCH_EXTRA_TARGETS; do build-dev/tests/$t 2>&1 | tail -8 | tee -a "$OUT/ctest.log"; done
  fi
  echo "== summary: python rc=$PY_RC commit=$COMMIT date=$DATE" | tee -a "$OUT/summary.txt"
fi
