"""The distinct checked cases of every op, and whether they dropped (ctest `checked_cases`).

A checked case is a triple (op, configuration, property): a configuration is one distinct call of
the op (shapes, dtypes, layout, options, a class of values) or one distinct argument set of a unit
of it (a kernel key and arch, a conversion's exhaustive sweep counted once); a property is one kind
of expectation on it (agreement with an independent oracle or with the reference, the refusal and
its message with nothing written, nothing written outside the outputs, equality with another
configuration, a classification or kernel key, ...). docs/testing.md says more.

* The op test driver's: `export_op_cases --count` (each case once per property the driver checks
  for it; the ones checked without a device apart; cases of one call, their name or seed apart,
  once).
* The bespoke tests' (tests/test_<op>*.cpp): the table tests/checked_bespoke.tsv, one line per
  TEST with its count and how it was counted. The script fails when a TEST of those files has no
  line or a line names a TEST that is gone, so the table follows the files.

It fails too when the total, or an op's, falls below BEFORE: the counts before the driver took
the bespoke tests over (main at 3b0128b).

    python3 tests/checked_cases.py build/tests/export_op_cases
"""
import collections
import pathlib
import re
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

# Per op: (driver, bespoke) at 3b0128b, counted by this script's first version with calls that differ
# in their seed alone counted once (as export_op_cases --count does): fp8_linear's bespoke 417 were
# 172 distinct (its two seed sweeps: 220 as 35, 90 as 30).
BEFORE = {
    "causal_conv3d_cat_pad": (312, 501),
    "cross_head_qknorm_rope": (126, 0),
    "fp8_linear": (199, 172),
    "fp8_static_quant": (112, 1),
    "layernorm_modulate": (756, 500),
    "layernorm_modulate_fp8": (186, 45),
    "norm_scale_shift": (559, 326),
    "qk_head_layernorm": (49, 11),
    "qknorm_rope": (1669, 2855),
    "residual_gate_add": (507, 908),
    "token_cat_fp8": (160, 378),
}

# file -> {Suite.Test: (op, count, how)}, from the table beside this script (one line a TEST).
def bespoke_table(path=TESTS / "checked_bespoke.tsv"):
    table = collections.defaultdict(dict)
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, test, op, count, how = line.split("\t")
            table[name][test] = (op, int(count), how)
    return table


BESPOKE = bespoke_table()

TEST_RE = re.compile(r"^TEST(?:_F|_P)?\((\w+),\s*(\w+)\)", re.M)


def driver_counts(exporter):
    """{op: (checked with a device, of them without one)} from export_op_cases --count."""
    run = subprocess.run([exporter, "--count"], check=True, capture_output=True, text=True)
    print(run.stderr.strip())
    out = run.stdout
    counts = collections.defaultdict(lambda: [0, 0])
    for line in out.splitlines():
        op, _, n, cpu = line.split("\t")
        counts[op][0] += int(n)
        counts[op][1] += int(cpu)
    return counts


def per_op_files(ops):
    """The bespoke test files of the ops: tests/test_<op>*.cpp."""
    files = set()
    for path in TESTS.glob("test_*.cpp"):
        stem = path.stem[len("test_"):]
        if any(stem == op or stem.startswith(op + "_") for op in ops):
            files.add(path.name)
    return files


def main():
    exporter = sys.argv[1] if len(sys.argv) > 1 else "build/tests/export_op_cases"
    driver = driver_counts(exporter)
    problems = []
    bespoke = collections.Counter()
    files = per_op_files(driver)
    for name in sorted(files | set(BESPOKE)):
        path = TESTS / name
        found = {f"{s}.{t}" for s, t in TEST_RE.findall(path.read_text())} if path.exists() else set()
        table = BESPOKE.get(name, {})
        problems += [f"{name}: {t} has no line in checked_bespoke.tsv" for t in sorted(found - set(table))]
        problems += [f"{name}: checked_bespoke.tsv names {t}, which is gone" for t in sorted(set(table) - found)]
        for test, (op, n, _) in table.items():
            if test in found:
                bespoke[op] += n
    ops = sorted(set(driver) | set(bespoke))
    print(f"{'op':24} {'driver':>8} {'(no GPU)':>8} {'bespoke':>8} {'total':>8} {'before':>8}")
    total = total_before = 0
    for op in ops:
        d, cpu = driver.get(op, (0, 0))
        before = sum(BEFORE.get(op, (0, 0)))
        total += d + bespoke[op]
        total_before += before
        print(f"{op:24} {d:8} {cpu:8} {bespoke[op]:8} {d + bespoke[op]:8} {before:8}")
        if d + bespoke[op] < before:
            problems.append(f"{op}'s distinct checked cases dropped: {d + bespoke[op]} < {before} before")
    print(f"{'all':24} {sum(d for d, _ in driver.values()):8} {sum(c for _, c in driver.values()):8} "
          f"{sum(bespoke.values()):8} {total:8} {total_before:8}")
    if total < total_before:
        problems.append(f"the distinct checked cases dropped: {total} < {total_before} before")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
