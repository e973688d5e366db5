"""The op test driver's cases against the eager PyTorch chain, on CUDA only: every case the C++
driver runs (exported as JSON by the export_op_cases executable, DITOPS_EXPORT_OP_CASES), laid
out the same way (strides, shared buffers, offsets), run through every implementation of the op
that explain finds eligible, and compared with torch.equal against the chain that the
implementation's bit_exact contract names. The chains are ditops.eager's (the benchmarks' too).
Cases whose numerics have no eager chain (fp32 rounding, SGLang orders, quantized NVFP4 outputs)
are left to the C++ driver, which compares them with the CPU reference."""
import json
import os
import subprocess

import pytest

from conftest import cuda_or_skip

torch = cuda_or_skip()

import ditops  # noqa: E402
from ditops import eager  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f8e4m3fn": torch.float8_e4m3fn,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}


def _cases():
    exporter = os.environ.get("DITOPS_EXPORT_OP_CASES")
    if not exporter or not os.path.exists(exporter):
        return []
    return json.loads(subprocess.run([exporter], check=True, capture_output=True, text=True).stdout)


def _option(case, name, default):
    return case["options"].get(name, default)


def _fill(t, n, gen):
    f, dtype = t["fill"], DTYPES[t["dtype"]]
    kind = f["kind"]
    if kind == "index":
        return ((torch.arange(n, device="cuda") * 7 + 3) % f["modulo"]).to(dtype)
    if kind == "wave":
        return torch.sin(0.37 * torch.arange(n, device="cuda", dtype=torch.float64)).to(dtype)
    if kind == "constant":
        return torch.full((n,), f["scale"], device="cuda", dtype=torch.float64).to(dtype)
    if kind == "sentinel":
        return torch.full((n * dtype.itemsize,), 0xA5, device="cuda", dtype=torch.uint8).view(dtype)
    r = torch.randn(n, device="cuda", generator=gen, dtype=torch.float64)
    v = f["offset"] + f["scale"] * r.abs() if kind == "positive" else f["scale"] * (r + f["offset"])
    return v.to(dtype)


def _tensors(case, seed):
    """The case's tensors on CUDA: one flat buffer per owner, views by (shape, strides, offset)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    spans = {}
    for t in case["tensors"]:
        owner = t["storage"] or t["name"]
        last = t["offset"] + sum((e - 1) * s for e, s in zip(t["shape"], t["strides"])) if all(t["shape"]) else -1
        spans[owner] = max(spans.get(owner, 0), last + 1)
    by_name = {t["name"]: t for t in case["tensors"]}
    flat = {owner: _fill(by_name[owner], n, gen) for owner, n in spans.items()}
    out = {}
    for t in case["tensors"]:
        base = flat[t["storage"] or t["name"]]
        out[t["name"]] = base.as_strided(t["shape"], t["strides"], t["offset"]) if base.numel() else \
            torch.empty(t["shape"], dtype=DTYPES[t["dtype"]], device="cuda")
    return out


def _eager(case, x):
    """The written tensors the eager chain gives, or None when no chain is the oracle here."""
    op, o = case["op"], case["options"]
    eps = float(o.get("eps", "1e-6"))
    if op == "qknorm_rope":
        if o.get("rounding", "rounded") != "rounded" or o.get("norm_order", "aten") != "aten":
            return None
        q, k = eager.qknorm_rope_eager(x["q"], x["k"], x["q_weight"], x["k_weight"], x["cos_sin_cache"],
                                       x["positions"], int(o["rope_dim"]), o["is_neox"] == "true", eps,
                                       o.get("cache_full_width") == "true")
        return {"q": q, "k": k}
    if op == "residual_gate_add":
        return {"out": eager.residual_gate_add_eager(x["residual"], x["update"], x["gate"])}
    if op in ("layernorm_modulate", "layernorm_modulate_fp8"):
        y = eager.layernorm_modulate_eager(x["x"], x["scale"], x.get("shift"), eps)
        if op == "layernorm_modulate_fp8":
            if o.get("fp8_reciprocal", "ieee") != "ieee":
                return None
            y = eager.static_quant_fp8_eager(y, x["input_scale"])
        return {"out": y}
    if op == "qk_head_layernorm":
        q, k = eager.qk_head_layernorm_eager(x["q"], x["k"], eps)
        return {"q_out": q, "k_out": k}
    if op == "norm_scale_shift":
        if o.get("numerics", "eager") != "eager" or "input_scale" in x or "global_scale" in x:
            return None
        y, v = eager.norm_scale_shift_eager(x["x"], x["scale"], x.get("shift"), norm=o.get("norm", "layer"),
                                            eps=eps, weight=x.get("weight"), bias=x.get("bias"),
                                            residual=x.get("residual"), gate=x.get("gate"))
        return {"y": y, "residual_out": v} if "residual" in x else {"y": y}
    return None


CASES = [c for c in _cases() if not c["invalid"] and c["kind"] != "empty"]


@pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")
@pytest.mark.parametrize("case", CASES, ids=[f"{c['op']}/{c['name']}" for c in CASES])
def test_every_eligible_implementation_equals_the_eager_chain(case):
    inputs = _tensors(case, case["seed"])
    want = _eager(case, {k: v.clone() for k, v in inputs.items()})
    if want is None:
        pytest.skip("no eager chain is this case's oracle (the C++ driver compares it with the reference)")
    fn = getattr(ditops, case["op"])
    options = {k: (v == "true" if v in ("true", "false") else v) for k, v in case["options"].items()}
    for name in ("eps",):
        if name in options:
            options[name] = float(options[name])
    if "rope_dim" in options:
        options["rope_dim"] = int(options["rope_dim"])
    ran = 0
    for kernel in ditops.list_kernels(case["op"]):
        if kernel["provenance"] == "reference" or kernel["contract"] != "bit_exact" or "eager" not in kernel["oracle"]:
            continue
        x = _tensors(case, case["seed"])
        report = ditops.explain(case["op"], **x, **options, backend=kernel["provenance"], quality="extra-high")
        if report.chosen != kernel["name"]:
            continue  # ineligible here (the C++ driver counts the reasons)
        impl = fn(**x, **options, backend=kernel["provenance"], quality="extra-high")
        torch.cuda.synchronize()
        for tensor, expected in want.items():
            got = x[tensor]
            assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                               expected.view(torch.uint8) if expected.dtype == torch.float8_e4m3fn else expected), \
                f"{kernel['name']} ({impl}) {tensor} differs from the eager chain"
        ran += 1
    if ran == 0:
        pytest.skip("no implementation with an eager-chain contract is eligible for this case here")
