"""scripts/sanitize.py, the scheduler of `scripts/device_run.sh sanitize`, on fake test binaries and a
fake compute-sanitizer (CPU): the deadline holds even when a job ignores SIGTERM, no more jobs run at
once than there are slots, and every job gets its own verdict."""
import json
import os
import stat
import subprocess
import sys
import textwrap
import time

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "sanitize.py")

# A stand-in for compute-sanitizer: `fake --tool T --error-exitcode 9 BINARY ARGS...` runs the binary
# and records how many jobs ran at once (a lock-free count in a folder of marker files).
FAKE_SANITIZER = textwrap.dedent("""\
    #!/usr/bin/env python3
    import os, subprocess, sys
    args = sys.argv[1:]
    tool = args[1]
    binary, rest = args[4], args[5:]
    marks = os.environ["FAKE_MARKS"]
    mark = os.path.join(marks, str(os.getpid()))
    open(mark, "w").close()
    os.makedirs(os.path.join(marks, "..", "peak"), exist_ok=True)
    open(os.path.join(marks, "..", "peak", str(len(os.listdir(marks)))), "w").close()
    try:
        rc = subprocess.call([binary] + rest + ["--tool=" + tool])
    finally:
        os.unlink(mark)
    sys.exit(rc)
""")

# Fake gtest binaries: --gtest_list_tests lists their suites; a run behaves as the name says.
BINARIES = {
    "test_clean_gpu": ("CleanGpu.\n  a\n  b\n", 'echo "[       OK ] CleanGpu.a (1 ms)"; echo "[       OK ] CleanGpu.b (1 ms)";'
                       ' sleep 0.5; echo "========= ERROR SUMMARY: 0 errors"; exit 0'),
    "test_faulty_gpu": ("FaultyGpu.\n  a\n", 'echo "[       OK ] FaultyGpu.a (1 ms)"; echo "========= ERROR SUMMARY: 2 errors";'
                        " exit 9"),
    "test_stubborn_gpu": ("StubbornGpu.\n  a\n", "trap '' TERM; echo $$ > \"$FAKE_MARKS/../stubborn.pid\"; "
                          "while true; do sleep 0.2; done"),
    "test_cpu_only": ("CpuSuite.\n  a\n", "exit 0"),  # no Gpu suite: no job
    "test_mixed": ("CpuSuite.\n  a\nMixedGpu.\n  b\n",
                   'echo "$@" | grep -q "MixedGpu" && echo "[       OK ] MixedGpu.b (1 ms)";'
                   ' echo "========= ERROR SUMMARY: 0 errors"; exit 0'),
}


def make_build(tmp):
    tests = tmp / "build" / "tests"
    tests.mkdir(parents=True)
    for name, (listing, body) in BINARIES.items():
        path = tests / name
        path.write_text("#!/bin/sh\n"
                        f'if [ "$1" = --gtest_list_tests ]; then printf "{listing.replace(chr(10), chr(92) + "n")}"; exit 0; fi\n'
                        f"{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    fake = tmp / "fake-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (tmp / "marks").mkdir()
    return tmp / "build", fake


def run_script(tmp, build, fake, budget, slots, tools="memcheck", extra=()):
    out = tmp / "out"
    env = {**os.environ, "FAKE_MARKS": str(tmp / "marks")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, SCRIPT, "--build", str(build), "--out", str(out), "--budget-s", str(budget),
                           "--slots", str(slots), "--tools", tools, "--sanitizer", str(fake), "--min-job-s", "1",
                           "--grace-s", "1", *extra], env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0, {(v["tool"], v["job"]): v for v in json.load(open(out / "verdicts.json"))}


def test_deadline_holds_with_a_job_that_ignores_sigterm(tmp_path):
    build, fake = make_build(tmp_path)
    proc, wall, verdicts = run_script(tmp_path, build, fake, budget=6, slots=2)
    # The stubborn job is killed at its cap (SIGTERM, then SIGKILL after the grace): the run ends
    # by the deadline plus the kill's few seconds, not when the job would.
    assert wall < 6 + 1 + 5 + 3, proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert verdicts[("memcheck", "test_stubborn_gpu")]["verdict"].startswith("timed out")
    assert not verdicts[("memcheck", "test_stubborn_gpu")]["clean"]
    assert verdicts[("memcheck", "test_clean_gpu")]["clean"]
    assert verdicts[("memcheck", "test_clean_gpu")]["passed"] == 2
    assert verdicts[("memcheck", "test_faulty_gpu")]["verdict"] == "ERRORS FOUND"
    assert verdicts[("memcheck", "test_mixed")]["clean"]  # only its Gpu suite ran
    assert ("memcheck", "test_cpu_only") not in verdicts
    assert "1 of 4 jobs clean" not in proc.stdout and "2 of 4 jobs clean" in proc.stdout
    # The stubborn test itself is gone, not only the sanitizer that started it (it ignores SIGTERM
    # and outlives its parent: the SIGKILL goes to the whole process group).
    pid = int((tmp_path / "stubborn.pid").read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_no_more_jobs_at_once_than_slots_and_unstarted_jobs_say_so(tmp_path):
    build, fake = make_build(tmp_path)
    # One slot: the stubborn job holds it until its cap, which is the deadline, so whatever comes
    # after it in the queue never starts, and says so.
    proc, wall, verdicts = run_script(tmp_path, build, fake, budget=4, slots=1, tools="memcheck,racecheck")
    peaks = [int(n) for n in os.listdir(tmp_path / "peak")]
    assert max(peaks) == 1
    assert len(verdicts) == 8
    assert any(v["verdict"].startswith("not started") for v in verdicts.values()), proc.stdout
    assert wall < 4 + 1 + 5 + 3


def test_a_filter_runs_only_the_binaries_it_selects_a_test_of(tmp_path):
    """--filter: a binary none of whose tests the filter selects gets no job (gtest would exit
    nonzero on it, a "not clean" verdict for a test that never ran)."""
    build, fake = make_build(tmp_path)
    proc, _, verdicts = run_script(tmp_path, build, fake, budget=20, slots=2, extra=("--filter", "*Gpu.b-Faulty*"))
    assert set(verdicts) == {("memcheck", "test_clean_gpu"), ("memcheck", "test_mixed")}, proc.stdout
    assert all(v["clean"] for v in verdicts.values())
    assert proc.returncode == 0


def _verdict_of(tmp_path, log_text, rc):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import sanitize
    finally:
        sys.path.pop(0)
    log = tmp_path / "log.txt"
    log.write_text(log_text)
    job = sanitize.Job("racecheck", "test_ops_fp8_linear_part1", [], 1.0)
    sanitize.read_verdict(job, str(log), rc)
    return job


RACE = ("========= Error: Race reported between Read access at {a}+0xb40\n"
        "=========     and Write access at {b}+0x2bc0 [8 hazards]\n")


def test_reports_only_in_vendor_kernels_are_counted_apart_and_ours_are_errors(tmp_path):
    lt = "nvjet_sm90_qqtst_64x8_128x16_2x1_v_bz_algo2_TNT"
    ok = "[       OK ] driver/ops.x (1 ms)\n"
    summary = "========= RACECHECK SUMMARY: 8 hazards displayed (8 errors, 0 warnings)\n"
    job = _verdict_of(tmp_path, ok + RACE.format(a=lt, b=lt) + summary, 9)
    assert job.clean and job.vendor_kernels == [lt] and "cuBLASLt" in job.verdict
    # One report in a ditops kernel (or on either side of a race) makes the job's errors ours.
    for a, b in ((lt, "ditops_aot_3"), ("fp8_linear_skinny_mma", lt)):
        job = _verdict_of(tmp_path, ok + RACE.format(a=lt, b=lt) + RACE.format(a=a, b=b) + summary, 9)
        assert not job.clean and job.verdict == "ERRORS FOUND" and job.vendor_kernels == []
    # A failed test is never clean, wherever the reports are.
    job = _verdict_of(tmp_path, "[  FAILED  ] driver/ops.x (1 ms)\n" + RACE.format(a=lt, b=lt) + summary, 9)
    assert not job.clean
    # Errors with no kernel named stay errors.
    job = _verdict_of(tmp_path, ok + "========= ERROR SUMMARY: 2 errors\n", 9)
    assert not job.clean and job.verdict == "ERRORS FOUND"


def test_a_job_whose_selected_tests_make_no_cuda_call_is_neither_clean_nor_an_error(tmp_path):
    ok = "[       OK ] NssMatching.Fp8RowwiseNeedsBothOutputs (7 ms)\n[  PASSED  ] 1 test.\n"
    no_call = "========= Error: Target application terminated before first instrumented API call\n"
    job = _verdict_of(tmp_path, ok + no_call, 255)
    assert job.clean is None and "no CUDA call" in job.verdict
    # The same message after a failed test, or with no test run, stays not clean.
    job = _verdict_of(tmp_path, "[  FAILED  ] NssMatching.x (7 ms)\n" + no_call, 255)
    assert job.clean is False
    job = _verdict_of(tmp_path, no_call, 255)
    assert job.clean is False
