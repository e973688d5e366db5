"""fp8_rowwise_quant on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, byte for byte (out as uint8, out_scale as int32, so NaN rows compare too) against the
   eager chain ditops.eager.fp8_rowwise_quant_eager (torchao 0.18's rowwise recipe of
   cat([prefix, act(x)], -1), our zero-row rule):
   * act=none at the model sites and odd widths, f16, strided rows, zero rows, the scale's rounding
     points, huge and tiny rows, Inf and NaN rows;
   * act=gelu_tanh: eager's F.gelu(x, approximate="tanh") (its fma form, read from PyTorch's SASS);
   * act=swiglu (FLUX.2's F.silu(x[..., :N]) * x[..., N:]) at FLUX.2's sites, odd widths, a column
     slice of the single block's fused projection, padded rows and special rows: byte-equal or a
     MISMATCH;
   * torch.compile of the chain against eager (printed, not a failure: Inductor may round amax / 448
     differently).
2. Graph capture: a captured call replayed on new inputs.
3. Benchmark at the model shapes (FLUX.1 4608 + 512 tokens: attention output 3072, FF-down input
   gelu(12288), single block cat(3072, gelu(12288)); Wan 14B 32760 tokens at 5120 / gelu(13824); Qwen-Image
   CFG 2 x 6912 x 3072; FLUX.2 swiglu(36864) with and without the 6144 prefix): device copy of the same
   bytes, eager, torch.compile, ditops; byte model: the row read once (2 bytes a value), e4m3 written
   once and 4 bytes of scale: rows * (2 (Kp + K) + (Kp + N) + 4), N = K (K / 2 for swiglu).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

_eager = load_eager()
eager = _eager.fp8_rowwise_quant_eager


class Ditops(DitopsLib):
    def quant(self, x, prefix, out, out_scale, act="none", stream=None):
        return self.call("fp8_rowwise_quant", stream, dict(act=act, backend="jit"),
                         x=x, prefix=prefix, out=out, out_scale=out_scale)


def outputs(x, prefix, act="none"):
    rows = x.numel() // x.shape[-1]
    width = x.shape[-1] // (2 if act == "swiglu" else 1) + (prefix.shape[-1] if prefix is not None else 0)
    return (torch.empty(rows, width, device="cuda", dtype=torch.float8_e4m3fn),
            torch.empty(rows, 1, device="cuda", dtype=torch.float32))


def same(got, want):
    """Equal e4m3 bytes and equal scale bits (a NaN scale equals a NaN: its payload is unspecified)."""
    (q, s), (wq, ws) = got, want
    nan = torch.isnan(s) & torch.isnan(ws)
    return torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(
        torch.where(nan, 0, s.view(torch.int32)), torch.where(nan, 0, ws.view(torch.int32)))


def rows_like(lead, width, dtype, gen, amp=2.0, pad=0):
    """A [*lead, width] tensor of N(0, amp), rows padded by `pad` elements (their own stride)."""
    base = torch.randn(*lead, width + pad, device="cuda", generator=gen) * amp
    return base.to(dtype)[..., :width]


def bits_rows(patterns, dtype):
    """Rows of raw 16-bit patterns (a list of lists)."""
    t = torch.tensor(patterns, dtype=torch.int32, device="cuda")
    t = torch.where(t >= 0x8000, t - 0x10000, t).to(torch.int16)
    return t.view(dtype)


def special_rows(dtype):
    """Rows the recipe treats specially: zero rows (+0, -0), the scale's rounding points, the largest
    finite values, subnormals, an Inf row, a NaN row."""
    if dtype == torch.bfloat16:
        amaxes = [0x00E0, 0x00E1, 0x01A8, 0x020C, 0x3F80, 0x7F7F, 0x0001, 0x007F]
        extra = [[0x0000] * 16, [0x8000] * 16, [0x7F80, 0x3F80, 0xBF80, 0xFF80] + [0x0000] * 12,
                 [0x3F80, 0x7FC0] + [0xBF80] * 14]
    else:
        amaxes = [0x09B0, 0x0D78, 0x1516, 0x00E0, 0x00E1, 0x7BFF, 0x0001, 0x03FF]
        extra = [[0x0000] * 16, [0x8000] * 16, [0x7C00, 0x3C00, 0xBC00, 0xFC00] + [0x0000] * 12,
                 [0x3C00, 0xFE00] + [0xBC00] * 14]
    rows = [[a if j == 0 else (a - 1 if j % 2 else 0x8000 | (a >> 1)) for j in range(16)] for a in amaxes]
    return bits_rows(rows + extra, dtype)


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok = True

    def check(name, x, prefix, act):
        nonlocal ok
        want = eager(x, prefix, act)
        out = outputs(x, prefix, act)
        impl = dt.quant(x, prefix, *out, act=act)
        torch.cuda.synchronize()
        equal = same(out, want)
        ok = ok and equal
        if not equal:
            bad = (out[0].view(torch.uint8) != want[0].view(torch.uint8)).sum().item()
            bad_s = (out[1].view(torch.int32) != want[1].view(torch.int32)).sum().item()
            print(f"MISMATCH {impl} {name} act={act}: {bad} bytes, {bad_s} scales", flush=True)
        rows.append(dict(kind="verify", op="fp8_rowwise_quant", impl=impl, case=name, act=act, shape=list(x.shape),
                         prefix=list(prefix.shape) if prefix is not None else None, dtype=str(x.dtype),
                         oracle="fp8_rowwise_quant_eager", torch_equal=equal))

    sites = [("flux attn 4608x3072", (1, 4608), 3072, 0, "none"), ("flux ff-down 4608x12288", (1, 4608), 12288, 0, "gelu_tanh"),
             ("flux single 4608x(3072+12288)", (1, 4608), 12288, 3072, "gelu_tanh"),
             ("flux text 512x12288", (1, 512), 12288, 0, "gelu_tanh"), ("wan attn 32760x5120", (1, 32760), 5120, 0, "none"),
             ("wan ff-down 32760x13824", (1, 32760), 13824, 0, "gelu_tanh"), ("qwen cfg 2x6912x3072", (2, 6912), 3072, 0, "none"),
             ("qwen ff-down 2x6912x12288", (2, 6912), 12288, 0, "gelu_tanh"),
             ("flux2 single 4608x(6144+18432)", (1, 4608), 18432, 6144, "gelu_tanh"),
             ("odd 33x(3+3071)", (33,), 3071, 3, "gelu_tanh"), ("odd 7x5", (7,), 5, 0, "none"),
             ("odd 9x(16+17)", (3, 3), 17, 16, "gelu_tanh"), ("odd 5x(24+0)", (5,), 1, 24, "none"),
             ("flux2 ff 4608x swiglu 36864", (1, 4608), 36864, 0, "swiglu"),
             ("flux2 ff text 512x swiglu 36864", (1, 512), 36864, 0, "swiglu"),
             ("flux2 single 4608x(6144+swiglu 36864)", (1, 4608), 36864, 6144, "swiglu"),
             ("odd 33x(3+swiglu 6142)", (33,), 6142, 3, "swiglu"), ("odd 9x swiglu 34", (3, 3), 34, 0, "swiglu")]
    for name, lead, K, Kp, act in sites:
        for dtype in (torch.bfloat16, torch.float16) if lead[-1] <= 4608 else (torch.bfloat16,):
            x = rows_like(lead, K, dtype, gen)
            prefix = rows_like(lead, Kp, dtype, gen, 3.0) if Kp else None
            check(f"{name} {dtype}", x, prefix, act)
            if act == "gelu_tanh" and lead[-1] <= 4608:
                check(f"{name} {dtype} act=none", x, prefix, "none")
    # Rows of their own stride, huge and tiny rows.
    for pad in (8, 3):
        x = rows_like((2, 300), 3072, torch.bfloat16, gen, pad=pad)
        prefix = rows_like((2, 300), 1024, torch.bfloat16, gen, pad=2 * pad)
        check(f"padded rows +{pad}", x, prefix, "gelu_tanh")
        check(f"padded rows +{pad}", x, prefix, "none")
    for amp in (1e-30, 1e-3, 1e30):
        check(f"amplitude {amp}", rows_like((64,), 4096, torch.bfloat16, gen, amp), None, "none")
    for pad in (8, 3):
        x = rows_like((2, 300), 4096, torch.bfloat16, gen, pad=pad)
        check(f"padded rows +{pad}", x, rows_like((2, 300), 1024, torch.bfloat16, gen), "swiglu")
    # FLUX.2's single block: x = the MLP columns of the fused to_qkv_mlp_proj output (its row stride).
    proj = rows_like((1, 4608), 3 * 6144 + 36864, torch.bfloat16, gen)
    check("flux2 single, mlp columns of to_qkv_mlp_proj", proj[..., 3 * 6144:],
          rows_like((1, 4608), 6144, torch.bfloat16, gen), "swiglu")
    proj = None
    for dtype in (torch.bfloat16, torch.float16):
        x = special_rows(dtype)
        check(f"special rows {dtype}", x, None, "none")
        check(f"special rows {dtype}", x, None, "gelu_tanh")
        check(f"special rows {dtype}", x, None, "swiglu")  # gate: columns 0-7, up: 8-15
    # torch.compile of the chain against eager (information: Inductor's own rounding).
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    for act in ("none", "gelu_tanh"):
        x = rows_like((1, 4608), 12288, torch.bfloat16, gen)
        equal = same(compiled(x, None, act), eager(x, None, act))
        print(f"torch.compile of the chain equals eager (act={act}, 4608x12288): {equal}")
        rows.append(dict(kind="compile_vs_eager", op="fp8_rowwise_quant", act=act, torch_equal=equal))
    return ok


def graph_replay(dt, rows, meta):
    """A call captured on a side stream ditops has not seen, replayed on new inputs (act none: byte-equal)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    x = rows_like((1, 4608), 12288, torch.bfloat16, gen)
    prefix = rows_like((1, 4608), 3072, torch.bfloat16, gen)
    out = outputs(x, prefix)
    dt.quant(x, prefix, *out)  # resolve outside the capture
    graph = graph_on_side_stream(lambda s: dt.quant(x, prefix, *out, stream=s))
    results = {}
    for trial in range(3):
        x.copy_(rows_like((1, 4608), 12288, torch.bfloat16, gen, 1.0 + trial))
        prefix.copy_(rows_like((1, 4608), 3072, torch.bfloat16, gen))
        graph.replay()
        torch.cuda.synchronize()
        results[f"replay_{trial}_equal"] = same(out, eager(x, prefix, "none"))
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="fp8_rowwise_quant", **results))
    return all(results.values())


BENCH = [("flux attn (1,4608) 3072", (1, 4608), 3072, 0, "none"),
         ("flux ff-down (1,4608) gelu 12288", (1, 4608), 12288, 0, "gelu_tanh"),
         ("flux single (1,4608) 3072+gelu 12288", (1, 4608), 12288, 3072, "gelu_tanh"),
         ("flux text (1,512) 3072", (1, 512), 3072, 0, "none"),
         ("flux text (1,512) gelu 12288", (1, 512), 12288, 0, "gelu_tanh"),
         ("wan (1,32760) 5120", (1, 32760), 5120, 0, "none"),
         ("wan (1,32760) gelu 13824", (1, 32760), 13824, 0, "gelu_tanh"),
         ("qwen cfg (2,6912) 3072", (2, 6912), 3072, 0, "none"),
         ("qwen cfg (2,6912) gelu 12288", (2, 6912), 12288, 0, "gelu_tanh"),
         ("flux2 ff (1,4608) swiglu 36864", (1, 4608), 36864, 0, "swiglu"),
         ("flux2 single (1,4608) 6144+swiglu 36864", (1, 4608), 36864, 6144, "swiglu")]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(38)
    for name, lead, K, Kp, act in BENCH:
        if not case_selected(name):
            continue
        n_rows = 1
        for e in lead:
            n_rows *= e
        nbytes = n_rows * (2 * (K + Kp) + (K // 2 if act == "swiglu" else K) + Kp + 4)
        sets = []
        for _ in range(rotation_count(nbytes)):
            x = rows_like(lead, K, torch.bfloat16, gen)
            t = dict(x=x, prefix=rows_like(lead, Kp, torch.bfloat16, gen) if Kp else None)
            t["out"] = outputs(x, t["prefix"], act)
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]

        def ditops_fn(t, s=None):
            return dt.quant(t["x"], t["prefix"], *t["out"], act=act, stream=s)

        ditops_fn(t0)
        graph = graph_on_side_stream(lambda s: ditops_fn(t0, s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["x"], t0["prefix"], act),
                  [lambda t=t: eager(t["x"], t["prefix"], act) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["x"], t0["prefix"], act),
                  [lambda t=t: compiled(t["x"], t["prefix"], act) for t in sets]),
                 ("ditops:jit", graph.replay, [lambda t=t: ditops_fn(t) for t in sets])]
        shapes = [(*lead, K)] + ([(*lead, Kp)] if Kp else [])
        report(measure(impls), rows, meta, "fp8_rowwise_quant", name, shape_str(*shapes), nbytes, 38)
        sets = t0 = graph = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
