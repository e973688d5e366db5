#!/usr/bin/env python3
"""compute-sanitizer over the GPU tests of every op, ending by a deadline with a verdict per job.

  python3 scripts/sanitize.py --build build-dev --out OUT/sanitizer [--budget-s 420] [--slots N]
                              [--tools memcheck,racecheck] [--filter GTEST_FILTER] [--sanitizer PATH]

Jobs: every tests/test_*_gpu binary (all its tests), the *Gpu* suites of the other test binaries,
and the op test driver's parts (tests/test_ops: one job per driver test, i.e. per op and part),
each under every tool. They run at most --slots at once (default: the machine's cores), longest
first (the driver's parts, by the op's case count, then the GPU binaries). The deadline holds by
construction: a job starts only while at least --min-job-s remain, gets the time left as its cap,
and at its cap its whole process group is sent SIGTERM and, --grace-s later, SIGKILL. Every job ends
with one verdict: clean, errors found, a test failed, timed out (not clean), no CUDA call (a filter that
selects only CPU tests of a binary: neither clean nor not) or not started (the
deadline came first). The driver runs with DITOPS_OPS_SKIP_LARGE=1 (model-sized cases would spend the
run in their CPU reference). Exit status 0 only when every job is clean or made no CUDA call, and one is clean.

Writes OUT/<tool>_<job>.txt (the tool's and the tests' output), OUT/verdicts.json and prints the
verdict table (also OUT/summary.txt).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Job:
    tool: str
    name: str                  # log name: <binary>[_<part>]
    argv: list                 # the test binary and its gtest filter
    weight: float              # expected cost, for longest-first order
    env: dict = field(default_factory=dict)
    verdict: str = "not started (the deadline came first)"
    clean: bool | None = False  # None: the job made no CUDA call (CPU-only tests selected)
    seconds: float = 0.0
    passed: int = 0
    failed: int = 0
    summary: str = ""
    vendor_kernels: list = field(default_factory=list)  # the vendor kernels its reports were in, if only there


def list_tests(binary: str) -> list[tuple[str, str]]:
    """[(suite, test)] of a gtest binary (parametrized names without their '# GetParam' comment)."""
    try:
        text = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    out, suite = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.strip().rstrip(".")
        elif suite:
            out.append((suite, line.split("#")[0].strip()))
    return out


def gtest_filter_selects(gtest_filter: str, full_name: str) -> bool:
    """Whether --gtest_filter=gtest_filter runs the test Suite.Test: positive patterns, then '-' and
    negative ones, each ':'-separated; '*' any characters, '?' one."""
    def matches(patterns: str) -> bool:
        return any(re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in p),
                                full_name) for p in patterns.split(":") if p)
    positive, _, negative = gtest_filter.partition("-")
    return matches(positive or "*") and not matches(negative)


def discover(build: str, tools: list[str], user_filter: str | None) -> list[Job]:
    """The jobs of a build's test binaries under each tool."""
    tests_dir = os.path.join(build, "tests")
    binaries = sorted(os.path.join(tests_dir, n) for n in os.listdir(tests_dir)
                      if n.startswith("test_") and os.access(os.path.join(tests_dir, n), os.X_OK)
                      and os.path.isfile(os.path.join(tests_dir, n)))
    specs = []  # (name, argv, weight, env)
    for binary in binaries:
        name = os.path.basename(binary)
        tests = list_tests(binary)
        if user_filter:
            # Only binaries with a test the filter selects: gtest exits nonzero (no verdict but
            # "not clean") on a filter that selects nothing.
            if any(gtest_filter_selects(user_filter, f"{s}.{t}") for s, t in tests):
                env = {"DITOPS_OPS_SKIP_LARGE": "1"} if name == "test_ops" else {}
                specs.append((name, [binary, f"--gtest_filter={user_filter}"], 1.0, env))
            continue
        if name == "test_ops":
            # One job per device test of the driver (an op's part): its GPU sweeps, large cases skipped.
            for suite, test in tests:
                if "every_cuda_implementation" not in test:
                    continue
                op = re.sub(r"_part\d+$", "", test.split("/")[-1])
                weight = 10.0 + DRIVER_WEIGHT.get(op, 1.0)
                specs.append((f"{name}_{test.split('/')[-1]}", [binary, f"--gtest_filter={suite}.{test}"], weight,
                              {"DITOPS_OPS_SKIP_LARGE": "1"}))
        elif name.endswith("_gpu"):
            specs.append((name, [binary, "--gtest_filter=*"], 1.0 + len(tests) / 100.0, {}))
        else:
            suites = sorted({s for s, _ in tests if "Gpu" in s})
            if suites:
                specs.append((name, [binary, "--gtest_filter=" + ":".join(f"{s}.*" for s in suites)], 0.5, {}))
    jobs = [Job(tool, name, argv, weight * (1.0 if tool == "memcheck" else 0.3), env)
            for tool in tools for name, argv, weight, env in specs]
    return sorted(jobs, key=lambda j: -j.weight)


# Relative cost of an op's driver part under memcheck (its cases' count and size): qknorm_rope's
# part took 70 s at bda4c1e, the smallest ops' a few seconds. Only the order depends on it.
DRIVER_WEIGHT = {"qknorm_rope": 8.0, "norm_scale_shift": 6.0, "fp8_linear": 4.0, "cross_head_qknorm_rope": 3.0,
                 "layernorm_modulate": 3.0, "residual_gate_add": 2.0}


# Kernels that are not ditops' code: cuBLASLt's (fp8_linear.cublaslt calls it). Their reports are
# counted apart: on the H200 racecheck reported 324 shared-memory hazards, every one inside
# cuBLASLt's warp-specialized nvjet_sm90_* FP8 GEMMs (memcheck clean there), none in a ditops kernel
# (bench/results/h200/sanitize/verdicts-bf0f87e.json: the vendor_kernels of each job).
VENDOR_KERNEL = re.compile(r"^(nvjet_|sm90_xmma|sm80_xmma|cutlass|cublas)")
# The kernel each reported error is in: "... access at KERNEL+0x..." (racecheck), "at KERNEL+0x..."
# (memcheck's "Invalid __global__ read ... at KERNEL+0x10").
ERROR_SITE = re.compile(r"^========= +(?:Error: Race reported between \w+ access|Invalid [^\n]*?|and \w+ access) at "
                        r"(?:void )?([A-Za-z_][\w:<>,]*?)\+0x", re.M)


# compute-sanitizer's message when the program exits without a CUDA call.
NO_CUDA_CALL = "Target application terminated before first instrumented API call"


def read_verdict(job: Job, log: str, rc: int | None) -> None:
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    job.passed = len(re.findall(r"^\[       OK \]", text, re.M))
    job.failed = len(re.findall(r"^\[  FAILED  \] [^\s]+\.[^\s]+ \(", text, re.M))
    m = re.findall(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards? displayed[^\n]*)", text)
    job.summary = m[-1] if m else ""
    sites = ERROR_SITE.findall(text)
    vendor_only = bool(sites) and all(VENDOR_KERNEL.match(k) for k in sites) and job.failed == 0
    if rc is None:
        job.verdict, job.clean = "timed out at its cap (killed): not clean", False
    elif rc == 0 and job.summary and not re.search(r"SUMMARY: [1-9]", job.summary):
        job.verdict, job.clean = "clean", True
    elif rc in (0, 9) and vendor_only and re.search(r"SUMMARY: [1-9]", job.summary):
        job.vendor_kernels = sorted(set(sites))
        job.verdict = f"clean in ditops' kernels; reports only in {len(job.vendor_kernels)} cuBLASLt kernels"
        job.clean = True
    elif rc == 9 or re.search(r"SUMMARY: [1-9]", job.summary):
        job.verdict, job.clean = "ERRORS FOUND", False
    elif rc == 0:
        job.verdict, job.clean = "no sanitizer summary in the log: not clean", False
    elif job.passed and not job.failed and NO_CUDA_CALL in text:
        # A filter that selects only CPU tests of a binary (the tool exits 255 with no summary):
        # nothing ran on the device, so there is nothing to be clean or unclean about.
        job.verdict, job.clean = "no CUDA call: the selected tests are CPU-only", None
    else:
        job.verdict, job.clean = f"a test failed or the tool stopped (rc {rc}): not clean", False


def kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the job's process group; SIGKILL to whatever of it is left `grace` seconds later
    (the group outlives its leader: the sanitizer may exit on SIGTERM while the test it started
    does not)."""
    def alive() -> bool:
        try:
            os.killpg(proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()  # reap the leader, so that an empty group reads as gone
        if not alive():
            break
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def run(jobs: list[Job], sanitizer: str, out: str, deadline: float, slots: int, min_job_s: float,
        grace: float) -> None:
    """Runs the jobs, at most `slots` at once, every one ended (or never started) by `deadline`."""
    pending = list(jobs)
    running = []  # (job, proc, start, cap, log)
    while pending or running:
        now = time.monotonic()
        while pending and len(running) < slots and deadline - now >= min_job_s + grace:
            job = pending.pop(0)
            log = os.path.join(out, f"{job.tool}_{job.name}.txt")
            with open(log, "w") as f:
                f.write(f"{' '.join(job.argv)}\n")
            cap = deadline - now - grace
            f = open(log, "a")
            proc = subprocess.Popen([sanitizer, "--tool", job.tool, "--error-exitcode", "9"] + job.argv,
                                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **job.env})
            f.close()
            running.append((job, proc, now, cap, log))
        still = []
        for job, proc, start, cap, log in running:
            rc = proc.poll()
            elapsed = time.monotonic() - start
            if rc is None and elapsed >= cap:
                kill_group(proc, grace)
                job.seconds = time.monotonic() - start
                read_verdict(job, log, None)
                print(f"  {job.tool}_{job.name}: {job.verdict}, {job.seconds:.0f} s", flush=True)
            elif rc is not None:
                job.seconds = elapsed
                read_verdict(job, log, rc)
                print(f"  {job.tool}_{job.name}: {job.verdict}, {job.seconds:.0f} s", flush=True)
            else:
                still.append((job, proc, start, cap, log))
        running = still
        if not running and pending and deadline - time.monotonic() < min_job_s + grace:
            break  # the rest cannot start: their verdict stays "not started"
        time.sleep(0.2)


def table(jobs: list[Job]) -> str:
    rows = [f"{'job':58s} {'verdict':62s} {'tests ok/failed':>15s} {'s':>5s}  sanitizer summary"]
    for j in sorted(jobs, key=lambda j: (j.tool, j.name)):
        rows.append(f"{j.tool + '_' + j.name:58s} {j.verdict[:62]:62s} {f'{j.passed}/{j.failed}':>15s} "
                    f"{j.seconds:5.0f}  {j.summary}")
    clean = sum(j.clean is True for j in jobs)
    no_cuda = sum(j.clean is None for j in jobs)
    vendor = sum(bool(j.vendor_kernels) for j in jobs)
    rows.append(f"{clean} of {len(jobs)} jobs clean" + (f", {no_cuda} without a CUDA call" if no_cuda else "") +
                (f" ({vendor} with reports only in cuBLASLt's own kernels, listed in verdicts.json)" if vendor else ""))
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-dev")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds from now to the deadline")
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--tools", default="memcheck,racecheck")
    ap.add_argument("--filter", help="one gtest filter for every binary instead of the selection")
    ap.add_argument("--sanitizer", default=None)
    ap.add_argument("--min-job-s", type=float, default=20.0, help="a job starts only with this much time left")
    ap.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL")
    a = ap.parse_args()
    start = time.monotonic()
    deadline = start + a.budget_s
    sanitizer = a.sanitizer or next((p for p in ("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer")
                                     if subprocess.run(["sh", "-c", f"command -v {p}"], capture_output=True).returncode == 0),
                                    "compute-sanitizer")
    os.makedirs(a.out, exist_ok=True)
    jobs = discover(a.build, a.tools.split(","), a.filter)
    print(f"== compute-sanitizer: {len(jobs)} jobs ({a.tools}), {a.slots} at once, longest first, "
          f"deadline in {a.budget_s:.0f} s", flush=True)
    run(jobs, sanitizer, a.out, deadline, a.slots, a.min_job_s, a.grace_s)
    text = table(jobs) + f"wall {time.monotonic() - start:.0f} s of a {a.budget_s:.0f} s budget\n"
    sys.stdout.write(text)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "verdicts.json"), "w") as f:
        json.dump([{"tool": j.tool, "job": j.name, "verdict": j.verdict, "clean": j.clean, "seconds": round(j.seconds, 1),
                    "passed": j.passed, "failed": j.failed, "summary": j.summary, "vendor_kernels": j.vendor_kernels}
                   for j in jobs], f, indent=1)
    # Clean: every job clean or without a CUDA call, and at least one clean.
    return 0 if any(j.clean is True for j in jobs) and all(j.clean is not False for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
