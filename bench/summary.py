#!/usr/bin/env python3
"""One screen per GPU run: per op, the tests that passed and failed, the torch.equal cases and the
fastest implementation at the op's largest benchmarked shape with its fraction of the roof.

  python3 bench/summary.py OUT_DIR [--ops OP,OP,...]

Reads what `scripts/device_run.sh verify` writes to OUT_DIR (each optional; a missing one shows as
"-"):
  ctest.log              ctest's output: one line per test, "Passed" / "***Failed" / ...
  pytest.xml             pytest's JUnit XML (python_pytest, PYTEST_ADDOPTS=--junitxml=...)
  torch/*_checks.json    the check records of bench/<op>_torch.py: `torch_equal` per case of a
                         bit_exact implementation, `within_bound` per case of a close one (its
                         float64 bound), other booleans (graph replays, streams, run-to-run) as
                         further checks
  kernels.json           ditops.list_kernels(): each implementation's contract (bit_exact, close)
  bench_cpp.json         `ditops bench` records (bench/results/README.md): per op the case
                         with the most bytes, the fastest implementation there (rotated_graph where
                         timed, else cold_l2) and its read_roof_fraction, else copy_fraction
Tests are given to an op by name: the op's name without underscores inside the test's (CamelCase
suites, pytest ids), or an abbreviation the tests use (Nss, rga, ln_mod, qk_head); the rest are
"other". --ops names the ops (default: those in the records and checks).
"""
import argparse
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from records import short_impl  # noqa: E402

# Abbreviations of op names in test names (lowercase, as they appear), longest first.
ALIASES = [("ln_mod_fp8", "layernorm_modulate_fp8"), ("ln_mod", "layernorm_modulate"), ("qk_head", "qk_head_layernorm"),
           ("nss", "norm_scale_shift"), ("rga", "residual_gate_add")]

# "  5/316 Test  #12: Suite.Name ......***Failed    0.10 sec" (Passed, ***Skipped, ***Timeout,
# ***Exception: SegFault, ***Failed  Required regular expression not found ..., ***Not Run); a
# parametrized gtest's name is followed by '  # GetParam() = "..."' before the dots.
CTEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+).*? \.{3,}\s*(?:\*\*\*)?(\w+).*?\s+([\d.]+) sec\s*$")


def op_of(test, ops):
    """The op a test belongs to, or None."""
    flat = re.sub(r"[_\-]", "", test.lower())
    for op in sorted(ops, key=len, reverse=True):
        if op.replace("_", "") in flat:
            return op
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", test).lower()  # NssJit -> nss_jit
    for alias, op in ALIASES:
        if op in ops and re.search(r"(?<![a-z0-9])" + alias + r"(?![a-z0-9])", words):
            return op
    return None


def ctest_results(path):
    """[(test, passed: bool, status, seconds)] from a ctest log; skipped tests are left out."""
    out = []
    if not os.path.exists(path):
        return None
    for line in open(path, errors="replace"):
        m = CTEST_LINE.match(line)
        if m and m.group(2) != "Skipped":
            out.append((m.group(1), m.group(2) == "Passed", m.group(2), float(m.group(3))))
    return out


def pytest_results(path):
    """[(test id, passed, status, seconds)] from JUnit XML; skipped tests are left out."""
    if not os.path.exists(path):
        return None
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            continue
        bad = kinds & {"failure", "error"}
        out.append((name, not bad, "Passed" if not bad else sorted(bad)[0], float(case.get("time") or 0)))
    return out


def slowest(results, n=4):
    """"name 12.3 s, ..." of the n slowest."""
    top = sorted(results or [], key=lambda t: -t[3])[:n]
    return ", ".join(f"{name} {secs:.1f} s" for name, _, _, secs in top)


def load_contracts(out_dir):
    """{implementation: "bit_exact" | "close"} from OUT_DIR/kernels.json (ditops.list_kernels(),
    written by the verify run), or {} when it is missing."""
    path = os.path.join(out_dir, "kernels.json")
    if not os.path.exists(path):
        return {}
    return {k["name"]: k.get("contract", "") for k in json.load(open(path))}


def check_results(folder, contracts=None):
    """{op: [exact_equal, exact_total, close_within, close_total, checks_passed, checks_total]} from
    bench/<op>_torch.py check records. Each contract is counted with its own oracle: a record with
    `within_bound` is a close check (the implementation's float64 bound); a `torch_equal` record of
    an implementation whose contract is close (kernels.json) counts as close and passes only with
    `within_bound`; the other `torch_equal` records are bit_exact checks."""
    contracts = contracts or {}
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*_checks.json"))):
        default_op = re.sub(r"^(verify|torch)_", "", os.path.basename(path)[: -len("_checks.json")])
        for r in json.load(open(path)):
            op = r.get("op") or default_op
            row = out.setdefault(op, [0, 0, 0, 0, 0, 0])
            if r.get("kind") == "compile_vs_eager":
                continue  # what torch.compile's own chain does against eager: a measurement, no check of ours
            bounded = "within_bound" in r or "beyond_bound" in r
            close = bounded or contracts.get(r.get("impl", "")) == "close"
            if close and ("torch_equal" in r or bounded):
                # Within the bound: said so, or no output beyond it, or equal (within any bound).
                row[2] += bool(r.get("within_bound", False) or r.get("beyond_bound", 1) == 0
                               or r.get("torch_equal", False))
                row[3] += 1
            elif "torch_equal" in r:
                row[0] += bool(r["torch_equal"])
                row[1] += 1
            else:
                for key, value in r.items():
                    if isinstance(value, bool):
                        row[4] += value
                        row[5] += 1
    return out


def fastest(records):
    """{op: (case, shape, impl, method, us, fraction, roof)} at each op's largest case (the most
    bytes: past the 60 MB L2 where the model has such a shape, so the fraction is DRAM's)."""
    out = {}
    largest = {}
    for r in records:
        if r.get("method") in ("cold_l2", "rotated_graph") and r.get("bytes"):
            if r["bytes"] > largest.get(r["op"], ("", 0))[1]:
                largest[r["op"]] = (r["case"], r["bytes"])
    for op, (case, _) in largest.items():
        rows = [r for r in records if r["op"] == op and r["case"] == case and r["impl"] not in ("device_copy", "read_roof")
                and r.get("method") in ("cold_l2", "rotated_graph")]
        rotated = [r for r in rows if r["method"] == "rotated_graph"]
        rows = rotated or rows
        if not rows:
            continue
        best = min(rows, key=lambda r: r["us"])
        if best.get("read_roof_fraction"):
            fraction, roof = best["read_roof_fraction"], "read roof"
        else:
            fraction, roof = best.get("copy_fraction"), "copy"
        out[op] = (case, best.get("shape", ""), short_impl(best["impl"]), best["method"], best["us"], fraction, roof)
    return out


def summarize(out_dir, ops=None):
    """The summary as text."""
    ctest = ctest_results(os.path.join(out_dir, "ctest.log"))
    pytest = pytest_results(os.path.join(out_dir, "pytest.xml"))
    checks = check_results(os.path.join(out_dir, "torch"), load_contracts(out_dir))
    bench_path = os.path.join(out_dir, "bench_cpp.json")
    records = json.load(open(bench_path)) if os.path.exists(bench_path) else []
    best = fastest(records)
    if not ops:
        ops = sorted(set(checks) | set(best) | {r["op"] for r in records})
    if ctest is not None and pytest is not None:
        ctest = [t for t in ctest if t[0] != "python_pytest"]  # its tests are counted one by one
    tests = {op: [0, 0] for op in list(ops) + ["(other)"]}
    failed = []
    for results in (ctest, pytest):
        for name, ok, status, _ in results or []:
            row = tests[op_of(name, ops) or "(other)"]
            row[0 if ok else 1] += 1
            if not ok:
                failed.append(f"{name} ({status})")

    def count(pair):
        return f"{pair[0]}/{pair[1]}" if pair[1] else "-"

    lines = [f"{'op':22s} {'tests ok/fail':>13s} {'exact eq':>8s} {'close ok':>8s} {'checks':>6s}  "
             "fastest at its largest shape: us, roof fraction"]
    for op in list(ops) + ["(other)"]:
        t = tests[op]
        if op == "(other)" and not any(t):
            continue
        c = checks.get(op, [0, 0, 0, 0, 0, 0])
        if op in best:
            case, _, impl, method, us, fraction, roof = best[op]
            frac = f"{fraction:.2f} {roof.split()[0]}" if fraction else f"no {roof} timed"
            method = {"rotated_graph": "rotated", "cold_l2": "cold L2"}.get(method, method)
            fast = f"{impl} {us:.2f} us {frac} ({method}; {case[:24]})"
        else:
            fast = "-"
        tests_text = f"{t[0]}/{t[1]}" if ctest is not None or pytest is not None else "-"
        lines.append(f"{op:22s} {tests_text:>13s} {count(c[0:2]):>8s} {count(c[2:4]):>8s} {count(c[4:6]):>6s}  {fast}")
    sources = [name for name, found in (("ctest.log", ctest is not None), ("pytest.xml", pytest is not None),
                                        ("torch checks", bool(checks)), ("bench_cpp.json", bool(records))) if not found]
    if sources:
        lines.append("missing or empty in " + out_dir + ": " + ", ".join(sources))
    for label, results in (("slowest ctest", ctest), ("slowest pytest", pytest)):
        if results:
            lines.append(f"{label}: {slowest(results)}")
    if failed:
        lines.append(f"failed ({len(failed)}): " + "; ".join(failed[:8]) + (" ..." if len(failed) > 8 else ""))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--ops", help="comma-separated op names (default: those in the records and checks)")
    a = ap.parse_args()
    if not os.path.isdir(a.out_dir):
        sys.exit(f"summary.py: {a.out_dir} is not a folder")
    sys.stdout.write(summarize(a.out_dir, [o for o in (a.ops or "").split(",") if o]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
