#!/usr/bin/env python3
"""The docs' status tables, generated from the registry and the committed records (never typed).

  PYTHONPATH=build/python python3 bench/status.py            # print every block
  PYTHONPATH=build/python python3 bench/status.py --write    # rewrite the blocks in README.md and docs/
  PYTHONPATH=build/python python3 bench/status.py --check    # fail where a committed block differs
                                                             # (ctest docs_status)

A block is the text between the lines `<!-- status:NAME:begin ... -->` and `<!-- status:NAME:end -->`
of README.md or a docs/**/*.md file. The blocks (BLOCKS):

  ops            every implementation the registry lists (ditops.list_kernels(): this build's ops,
                 whatever they are): its contract, the registry's verification text
                 (Contract::verification) and the records under RECORDS that name it: check records
                 (checks/*.json: torch.equal or a bound per case) and timing records (<op>.json)
  quality        the close implementations with their admission record, and the implementations
                 whose contract says unverified
  sites          per diffusers model class and site: the op this build maps there
                 (ditops.diffusers.plan of a tiny model of the class, on the CPU) and what the newest
                 model bench record with that site's report shows (RECORDS/models/*.json)
  models         the model bench records (RECORDS/models/*.json): ms per forward per variant
  checked-cases  the distinct checked cases per op (tests/checked_cases.py)

Inputs: the ditops Python module (ops, quality, sites); PyTorch and diffusers in the tested range
(sites); export_op_cases (checked-cases: --export-op-cases, else $DITOPS_EXPORT_OP_CASES, else
build/tests/export_op_cases). Where an input is missing the block is left as it is and named;
--check then exits 77 (ctest: skipped) if every block it could make matched, 1 if one differed.
"""
import argparse
import contextlib
import difflib
import glob
import io
import json
import os
import re
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "bench", "results", "h200")
UPDATE = "PYTHONPATH=build/python python3 bench/status.py --write"
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this script
MARKER = re.compile(r"^<!-- status:([a-z-]+):begin[^\n]*-->\n(.*?)^<!-- status:\1:end -->$", re.M | re.S)
METHODS = ("rotated_graph", "cold_l2", "cold_graph", "host")


class Unavailable(Exception):
    """A block's input is missing on this machine (the message says which)."""


def cell(text):
    """Text for a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def number(x):
    return f"{x:g}" if isinstance(x, (int, float)) else "?"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def load_list(path):
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, list) else data.get("records", [])


def rel(path):
    return os.path.relpath(path, ROOT)


def ditops_module():
    try:
        import ditops
    except ImportError as e:
        raise Unavailable(f"the ditops Python module does not import ({e}); build it and put build/python "
                          "on PYTHONPATH")
    return ditops


def runs_text(records):
    """'b3fce58' or 'ee9c29e, 64c434f': the commits of the records, oldest first."""
    runs = sorted({(str(r.get("date", ""))[:10], r.get("commit", "?")) for r in records})
    commits = []
    for _, c in runs:
        if c not in commits:
            commits.append(c)
    return ", ".join(commits)


# ---------------------------------------------------------------- ops and quality


def implementation_of(op, impl, names):
    """The registered implementation a timing record's impl names, or None (device_copy, torch_*):
    "fp8_linear.skinny_mma" as is; "ditops:<provenance>[:<variant>][ <template key>]" as
    <op>.<provenance>_<variant> where that is registered, else <op>.<provenance>."""
    head = impl.split(" ")[0]
    if head in names:
        return head
    if not head.startswith("ditops:"):
        return None
    parts = head.split(":")[1:]
    base = f"{op}.{parts[0]}"
    if len(parts) > 1 and f"{base}_{parts[1]}" in names:
        return f"{base}_{parts[1]}"
    return base if base in names else None


def check_summary(records):
    """What the check records of one implementation show: torch.equal a/b, within the bound a/b."""
    equal = sum(1 for r in records if r.get("torch_equal") is True)
    differ = [r for r in records if r.get("torch_equal") is False]
    within = sum(1 for r in records if r.get("beyond_bound") == 0)
    beyond = sum(1 for r in records if isinstance(r.get("beyond_bound"), int) and r["beyond_bound"] > 0)
    calls = [r for r in records if "torch_equal_calls" in r]
    counted = {id(r) for r in records if "torch_equal" in r or "beyond_bound" in r} | {id(r) for r in calls}
    other = sum(1 for r in records if id(r) not in counted)
    parts = []
    if equal or differ:
        text = f"torch.equal {equal}/{equal + len(differ)}"
        largest = [r.get("max_abs", r.get("max_abs_diff")) for r in differ]
        largest = [x for x in largest if isinstance(x, (int, float))]
        if largest:
            text += f" (max |d| {max(largest):g})"
        parts.append(text)
    if within or beyond:
        parts.append(f"within the bound {within}/{within + beyond}")
    for r in calls:
        parts.append(f"{r['torch_equal_calls']}/{r['torch_equal_calls'] + r.get('differing_calls', 0)} calls "
                     "torch.equal")
    if other:
        parts.append(f"{other} without a verdict field")
    return "; ".join(parts) + f" at {runs_text(records)}"


def timing_summary(records):
    cases = {r["case"] for r in records}
    methods = [m for m in METHODS if any(r.get("method") == m for r in records)]
    n = len(cases)
    return f"{n} case{'s' if n != 1 else ''} ({', '.join(methods)}) at {runs_text(records)}"


def records_by_implementation(names_by_op, records_dir):
    """({implementation: check records}, {implementation: timing records}) under records_dir."""
    names = {n for ns in names_by_op.values() for n in ns}
    checks, timings = {}, {}
    for path in sorted(glob.glob(os.path.join(records_dir, "checks", "*.json"))):
        for r in load_list(path):
            if isinstance(r, dict) and r.get("kind") == "verify" and r.get("impl") in names:
                checks.setdefault(r["impl"], []).append(r)
    for path in sorted(glob.glob(os.path.join(records_dir, "*.json"))):
        for r in load_list(path):
            if not isinstance(r, dict) or "us" not in r or "op" not in r:
                continue
            impl = implementation_of(r["op"], r.get("impl", ""), names)
            if impl is not None:
                timings.setdefault(impl, []).append(r)
    return checks, timings


def block_ops(records_dir):
    ditops = ditops_module()
    kernels = ditops.list_kernels()
    by_op = {}
    for k in kernels:
        by_op.setdefault(k["op"], []).append(k["name"])
    checks, timings = records_by_implementation(by_op, records_dir)
    where = rel(records_dir)
    rows = []
    for k in kernels:
        first = by_op[k["op"]][0] == k["name"]
        rows.append([f"`{k['op']}`" if first else "", f"`{k['name']}`", k["contract"], k["verification"],
                     check_summary(checks[k["name"]]) if k["name"] in checks else "-",
                     timing_summary(timings[k["name"]]) if k["name"] in timings else "-"])
    record_ops = sorted({os.path.basename(p)[:-5] for p in glob.glob(os.path.join(records_dir, "*.json"))} -
                        set(by_op))
    text = table(["op", "implementation", "contract", "verification (the registry's)",
                  f"check records ({where}/checks/)", f"timing records ({where}/<op>.json)"], rows)
    if record_ops:
        text += ("\nTiming records of ops this build does not register: " +
                 ", ".join(f"`{where}/{op}.json`" for op in record_ops) + ".\n")
    return text


def block_quality(records_dir):
    ditops = ditops_module()
    kernels = ditops.list_kernels()
    close = [k for k in kernels if k["contract"] == "close"]
    unverified = [k for k in kernels if k["verification"].startswith("unverified")]
    lines = ["Close implementations, each with its admission to `lossless` (none: it runs at quality "
             "`high` or with an explicit backend):", ""]
    lines += [f"- `{k['name']}`: " + (k["admission"] or "no admission record") for k in close]
    lines += ["", "Implementations whose contract is unverified on a device:", ""]
    lines += [f"- `{k['name']}`: {k['verification'][len('unverified: '):]}" for k in unverified] or ["- none"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- diffusers sites and model records


def tiny_models(diffusers):
    """One tiny model per supported class, as tests/python/test_diffusers.py builds them (the
    configs only: plan reads module classes and options, not weights), cast as from_pretrained."""
    head = 64  # qknorm_rope's smallest head dim
    yield diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=head,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(8, 28, 28))
    yield diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=head,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(8, 28, 28))
    yield diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=head, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32, cross_attn_norm=True)
    yield diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=head, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(8, 28, 28), guidance_embeds=True)
    yield diffusers.LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128, cross_attention_dim=256,
        audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=64,
        audio_cross_attention_dim=128, num_layers=2, caption_channels=32, rope_type="split")
    yield diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=head, num_attention_heads=2,
        joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(16, 16, 16, 16))


def planned_sites():
    """[(model class, [site])]: ditops.diffusers.plan of each tiny model."""
    ditops_module()
    try:
        import torch
        import diffusers
    except ImportError as e:
        raise Unavailable(f"PyTorch or diffusers does not import ({e})")
    import ditops.diffusers as dd
    from ditops.diffusers.bench import cast_like_from_pretrained
    if not (dd._TESTED_LOW <= dd._version_tuple(diffusers.__version__) < dd._TESTED_HIGH):
        raise Unavailable(f"diffusers {diffusers.__version__} is outside ditops.diffusers' range {dd.TESTED_DIFFUSERS}")
    diffusers.utils.logging.set_verbosity_error()
    out = []
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for model in tiny_models(diffusers):
            model = cast_like_from_pretrained(model, torch.bfloat16)
            out.append((type(model).__name__, dd.plan(model).sites))
    order = list(dd.SUPPORTED_MODELS)
    missing = [m for m in order if m not in {name for name, _ in out}]
    if missing:  # a class added to SUPPORTED_MODELS needs its tiny model above
        raise SystemExit(f"bench/status.py: no tiny model for {', '.join(missing)} (add one to tiny_models)")
    return sorted(out, key=lambda x: order.index(x[0]))


def model_records(records_dir):
    """{model class: [record]} of RECORDS/models/*.json, oldest first."""
    out = {}
    for path in sorted(glob.glob(os.path.join(records_dir, "models", "*.json"))):
        for r in load_list(path):
            if isinstance(r, dict) and r.get("model"):
                r = dict(r, _file=rel(path))
                out.setdefault(r["model"], []).append(r)
    for rs in out.values():
        rs.sort(key=lambda r: (str(r.get("date", "")), r.get("impl", "")))
    return out


def site_record(records, site_name):
    """The newest eager record (not torch.compile's: it changes the numbers) in which the site made
    fused calls, else the newest whose report has it (a site whose places another site took over,
    e.g. under FP8, reports no calls)."""
    newest = ran = None
    for r in records:
        if "compile" in r.get("impl", "") or not r.get("report"):
            continue
        for s in r["report"].get("sites", []):
            if s.get("site") == site_name:
                newest = (r, s)
                if s.get("fused_calls"):
                    ran = (r, s)
    return ran or newest


def record_text(r, s):
    base = r["impl"].replace("+ditops", "")
    out = r.get("output") or {}
    if out.get("torch_equal") is True:
        verdict = f"output torch.equal to {base}"
    elif out:
        verdict = f"output differs from {base} (max |d| {number(out.get('max_abs_diff'))})"
    else:
        verdict = "output not compared"
    if not s.get("op"):
        ran = "the model's code"
    else:
        impls = sorted(set(s.get("implementations", {}).values()))
        ran = (f"{s.get('verified', 0)} signature(s) verified, {len(s.get('disabled', {}))} disabled, "
               f"{len(s.get('unfit', {}))} unfit; ran {', '.join(impls) or 'nothing'}; "
               f"{s.get('fused_calls', 0)} fused / {s.get('model_calls', 0)} model calls")
    return f"{r['impl']} at {r.get('commit', '?')} ({os.path.basename(r['_file'])}): {ran}; {verdict}"


def block_sites(records_dir):
    records = model_records(records_dir)
    rows = []
    for model, sites in planned_sites():
        for i, s in enumerate(sites):
            if s.op:
                here = f"`{s.op}`" + (" (" + ", ".join(f"{k}={v}" for k, v in s.options.items()) + ")"
                                      if s.options else "")
                if s.note:
                    here += f"; note: {s.note}"
            else:
                here = f"the model's code: {s.why}"
            found = site_record(records.get(model, []), s.name)
            rows.append([f"`{model}`" if i == 0 else "", f"`{s.name}`", here,
                         record_text(*found) if found else "no model bench record"])
    return table(["model", "site (report row)", "this build (plan of a tiny model)",
                  f"newest model bench record with the site ({rel(records_dir)}/models/)"], rows)


VARIANTS = ("eager", "eager+ditops", "compile", "compile+ditops", "eager+graph", "eager+ditops+graph")


def block_models(records_dir):
    files = sorted(glob.glob(os.path.join(records_dir, "models", "*.json")))
    per_file = []
    for path in files:
        with open(path) as f:
            data = json.load(f)
        rs = data if isinstance(data, list) else data.get("records", [])
        if rs:
            per_file.append((path, rs, {} if isinstance(data, list) else data.get("speedups", {})))
    variants = [v for v in VARIANTS if any(r.get("impl") == v for _, rs, _ in per_file for r in rs)]
    variants += sorted({r.get("impl") for _, rs, _ in per_file for r in rs} - set(variants))
    rows = []
    for path, rs, speedups in per_file:
        first = rs[0]
        shape = f"{first.get('blocks')} blocks, {first.get('shape')}, batch {first.get('batch')}"
        cells = []
        for v in variants:
            got = [r for r in rs if r.get("impl") == v]
            if not got:
                cells.append("")
                continue
            r = got[-1]
            text = f"{r['us'] / 1000:.2f}"
            out = r.get("output") or {}
            if out and out.get("torch_equal") is False:
                text += f" (not torch.equal: max |d| {number(out.get('max_abs_diff'))})"
            cells.append(text)
        ups = ", ".join(f"{k} {v:.3f}x" for k, v in speedups.items())
        device = sorted({str(r.get("device", "")) for r in rs})
        rows.append([f"{first.get('model')} (`{os.path.basename(path)}`)", shape] + cells +
                     [ups, f"{', '.join(device)} at {runs_text(rs)}"])
    return table(["model (record file)", "shape"] + variants + ["speed-ups (the bench's)", "run"], rows)


def block_checked_cases(exporter):
    if not exporter or not os.path.exists(exporter):
        raise Unavailable(f"export_op_cases not found ({exporter or 'no path'}): build it "
                          "(cmake --build build --target export_op_cases) or pass --export-op-cases")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checked_cases.py"), exporter],
                         capture_output=True, text=True)
    rows, inside = [], False
    for line in run.stdout.splitlines():
        fields = line.split()
        if fields[:2] == ["op", "driver"]:
            inside = True
            continue
        if inside and len(fields) == 6:
            op, driver, cpu, bespoke, total, _before = fields
            rows.append([f"**{op}**" if op == "all" else op, driver, cpu, bespoke, total])
            if op == "all":
                break
    if not rows:
        raise SystemExit(f"bench/status.py: tests/checked_cases.py printed no table:\n{run.stdout}{run.stderr}")
    text = table(["op", "driver", "(no GPU)", "bespoke", "total"], rows)
    return text.replace("|---|---|---|---|---|", "|---|---:|---:|---:|---:|")


# ---------------------------------------------------------------- the files


def doc_files(root):
    files = [p for p in [os.path.join(root, "README.md")] if os.path.exists(p)]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return files


def make_blocks(args):
    makers = {"ops": lambda: block_ops(args.records), "quality": lambda: block_quality(args.records),
              "sites": lambda: block_sites(args.records), "models": lambda: block_models(args.records),
              "checked-cases": lambda: block_checked_cases(args.export_op_cases)}
    made, missing = {}, {}
    for name, make in makers.items():
        if args.only and name not in args.only:
            continue
        try:
            made[name] = make()
        except Unavailable as e:
            missing[name] = str(e)
    return list(makers), made, missing


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the blocks in README.md and docs/")
    mode.add_argument("--check", action="store_true", help="exit 1 where a committed block differs")
    ap.add_argument("--records", default=RECORDS, help="the records folder (default bench/results/h200)")
    ap.add_argument("--export-op-cases", default=os.environ.get("DITOPS_EXPORT_OP_CASES") or
                    os.path.join(ROOT, "build", "tests", "export_op_cases"))
    ap.add_argument("--only", type=lambda t: t.split(","), default=None, help="these blocks only (a,b,...)")
    ap.add_argument("--root", default=ROOT, help="the tree whose README.md and docs/ hold the blocks")
    args = ap.parse_args()
    names, made, missing = make_blocks(args)
    wanted = [n for n in names if not args.only or n in args.only]
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        ap.error(f"unknown blocks {', '.join(unknown)} (known: {', '.join(names)})")
    for name, why in missing.items():
        print(f"bench/status.py: block '{name}' not made here: {why}", file=sys.stderr)
    if not (args.write or args.check):
        for name in names:
            if name in made:
                print(f"<!-- status:{name} -->\n{made[name]}")
        return 0

    problems, seen = [], set()
    for path in doc_files(args.root):
        with open(path) as f:
            text = f.read()
        found = list(MARKER.finditer(text))
        for m in found:
            if m.group(1) not in names:
                problems.append(f"{rel(path)}: unknown block '{m.group(1)}' (known: {', '.join(names)})")
        seen |= {m.group(1) for m in found}

        def replace(m):
            name = m.group(1)
            if name not in made:
                return m.group(0)
            head = m.group(0).split("\n", 1)[0]
            return f"{head}\n{made[name]}<!-- status:{name}:end -->"

        new = MARKER.sub(replace, text)
        if new == text:
            continue
        if args.write:
            with open(path, "w") as f:
                f.write(new)
            print(f"{rel(path)}: updated")
            continue
        for m_old, m_new in zip(MARKER.finditer(text), MARKER.finditer(new)):
            if m_old.group(0) != m_new.group(0):
                diff = difflib.unified_diff(m_old.group(2).splitlines(), m_new.group(2).splitlines(),
                                            f"{rel(path)} (committed)", "generated", lineterm="", n=0)
                print("\n".join(list(diff)[:60]))
                problems.append(f"{rel(path)}: the block '{m_old.group(1)}' is not what bench/status.py generates "
                                "from this build and the records")
    problems += [f"no file of README.md and docs/ has the block '{n}'" for n in wanted if n not in seen]
    for p in problems:
        print("FAIL:", p)
    if problems and args.check:
        print(f"Update the blocks with `{UPDATE}` (after building ditops_python and export_op_cases) and commit "
              "the result.")
        return 1
    if args.check and missing:
        print(f"skipped: blocks {', '.join(missing)} could not be made here; the others match")
        return SKIPPED
    if args.check:
        print(f"every generated block matches ({', '.join(wanted)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
