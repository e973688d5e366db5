#!/usr/bin/env python3
"""Evidence records: promotion records of kda kernels and admission records of close
implementations, kept in bench/results/<device>/evidence.json beside the timing records, checked
against them, and turned into the library's table src/core/evidence_records.inc.

  python3 bench/evidence.py generate bench/results > src/core/evidence_records.inc
  python3 bench/evidence.py check bench/results src/core/evidence_records.inc
      Every record valid (below) and the committed table exactly what generate writes.

A promotion record ({"kind": "promotion", ...}): implementation, op, shapes, oracle, tolerance,
cases (the timing records' case names), method, impl (its timing records' impl), baseline (the
baseline's impl, e.g. "torch_scaled_mm"), speedup, device, date, commit. Valid when the timing
records hold both impls for every case with that method, device and commit, and speedup equals
the median over the cases of baseline us / impl us, to 2 decimals.

An admission record ({"kind": "admission", ...}): implementation, op, shapes (the grid), oracle
(the fp64 evaluation), rms_ratio, max_ratio, bias_over_rms, special_values_match, device, date,
commit. Valid when it passes the admission rule (admission_passes): the candidate's RMS and max
error against an fp64 evaluation of the same math at most 1.5x the eager chain's, its mean error
within a quarter of its RMS error, and the same NaN/Inf placement as the eager chain.
"""
import argparse
import glob
import json
import os
import statistics
import sys

MAX_ERROR_RATIO = 1.5  # candidate error / eager chain error, RMS and max
MAX_BIAS_OVER_RMS = 0.25  # |mean error| / RMS error


def admission_metrics(candidate, eager, exact):
    """The admission figures of one output (torch tensors of one shape; exact: the fp64
    evaluation of the same math): rms_ratio, max_ratio, bias_over_rms, special_values_match."""
    import torch
    c, e, x = candidate.double(), eager.double(), exact.double()
    special = lambda t: (torch.isnan(t), torch.isposinf(t), torch.isneginf(t))  # noqa: E731
    match = all(torch.equal(a, b) for a, b in zip(special(c), special(e)))
    finite = torch.isfinite(c) & torch.isfinite(e) & torch.isfinite(x)
    dc, de = (c - x)[finite], (e - x)[finite]

    def ratio(a, b):
        if b == 0:
            return 0.0 if a == 0 else float("inf")
        return a / b

    rms_c = float(dc.pow(2).mean().sqrt()) if dc.numel() else 0.0
    rms_e = float(de.pow(2).mean().sqrt()) if de.numel() else 0.0
    max_c = float(dc.abs().max()) if dc.numel() else 0.0
    max_e = float(de.abs().max()) if de.numel() else 0.0
    bias = float(dc.mean()) if dc.numel() else 0.0
    return {"rms_ratio": ratio(rms_c, rms_e), "max_ratio": ratio(max_c, max_e),
            "bias_over_rms": ratio(abs(bias), rms_c), "special_values_match": match}


def admission_passes(m) -> str:
    """"" when the figures admit the implementation to the lossless tier, else why not."""
    why = []
    if not m["special_values_match"]:
        why.append("NaN/Inf placement differs from the eager chain's")
    if m["rms_ratio"] > MAX_ERROR_RATIO:
        why.append(f"RMS error {m['rms_ratio']:.3g}x the eager chain's (at most {MAX_ERROR_RATIO})")
    if m["max_ratio"] > MAX_ERROR_RATIO:
        why.append(f"max error {m['max_ratio']:.3g}x the eager chain's (at most {MAX_ERROR_RATIO})")
    if m["bias_over_rms"] > MAX_BIAS_OVER_RMS:
        why.append(f"|mean error| {m['bias_over_rms']:.3g} of its RMS error (at most {MAX_BIAS_OVER_RMS})")
    return "; ".join(why)


def load_records(results):
    """(evidence records, timing records by device folder) of a results folder."""
    evidence, timing = [], {}
    for folder in sorted(glob.glob(os.path.join(results, "*"))):
        if not os.path.isdir(folder):
            continue
        records = []
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            with open(path) as f:
                data = json.load(f)
            if os.path.basename(path) == "evidence.json":
                evidence += [dict(r, _file=path) for r in data]
            else:
                records += data
        timing[folder] = records
    return evidence, timing


def validate(record, timing) -> str:
    """"" when the record is valid against the timing records of its folder, else why not."""
    kind = record.get("kind")
    common = ("implementation", "op", "shapes", "oracle", "device", "date", "commit")
    missing = [k for k in common if not record.get(k)]
    if missing:
        return f"missing {', '.join(missing)}"
    if kind == "admission":
        fields = ("rms_ratio", "max_ratio", "bias_over_rms", "special_values_match")
        if any(k not in record for k in fields):
            return "an admission record needs " + ", ".join(fields)
        why = admission_passes(record)
        return f"does not pass admission: {why}" if why else ""
    if kind != "promotion":
        return f"kind must be promotion or admission but is {kind!r}"
    fields = ("tolerance", "cases", "method", "impl", "baseline", "speedup")
    if any(k not in record for k in fields):
        return "a promotion record needs " + ", ".join(fields)
    ratios = []
    for case in record["cases"]:
        def us(impl):
            hits = [r["us"] for r in timing if r["op"] == record["op"] and r["case"] == case and r["impl"] == impl
                    and r["method"] == record["method"] and r["commit"] == record["commit"]]
            return hits[0] if hits else None
        mine, base = us(record["impl"]), us(record["baseline"])
        if mine is None or base is None:
            return (f"case {case}: no {record['method']} timing record of "
                    f"{record['impl'] if mine is None else record['baseline']} at {record['commit']}")
        ratios.append(base / mine)
    measured = round(statistics.median(ratios), 2)
    if measured != round(float(record["speedup"]), 2):
        return f"speedup {record['speedup']} but the timing records give {measured}"
    return ""


def _c(text) -> str:
    return json.dumps(str(text))  # a C string literal (JSON escapes are C escapes for this text)


def generate(results) -> str:
    evidence, _ = load_records(results)
    lines = ["// Generated by `python3 bench/evidence.py generate bench/results`: do not edit.",
             "// {implementation, kind, shapes, oracle, tolerance, result, device, date, commit}"]
    for r in sorted(evidence, key=lambda r: (r["implementation"], r["kind"], r["date"])):
        if r["kind"] == "promotion":
            result = f"{r['speedup']:.2f}x {r['baseline']} ({r['method']}, median over {len(r['cases'])} cases)"
            tolerance = r["tolerance"]
        else:
            result = (f"error {r['rms_ratio']:.2f}x (RMS) and {r['max_ratio']:.2f}x (max) the eager chain's, "
                      f"bias {r['bias_over_rms']:.2f} of the RMS error, NaN/Inf placement identical")
            tolerance = f"RMS and max error <= {MAX_ERROR_RATIO}x the eager chain's, bias <= {MAX_BIAS_OVER_RMS} RMS"
        fields = (r["implementation"], r["kind"], r["shapes"], r["oracle"], tolerance, result, r["device"],
                  r["date"], r["commit"])
        lines.append("{" + ", ".join(_c(f) for f in fields) + "},")
    return "\n".join(lines) + "\n"


def check(results, table) -> list:
    evidence, timing = load_records(results)
    problems = []
    for r in evidence:
        folder = os.path.dirname(r["_file"])
        why = validate(r, timing.get(folder, []))
        if why:
            problems.append(f"{r['_file']}: {r.get('implementation')}: {why}")
    with open(table) as f:
        if f.read() != generate(results):
            problems.append(f"{table} is not what `bench/evidence.py generate {results}` writes: regenerate it")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write the C++ table of the records")
    g.add_argument("results")
    c = sub.add_parser("check", help="validate the records and the committed table")
    c.add_argument("results")
    c.add_argument("table")
    args = p.parse_args(argv)
    if args.command == "generate":
        sys.stdout.write(generate(args.results))
        return 0
    problems = check(args.results, args.table)
    for line in problems:
        print(line, file=sys.stderr)
    print(f"evidence: {'FAIL' if problems else 'ok'} ({len(load_records(args.results)[0])} records)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
