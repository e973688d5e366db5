"""The op test driver's cases (tests/cases/, exported as JSON by export_op_cases, whose path
DITOPS_EXPORT_OP_CASES names) as torch tensors, for the Python tests."""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the cases are built as torch tensors)")

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f8e4m3fn": torch.float8_e4m3fn,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}


def cases():
    exporter = os.environ.get("DITOPS_EXPORT_OP_CASES")
    if not exporter or not os.path.exists(exporter):
        return []
    return json.loads(subprocess.run([exporter], check=True, capture_output=True, text=True).stdout)


def _option(case, name, default):
    return case["options"].get(name, default)


def _patterns(patterns, n, dtype, device):
    """Raw element patterns (the low bytes of each) as `dtype`, cycled over n elements."""
    bits = 8 * dtype.itemsize
    signed = [p - (1 << bits) if p >= 1 << (bits - 1) else p for p in (int(p) & ((1 << bits) - 1) for p in patterns)]
    raw = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    pattern = torch.tensor(signed, dtype=raw, device=device).view(dtype)
    return pattern.repeat((n + len(signed) - 1) // len(signed))[:n] if n else pattern[:0]


def has_special_values(case):
    """Whether a tensor of the case holds raw patterns (special values: NaN, +-Inf, subnormals)."""
    return any(t["fill"]["kind"] in ("special", "bits") for t in case["tensors"])


def _fill(t, n, gen, device):
    f, dtype = t["fill"], DTYPES[t["dtype"]]
    kind = f["kind"]
    if kind == "bits":
        return _patterns(f["patterns"], n, dtype, device)
    if kind == "special":  # every modulo-th element a special value, the others normal
        v = (f["scale"] * torch.randn(n, device=device, generator=gen, dtype=torch.float64)).to(dtype)
        every = max(f["modulo"], 1)
        count = (n + every - 1) // every
        v[::every] = _patterns(f["patterns"], count, dtype, device)
        return v
    if kind == "index":
        return ((torch.arange(n, device=device) * 7 + 3) % f["modulo"]).to(dtype)
    if kind == "wave":
        return torch.sin(0.37 * torch.arange(n, device=device, dtype=torch.float64)).to(dtype)
    if kind == "constant":
        return torch.full((n,), f["scale"], device=device, dtype=torch.float64).to(dtype)
    if kind == "sentinel":
        return torch.full((n * dtype.itemsize,), 0xA5, device=device, dtype=torch.uint8).view(dtype)
    r = torch.randn(n, device=device, generator=gen, dtype=torch.float64)
    v = f["offset"] + f["scale"] * r.abs() if kind == "positive" else f["scale"] * (r + f["offset"])
    return v.to(dtype)


def tensors(case, seed, device):
    """The case's tensors on `device`: one flat buffer per owner, views by (shape, strides, offset)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    spans = {}
    for t in case["tensors"]:
        owner = t["storage"] or t["name"]
        last = t["offset"] + sum((e - 1) * s for e, s in zip(t["shape"], t["strides"])) if all(t["shape"]) else -1
        spans[owner] = max(spans.get(owner, 0), last + 1)
    by_name = {t["name"]: t for t in case["tensors"]}
    flat = {owner: _fill(by_name[owner], n, gen, device) for owner, n in spans.items()}
    out = {}
    for t in case["tensors"]:
        base = flat[t["storage"] or t["name"]]
        out[t["name"]] = base.as_strided(t["shape"], t["strides"], t["offset"]) if base.numel() else \
            torch.empty(t["shape"], dtype=DTYPES[t["dtype"]], device=device)
    return out


def options_and_absent(case, table):
    """The case's options as the op's Python function takes them (the table's text parsed by
    kind), and None for each optional input the case leaves out (`table`: the op's entry of
    ditops.op_table())."""
    kinds = {o["name"]: o["kind"] for o in table["options"]}
    convert = {"bool": lambda v: v == "true", "int": int, "float": float,
               "optional_bool": lambda v: None if v == "none" else v == "true"}
    options = {k: convert.get(kinds[k], str)(v) for k, v in case["options"].items()}
    present = {t["name"] for t in case["tensors"]}
    absent = {t["name"]: None for t in table["tensors"]
              if t["optional"] and t["role"] == "in" and t["name"] not in present}
    return options, absent
