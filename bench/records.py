#!/usr/bin/env python3
"""The benchmark records of bench/results/<device>/<op>.json: merge new ones in, print tables.

  python3 bench/records.py convert --out bench/results/h200 FILE.json...
      Reads the records of each FILE (the JSON lists `ditops bench <op> --json` and
      bench/<op>_torch.py --json write, or records of the older formats), keeps the timing records,
      brings them into the record format and merges them into OUT/<op>.json: a record replaces
      the one of the same (case, impl, method); the others stay. --replace starts each op's file
      afresh from the records of this call.
  python3 bench/records.py table bench/results/h200 [--op OP] [--method METHOD]
      One markdown table per op (and method): a row per case, a column per implementation,
      us (% of the device copy timed the same way; "r" before it: % of the read roof, GEMM/GEMV).
  python3 bench/records.py table bench/results/h200 --current
      The current table of each op (bench/results/README.md): its torch benchmark's cases (the C++
      benchmark's where it has none) in one method, rotated_graph where measured, with the device
      run(s) its rows come from and the roof.

A record (bench/results/README.md): op, case, shape, impl, method, us, bytes, gb_per_s,
copy_fraction, read_roof_fraction, device, date, commit. Methods: cold_l2, rotated_graph,
cold_graph, host.
"""
import argparse
import json
import os
import re
import sys

FIELDS = ("op", "case", "shape", "impl", "method", "us", "bytes", "gb_per_s", "copy_fraction", "read_roof_fraction",
          "device", "date", "commit")
METHODS = ("cold_l2", "rotated_graph", "cold_graph", "host")
# Names of the older records.
OLD_METHODS = {"cold": "cold_l2", "rotated": "rotated_graph", "cold_graph": "cold_graph"}

# Shapes of the older records whose case name does not hold one.
RGA_SHAPES = {"flux_text": "(1,512,3072)", "flux_image": "(1,4096,3072)", "flux_joint": "(1,4608,3072)",
              "flux2_joint": "(1,4608,6144)", "qwen_cfg": "(2,6912,3072)", "wan": "(1,32760,5120)",
              "full_gate": "(1,512,4096)", "per_token": "(1,2560,512)", "odd_width": "(2,33,65)",
              "sana_transposed": "(1,32760,2240)", "transposed_small": "(1,17,65)",
              "transposed_medium": "(2,513,256)", "sana_odd_tokens": "(1,32761,2240)"}


def qk_shape(tokens, hq, hk, d=128):
    return f"({tokens},{hq},{d}),({tokens},{hk},{d})"


QK_SHAPES = {"FLUX.1 1024px (4608 tok, 24h)": qk_shape(4608, 24, 24), "Qwen-Image 1328px (6912 tok, 24h)": qk_shape(6912, 24, 24),
             "Z-Image (4096 tok, 30h)": qk_shape(4096, 30, 30), "HunyuanVideo 720p (~30k tok, 24h)": qk_shape(30000, 24, 24),
             "Wan-like 480p (32760 tok, 40h)": qk_shape(32760, 40, 40), "GQA 32q/8kv hd128 (8192 tok)": qk_shape(8192, 32, 8),
             "partial rope hd128 r64 (8192 tok)": qk_shape(8192, 32, 8), "small: 256 tok 24h": qk_shape(256, 24, 24)}
HOST_SHAPES = {"qknorm_rope": qk_shape(1, 24, 24), "residual_gate_add": "(1,4,64)"}


def infer_shape(r):
    case = r["case"]
    if r["op"] == "qknorm_rope":
        return QK_SHAPES.get(case) or HOST_SHAPES["qknorm_rope"]
    if r.get("method") == "host" or "host overhead" in case:
        return HOST_SHAPES.get(r["op"], "")
    m = re.search(r"\((\d+(?:,\d+)+)\)", case)
    if m:
        return f"({m.group(1)})"
    m = re.search(r"(\d+)x(\d+)x(\d+)", case)
    if m:
        return "({},{},{})".format(*m.groups())
    m = re.match(r"(\d+) tokens x(\d+)", case)
    if m:
        return f"(1,{m.group(1)},{m.group(2)})"
    m = re.search(r"\((\d+) rows, D=(\d+)\)", case)
    if m:
        return f"(1,{m.group(1)},{m.group(2)})"
    return RGA_SHAPES.get(case.split(" ")[0], "")


def normalize(r):
    """The record in the record format, or None for what is not a timing record (checks)."""
    if not isinstance(r, dict) or "us" not in r or "op" not in r or r.get("kind", "bench") != "bench":
        return None
    r = dict(r)
    if r["case"].endswith(" (rotated)"):  # the C++ benches before the method field
        r["case"] = r["case"][: -len(" (rotated)")]
        r["method"] = "rotated_graph"
    method = r.get("method")
    if method is None:
        method = "cold_l2" if r.get("bytes") else "host"
    r["method"] = OLD_METHODS.get(method, method)
    if r["method"] not in METHODS:
        raise ValueError(f"unknown method {r['method']!r} in {r}")
    if not r.get("shape"):
        r["shape"] = infer_shape(r)
    if r.get("copy_fraction") == 0.0 and r["impl"] != "device_copy":
        r["copy_fraction"] = None  # the older C++ records wrote 0 for "no copy measured"
    return {k: r.get(k) for k in FIELDS}


def key(r):
    return (r["case"], r["impl"], r["method"])


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, list) else data.get("records", [])


def convert(args):
    by_op = {}
    for path in args.files:
        if not os.path.exists(path):
            print(f"{path}: missing, skipped")
            continue
        for r in load(path):
            n = normalize(r)
            if n is not None:
                by_op.setdefault(n["op"], []).append(n)
    os.makedirs(args.out, exist_ok=True)
    for op, new in by_op.items():
        path = os.path.join(args.out, f"{op}.json")
        old = [] if args.replace or not os.path.exists(path) else load(path)
        merged = {key(r): r for r in old}
        for r in new:
            merged.pop(key(r), None)  # a replaced record moves to the end, in its file's order
            merged[key(r)] = r
        with open(path, "w") as f:
            f.write("[\n" + ",\n".join(" " + json.dumps(r) for r in merged.values()) + "\n]\n")
        print(f"{path}: {len(merged)} records ({len(new)} from this call)")


def short_impl(impl):
    """The table's column of an implementation: the C++ benches name the kernel's template key
    after a space ("ditops:jit bf16,row,flat,vec16,pdl"), which the table leaves out."""
    head, _, tail = impl.partition(" ")
    return head if "," in tail else impl


CURRENT_METHODS = ("rotated_graph", "cold_l2", "cold_graph")  # the current table's, first measured


def current_table(op, records):
    """One table: the torch benchmark's cases (beside eager and torch.compile) or else the C++
    benchmark's, in the first of CURRENT_METHODS they were timed with."""
    timed = [r for r in records if r["method"] != "host"]
    beside = [r for r in timed if r["case"] in {x["case"] for x in timed if x["impl"].startswith("torch_")}]
    group = beside or timed
    method = next((m for m in CURRENT_METHODS if any(r["method"] == m for r in group)), None)
    if method is None:
        return
    rows = [r for r in group if r["method"] == method]
    runs = sorted({(r["device"], r["commit"], r["date"]) for r in rows}, key=lambda x: (x[2], x[1]))
    roof = "the read roof (rNN)" if any(r["impl"] == "read_roof" for r in rows) else "a device copy of the same bytes"
    source = f"bench/{op}_torch.py" if beside else f"`ditops bench {op}`"
    print(f"\n### {op}\n")
    print(f"{source}, {method}; device run: " + "; ".join(f"{d} at {c}, {t}" for d, c, t in runs) +
          f"; roof: {roof}.\n")
    print_table(None, sorted(rows, key=lambda r: 0 if r["impl"] in ("device_copy", "read_roof") else 1))


def table(args):
    paths = [args.path] if args.path.endswith(".json") else sorted(
        os.path.join(args.path, p) for p in os.listdir(args.path) if p.endswith(".json"))
    for path in paths:
        records = [normalize(r) or r for r in load(path)]
        if not records:
            continue
        op = records[0]["op"]
        if args.op and op != args.op:
            continue
        if args.current:
            current_table(op, records)
            continue
        meta = sorted({(r["device"], r["commit"], r["date"]) for r in records})
        print(f"\n### {op}\n")
        print("Device / commit / date: " + "; ".join(f"{d} {c} {t}" for d, c, t in meta) + "\n")
        # Cases timed beside torch (bench/<op>_torch.py) and the C++ bench's cases: a table each.
        beside = {r["case"] for r in records if r["impl"].startswith("torch_")}
        for title, group in (("beside eager PyTorch and torch.compile (bench/%s_torch.py)" % op,
                              [r for r in records if r["case"] in beside]),
                             ("`ditops bench %s`" % op, [r for r in records if r["case"] not in beside])):
            for method in METHODS:
                if args.method and method != args.method:
                    continue
                rows = [r for r in group if r["method"] == method]
                if rows:
                    print_table(f"{title}, {method}", rows)


def print_table(title, rows):
    impls, cases, cell = [], [], {}
    for r in rows:
        impl = short_impl(r["impl"])
        if impl not in impls:
            impls.append(impl)
        if (r["case"], r["shape"]) not in cases:
            cases.append((r["case"], r["shape"]))
        text = f"{r['us']:.2f}"
        if r.get("read_roof_fraction") and r["impl"] != "read_roof":
            text += f" (r{100 * r['read_roof_fraction']:.0f})"
        elif r.get("copy_fraction") and r["impl"] != "device_copy":
            text += f" ({100 * r['copy_fraction']:.0f})"
        cell[(r["case"], r["shape"], impl)] = text
    if title:
        print(f"{title}: us (% of the device copy timed the same way; rNN: % of the read roof)\n")
    print("| case | shape | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for case, shape in cases:
        print(f"| {case} | {shape} | " + " | ".join(cell.get((case, shape, i), "-") for i in impls) + " |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="merge records into OUT/<op>.json")
    c.add_argument("--out", required=True)
    c.add_argument("--replace", action="store_true")
    c.add_argument("files", nargs="+")
    t = sub.add_parser("table", help="markdown tables of a records folder or file")
    t.add_argument("path")
    t.add_argument("--op")
    t.add_argument("--method", choices=METHODS)
    t.add_argument("--current", action="store_true", help="one current table per op (bench/results/README.md)")
    a = ap.parse_args()
    convert(a) if a.command == "convert" else table(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
