"""norm_scale_shift on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. Verification (numerics=eager): torch.equal of y, residual_out and the fp8 bytes against the
   eager PyTorch chain on CUDA over a grid: odd shapes, bf16/fp16/fp32, LayerNorm and RMSNorm,
   affine none/weight/weight+bias, every broadcast class of scale/shift/gate, residual on/off,
   amplitudes 1e-4..100, eps 1e-6/1e-5, signed zeros and the special scales -1/0/1, shift absent.
   The fp8 oracle is SGLang's static quant of the eager y: inv = 1.0/input_scale as Triton computes
   it (div.full.f32), then (y.float() * inv).clamp(+-448).to(float8_e4m3fn).
   numerics=float32 (Wan's FP32LayerNorm chains: bf16/f16 x, f32 operands as chunks of [B, 6, D]
   or [B, S, 6, D]): torch.equal of y and residual_out against eager.norm_scale_shift_float32_eager
   for norm1/norm3, norm2 behind the gated residual, norm3 behind the cross-attention residual and
   norm2 alone, at Wan's shapes too.
   norm_order=aten_mean (LTX-2's blocks: diffusers' RMSNorm without a weight, then the modulation
   in the activation dtype): torch.equal of y against eager.norm_scale_shift_eager(norm="rms",
   norm_order="aten_mean") at LTX-2's video and audio shapes, row counts below 16 (aten's wider
   reduction), scale / shift per batch and per token as chunks of [B, S, n, D], fp16, fp32 x,
   behind a gated residual.
   fp8_rowwise (issue 43: the per-token dynamic e4m3 of y, Wan's and LTX-2's FP8 producer): the e4m3
   bytes and fp32 scales (a NaN scale equal to a NaN), y and residual_out where written, torch.equal
   against eager.norm_scale_shift_fp8_rowwise_eager (the numerics' chain, then fp8_rowwise_eager):
   Wan's float32 norm1 / norm3 at 14B and 1.3B (32760 tokens, batch 2, TI2V per token), behind the
   cross-attention and the gated residual, LTX-2's mean order (video 6144 x 4096, audio, rows below
   16, behind a gated residual), the eager LayerNorm / RMSNorm rows, f16, with and without y, zero
   rows; torch.compile's chain against eager (printed); a captured call replayed on new inputs.
2. Benchmark: device copy, ditops (jit; eager and sglang numerics), eager and torch.compile on the
   model shapes, each timed cold (triton.testing.do_bench; ditops as a one-kernel CUDA graph, the
   ctypes call costs tens of us of host time), rotated (buffer sets over 3x the L2 captured
   round after round in one CUDA graph) and cold with every implementation alone in a CUDA graph
   ("cold_graph"), medians; GB/s by the byte model and the fraction of a
   device copy timed the same way. JSON records in the bench/results format.

Calls ditops through its C ABI (include/ditops/c_api.h) with ctypes, so it needs only libditops.so.
"""
import ctypes
import itertools
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, copy_buffers, copy_impl, dltensor, graph_on_side_stream as graph_of,
                                case_selected, load_eager, measure, report, report_header, rotation_count, script_main,
                                shape_str)
import triton
import triton.language as tl


class Ditops(DitopsLib):
    def run(self, *, norm="layer", eps=1e-6, numerics="eager", fp8_reciprocal="div_full", norm_order="aten",
            stream=None, **tensors):
        return self.call("norm_scale_shift", stream, dict(norm=norm, eps=eps, numerics=numerics,
                                                          fp8_reciprocal=fp8_reciprocal, norm_order=norm_order,
                                                          backend="jit"), **tensors)


# ---------------------------------------------------------------- the oracles


@triton.jit
def _reciprocal_kernel(s_ptr, o_ptr):
    tl.store(o_ptr, 1.0 / tl.load(s_ptr))  # Triton lowers this division to div.full.f32


def inv_div_full(input_scale):
    out = torch.empty_like(input_scale)
    _reciprocal_kernel[(1,)](input_scale, out)
    return out


# One copy of the eager chains, in the Python package; loaded by path so this script needs no
# compiled ditops module (only libditops through ctypes).
_eager = load_eager()
bcast, eager_chain = _eager.nss_broadcast, _eager.norm_scale_shift_eager
float32_chain = _eager.norm_scale_shift_float32_eager  # numerics="float32" (Wan)


def static_quant(y, input_scale):
    inv = inv_div_full(input_scale)
    return (y.float() * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


# ---------------------------------------------------------------- verification


def operand(cls, B, S, D, dtype, gen, chunk_of=None):
    dev = "cuda"
    if cls == "scalar":
        return torch.randn((), device=dev, generator=gen).to(dtype) * 0.3
    if cls == "D":
        return (torch.randn(D, device=dev, generator=gen) * 0.3).to(dtype)
    if cls == "BD_chunk":  # a chunk of an adaLN projection [B, 6 D]: row stride 6 D
        return (torch.randn(B, 6 * D, device=dev, generator=gen) * 0.3).to(dtype)[:, 2 * D: 3 * D]
    if cls == "B1D":
        return (torch.randn(B, 1, D, device=dev, generator=gen) * 0.3).to(dtype)
    if cls == "BSD":
        return (torch.randn(B, S, D, device=dev, generator=gen) * 0.3).to(dtype)
    if cls == "1SD":
        return (torch.randn(1, S, D, device=dev, generator=gen) * 0.3).to(dtype)
    if cls == "BF1D":
        Fr = 3 if S % 3 == 0 else 1
        return (torch.randn(B, Fr, 1, D, device=dev, generator=gen) * 0.3).to(dtype)
    raise ValueError(cls)


CLASSES = ["scalar", "D", "BD_chunk", "B1D", "BSD", "1SD", "BF1D"]


def verify(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    shapes = [(1, 1, 64), (2, 9, 2240), (1, 257, 3072), (3, 33, 1024), (1, 1031, 3072), (2, 15, 5120)]
    grid = []
    for i, ((B, S, D), norm, residual, fp8) in enumerate(itertools.product(shapes, ("layer", "rms"), (False, True),
                                                                         (False, True))):
        grid.append(dict(B=B, S=S, D=D, dtype=torch.bfloat16, norm=norm, residual=residual, fp8=fp8,
                         affine=i % (3 if norm == "layer" else 2), amp=(1e-4, 1.0, 100.0)[i % 3],
                         eps=(1e-6, 1e-5)[(i // 3) % 2], scale_cls=CLASSES[i % 7], shift_cls=CLASSES[(i + 3) % 7],
                         gate_cls=CLASSES[(i + 5) % 7], no_shift=(i % 11 == 0)))
    for dtype, affine in itertools.product((torch.float16, torch.float32), (0, 1, 2)):
        grid.append(dict(B=2, S=17, D=1024, dtype=dtype, norm="layer", residual=True, fp8=False, affine=affine,
                         amp=1.0, eps=1e-5, scale_cls="B1D", shift_cls="BSD", gate_cls="BF1D", no_shift=False))
    summary = dict(cases=0, equal=0)
    for c in grid:
        B, S, D, dtype = c["B"], c["S"], c["D"], c["dtype"]
        x = (torch.randn(B, S, D, device="cuda", generator=gen) * c["amp"] + 0.25 * c["amp"]).to(dtype)
        x.view(-1)[::97] = 0.0
        x.view(-1)[1::194] = -0.0
        scale = operand(c["scale_cls"], B, S, D, dtype, gen)
        if scale.is_contiguous() and scale.numel() >= 3:  # the special modulation values
            scale.view(-1)[:3] = torch.tensor([-1.0, 0.0, 1.0], dtype=dtype, device="cuda")
        shift = None if c["no_shift"] else operand(c["shift_cls"], B, S, D, dtype, gen)
        weight = (torch.randn(D, device="cuda", generator=gen) * 0.2 + 1).to(dtype) if c["affine"] >= 1 else None
        bias = (torch.randn(D, device="cuda", generator=gen) * 0.1).to(dtype) if c["affine"] == 2 else None
        residual = (torch.randn(B, S, D, device="cuda", generator=gen) * c["amp"]).to(dtype) if c["residual"] else None
        gate = operand(c["gate_cls"], B, S, D, dtype, gen) if c["residual"] else None
        ref_y, ref_v = eager_chain(x, scale, shift, norm=c["norm"], eps=c["eps"], weight=weight, bias=bias,
                                   residual=residual, gate=gate)
        y = torch.full_like(x, 7.0)
        ro = torch.full_like(x, 7.0) if c["residual"] else None
        q = torch.empty(B, S, D, device="cuda", dtype=torch.uint8) if c["fp8"] else None
        isc = torch.tensor([0.4754464328289032], device="cuda") if c["fp8"] else None
        impl = dt.run(x=x, residual=residual, gate=gate, weight=weight, bias=bias, scale=scale, shift=shift,
                      input_scale=isc, y=y, residual_out=ro, fp8=q, norm=c["norm"], eps=c["eps"])
        torch.cuda.synchronize()
        ok = torch.equal(y, ref_y) and (ro is None or torch.equal(ro, ref_v))
        if q is not None:
            ok = ok and torch.equal(q, static_quant(ref_y, isc).view(torch.uint8))
        differ = int((y != ref_y).sum().item())
        summary["cases"] += 1
        summary["equal"] += int(ok)
        case = {k: (str(v) if not isinstance(v, (int, bool, float)) else v) for k, v in c.items()}
        rows.append(dict(kind="verify", op="norm_scale_shift", impl=impl, case=case, torch_equal=ok,
                         differ_fraction=differ / max(y.numel(), 1)))
        if not ok:
            print("MISMATCH", impl, case, f"y differ {differ}/{y.numel()}", flush=True)
    print(f"verification vs the eager chain: {summary['equal']}/{summary['cases']} cases torch.equal")
    return summary["equal"] == summary["cases"]


def wan_tensors(B, S, D, site, per_token, gen, dtype=torch.bfloat16, amp=1.0):
    """One call of a Wan site (numerics="float32"): ditops keyword tensors (outputs included) and the
    float32 chain's arguments. The modulation in f32 as Wan builds it, chunks of [B, 6, D] (or of
    [B, S, 6, D] per token: 2.2 TI2V); norm2's affine weight and bias f32."""
    dev = "cuda"
    x = (torch.randn(B, S, D, device=dev, generator=gen) * amp).to(dtype)
    if per_token:
        mod = [c.squeeze(2) for c in (torch.randn(B, S, 6, D, device=dev, generator=gen) * 0.3).chunk(6, dim=2)]
    else:
        mod = list((torch.randn(B, 6, D, device=dev, generator=gen) * 0.3).chunk(6, dim=1))
    shift, scale, gate = mod[0], mod[1], mod[2]
    t = dict(x=x, y=torch.empty_like(x))
    chain = dict()
    if site in ("norm1", "norm3_residual"):
        t.update(scale=scale, shift=shift)
        chain.update(scale=scale, shift=shift)
    if site in ("norm2_gated", "norm3_residual"):
        res = (torch.randn(B, S, D, device=dev, generator=gen) * amp).to(dtype)
        t.update(residual=res, residual_out=torch.empty_like(x))
        chain["residual"] = res
        if site == "norm2_gated":
            t["gate"] = chain["gate"] = gate
    if site in ("norm2_gated", "norm2"):
        w = 1 + 0.2 * torch.randn(D, device=dev, generator=gen)
        b = 0.1 * torch.randn(D, device=dev, generator=gen)
        t.update(weight=w, bias=b)
        chain.update(weight=w, bias=b)
    return t, chain


def verify_float32(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    shapes = [(2, 9, 1536, False), (1, 65, 5120, False), (2, 33, 3072, True), (1, 17, 8192, False),
              (2, 17, 2240, False), (3, 5, 64, True), (1, 32760, 5120, False), (2, 32760, 5120, False),
              (1, 32760, 1536, False), (1, 4096, 3072, True)]
    summary = dict(cases=0, equal=0)
    for i, ((B, S, D, per_token), site) in enumerate(itertools.product(
            shapes, ("norm1", "norm2_gated", "norm3_residual", "norm2"))):
        dtype = torch.float16 if i % 7 == 3 else torch.bfloat16
        t, chain = wan_tensors(B, S, D, site, per_token, gen, dtype, amp=(1e-3, 1.0, 30.0)[i % 3])
        ref_y, ref_v = float32_chain(t["x"], chain.pop("scale", None), chain.pop("shift", None), eps=1e-6, **chain)
        impl = dt.run(numerics="float32", **t)
        torch.cuda.synchronize()
        ok = torch.equal(t["y"], ref_y) and ("residual_out" not in t or torch.equal(t["residual_out"], ref_v))
        summary["cases"] += 1
        summary["equal"] += int(ok)
        case = dict(B=B, S=S, D=D, site=site, per_token=per_token, dtype=str(dtype))
        rows.append(dict(kind="verify", op="norm_scale_shift", impl=impl, case=case, torch_equal=ok,
                         differ_fraction=int((t["y"] != ref_y).sum().item()) / max(ref_y.numel(), 1)))
        if not ok:
            print("MISMATCH float32", impl, case, flush=True)
        t = chain = ref_y = ref_v = None
    print(f"verification of numerics=float32 vs Wan's chain: {summary['equal']}/{summary['cases']} cases torch.equal")
    return summary["equal"] == summary["cases"]


def mean_order_tensors(B, S, D, per_token, gen, dtype=torch.bfloat16, amp=1.0, residual=False):
    """One LTX-2 site call (norm_order=aten_mean): x, scale / shift chunks of the block's modulation
    [B, 1 or S, 6, D] (as get_mod_params' unbind gives them), y (and the residual's tensors)."""
    dev = "cuda"
    rows = S if per_token else 1
    x = (torch.randn(B, S, D, device=dev, generator=gen) * amp + 0.1 * amp).to(dtype)
    x.view(-1)[::97] = 0.0
    table = (torch.randn(B, rows, 6, D, device=dev, generator=gen) * 0.3).to(dtype if dtype != torch.float32 else dtype)
    t = dict(x=x, scale=table[:, :, 1], shift=table[:, :, 0], y=torch.full_like(x, 7.0))
    if residual:
        t.update(residual=(torch.randn(B, S, D, device=dev, generator=gen) * amp).to(dtype), gate=table[:, :, 2],
                 residual_out=torch.full_like(x, 7.0))
    return t


def verify_mean(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4)
    shapes = [(1, 6144, 4096, False), (1, 6144, 4096, True), (1, 1024, 2048, False), (2, 3072, 4096, True),
              (1, 1, 4096, False), (1, 3, 2048, True), (3, 5, 3072, False), (1, 9, 128, False), (1, 15, 8188, False),
              (2, 33, 5120, True), (1, 257, 2240, False)]
    summary = dict(cases=0, equal=0)
    for i, ((B, S, D, per_token), variant) in enumerate(itertools.product(shapes, ("plain", "f16", "residual"))):
        dtype = torch.float16 if variant == "f16" else torch.float32 if (i % 9 == 3) else torch.bfloat16
        t = mean_order_tensors(B, S, D, per_token, gen, dtype, amp=(1e-3, 1.0, 30.0)[i % 3],
                               residual=variant == "residual")
        ref_y, ref_v = eager_chain(t["x"], t["scale"], t["shift"], norm="rms", eps=1e-6, residual=t.get("residual"),
                                   gate=t.get("gate"), norm_order="aten_mean")
        impl = dt.run(norm="rms", norm_order="aten_mean", eps=1e-6, **t)
        torch.cuda.synchronize()
        ok = torch.equal(t["y"], ref_y) and ("residual_out" not in t or torch.equal(t["residual_out"], ref_v))
        summary["cases"] += 1
        summary["equal"] += int(ok)
        case = dict(B=B, S=S, D=D, per_token=per_token, variant=variant, dtype=str(dtype))
        rows.append(dict(kind="verify", op="norm_scale_shift", impl=impl, case=case, torch_equal=ok,
                         differ_fraction=int((t["y"] != ref_y).sum().item()) / max(ref_y.numel(), 1)))
        if not ok:
            print("MISMATCH aten_mean", impl, case, int((t["y"] != ref_y).sum().item()), flush=True)
        t = ref_y = ref_v = None
    print(f"verification of norm_order=aten_mean vs diffusers' RMSNorm chain: {summary['equal']}/{summary['cases']} "
          "cases torch.equal")
    return summary["equal"] == summary["cases"]


# ---------------------------------------------------------------- benchmark

CASES = [("FLUX 1x4608x3072", 1, 4608, 3072), ("Qwen-Image CFG 2x6912x3072", 2, 6912, 3072),
         ("Wan 1x32760x5120", 1, 32760, 5120), ("512 tokens x3072", 1, 512, 3072)]




def bench_tensors(B, S, D, variant, gen):
    """One buffer set of a benchmark case: the ditops call's tensors (keyword arguments of
    Ditops.run) and the byte model."""
    x = torch.randn(B, S, D, device="cuda", generator=gen).to(torch.bfloat16)
    mod = (torch.randn(B, 6, D, device="cuda", generator=gen) * 0.2).to(torch.bfloat16)
    n = x.numel()
    t = dict(x=x, scale=mod[:, 0:1], shift=mod[:, 1:2])
    nbytes = 2 * n + 4 * B * D
    if variant in ("residual", "nvfp4"):
        t.update(residual=torch.randn_like(x), gate=mod[:, 2:3], residual_out=torch.empty_like(x))
        nbytes += 4 * n + 2 * B * D
    if variant != "nvfp4":
        t["y"] = torch.empty_like(x)
        nbytes += 2 * n
    if variant == "fp8":
        t.update(input_scale=torch.tensor([0.03125], device="cuda"),
                 fp8=torch.empty(B, S, D, device="cuda", dtype=torch.uint8))
        nbytes += n
    if variant == "nvfp4":
        padded = (B * S + 127) // 128 * 128
        t.update(global_scale=torch.tensor([0.625], device="cuda"),
                 nvfp4_packed=torch.empty(B * S, D // 2, device="cuda", dtype=torch.uint8),
                 nvfp4_scales=torch.empty(padded, D // 16, device="cuda", dtype=torch.uint8))
        nbytes += n // 2 + padded * D // 16
    return t, nbytes


def run_bench(dt, rows, meta):
    allow_recompiles()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    compiled = {}

    def chain(x_, s_, sh_, r_, g_, inv_):
        y, v = eager_chain(x_, s_, sh_, residual=r_, gate=g_)
        if inv_ is not None:
            return y, (y.float() * inv_).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), v
        return y, v

    report_header(44)
    for (name, B, S, D), variant in itertools.product(CASES, ("plain", "residual", "fp8", "nvfp4")):
        label = f"{name} {variant}"
        if not case_selected(label):
            continue
        sets = []
        first, nbytes = bench_tensors(B, S, D, variant, gen)
        sets.append(first)
        for _ in range(rotation_count(nbytes) - 1):
            sets.append(bench_tensors(B, S, D, variant, gen)[0])
        for t in sets:
            t["src"], t["dst"] = copy_buffers(nbytes)
            if variant == "fp8":  # torch.compile's chain takes the reciprocal, computed once per set
                t["inv"] = inv_div_full(t["input_scale"])
        args = lambda t: {k: v for k, v in t.items() if k not in ("src", "dst", "inv")}  # noqa: E731
        t0 = sets[0]
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"])]
        for numerics in ("eager", "sglang"):
            try:
                dt.run(numerics=numerics, **args(t0))
            except RuntimeError as e:
                print(label, numerics, "failed:", str(e)[:200])
                continue
            g = graph_of(lambda s, numerics=numerics: dt.run(numerics=numerics, stream=s, **args(t0)))
            impls.append(("ditops:jit" if numerics == "eager" else "ditops:jit:sglang", g.replay,
                          [lambda t=t, numerics=numerics: dt.run(numerics=numerics, **args(t)) for t in sets]))
        if variant != "nvfp4":  # (no eager NVFP4 quantizer in torch)
            if variant not in compiled:
                compiled[variant] = torch.compile(chain, dynamic=False)
            cfn = compiled[variant]

            def torch_args(t):
                return t["x"], t["scale"], t["shift"], t.get("residual"), t.get("gate"), t.get("inv")

            def eager_fn(t):
                y, _ = eager_chain(t["x"], t["scale"], t["shift"], residual=t.get("residual"), gate=t.get("gate"))
                return static_quant(y, t["input_scale"]) if variant == "fp8" else y

            impls.append(("torch_eager", lambda: eager_fn(t0), [lambda t=t: eager_fn(t) for t in sets]))
            impls.append(("torch_compile", lambda: cfn(*torch_args(t0)), [lambda t=t: cfn(*torch_args(t)) for t in sets]))
        report(measure(impls), rows, meta, "norm_scale_shift", label, shape_str((B, S, D)), nbytes, 44)
        sets = t0 = impls = None  # release before the next case allocates
        torch.cuda.empty_cache()
    run_bench_float32(dt, rows, meta, gen)
    run_bench_mean(dt, rows, meta, gen)
    run_bench_rowwise(dt, rows, meta, gen)


# LTX-2's block norms (norm_order=aten_mean): video and audio rows, modulation per batch.
LTX2_CASES = [("LTX-2 video 1x6144x4096", 1, 6144, 4096), ("LTX-2 video 1x24576x4096", 1, 24576, 4096),
              ("LTX-2 audio 1x1024x2048", 1, 1024, 2048)]


def mean_chain(x, scale, shift):
    return eager_chain(x, scale, shift, norm="rms", eps=1e-6, norm_order="aten_mean")[0]


def run_bench_mean(dt, rows, meta, gen):
    compiled = torch.compile(mean_chain, dynamic=False)
    for name, B, S, D in LTX2_CASES:
        label = f"{name} rms aten_mean"
        if not case_selected(label):
            continue
        n = B * S * D
        nbytes = 4 * n + 4 * B * D  # x in, y out (bf16), scale and shift rows
        sets = [mean_order_tensors(B, S, D, False, gen) for _ in range(rotation_count(nbytes))]
        for t in sets:
            t["src"], t["dst"] = copy_buffers(nbytes)
        args = lambda t: {k: v for k, v in t.items() if k not in ("src", "dst")}  # noqa: E731
        t0 = sets[0]
        run = lambda t, s=None: dt.run(norm="rms", norm_order="aten_mean", eps=1e-6, stream=s, **args(t))  # noqa: E731
        run(t0)
        g = graph_of(lambda s: run(t0, s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("ditops:jit", g.replay, [lambda t=t: run(t) for t in sets]),
                 ("torch_eager", lambda: mean_chain(t0["x"], t0["scale"], t0["shift"]),
                  [lambda t=t: mean_chain(t["x"], t["scale"], t["shift"]) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["x"], t0["scale"], t0["shift"]),
                  [lambda t=t: compiled(t["x"], t["scale"], t["shift"]) for t in sets])]
        report(measure(impls), rows, meta, "norm_scale_shift", label, shape_str((B, S, D)), nbytes, 44)
        sets = t0 = impls = g = None
        torch.cuda.empty_cache()


# Wan's sites with numerics=float32: norm1/norm3 (x in, y out, f32 scale and shift rows) and norm2
# behind the gated residual (x and residual in, residual_out and y out, f32 gate, weight, bias).
WAN_CASES = [("Wan 14B 1x32760x5120", 1, 32760, 5120), ("Wan 1.3B 1x32760x1536", 1, 32760, 1536),
             ("Wan 14B 2x32760x5120", 2, 32760, 5120)]


def run_bench_float32(dt, rows, meta, gen):
    compiled = torch.compile(float32_chain, dynamic=False)
    for (name, B, S, D), site in itertools.product(WAN_CASES, ("norm1", "norm2_gated")):
        label = f"{name} float32 {site}"
        if not case_selected(label):
            continue
        n = B * S * D
        nbytes = (4 * n + 8 * B * D) if site == "norm1" else (8 * n + 4 * B * D + 8 * D)
        sets = [wan_tensors(B, S, D, site, False, gen) for _ in range(rotation_count(nbytes))]
        for t, _ in sets:
            t["src"], t["dst"] = copy_buffers(nbytes)
        args = lambda t: {k: v for k, v in t.items() if k not in ("src", "dst")}  # noqa: E731

        def chain_args(c):
            c = dict(c)
            return (c.pop("scale", None), c.pop("shift", None)), c

        def eager_fn(t, c, fn=float32_chain):
            (sc, sh), kw = chain_args(c)
            return fn(t["x"], sc, sh, **kw)

        t0, c0 = sets[0]
        dt.run(numerics="float32", **args(t0))
        g = graph_of(lambda s: dt.run(numerics="float32", stream=s, **args(t0)))
        impls = [copy_impl([t for t, _ in sets], lambda t: t["src"], lambda t: t["dst"]),
                 ("ditops:jit", g.replay, [lambda t=t: dt.run(numerics="float32", **args(t)) for t, _ in sets]),
                 ("torch_eager", lambda: eager_fn(t0, c0), [lambda t=t, c=c: eager_fn(t, c) for t, c in sets]),
                 ("torch_compile", lambda: eager_fn(t0, c0, compiled),
                  [lambda t=t, c=c: eager_fn(t, c, compiled) for t, c in sets])]
        report(measure(impls), rows, meta, "norm_scale_shift", label, shape_str((B, S, D)), nbytes, 44)
        sets = t0 = c0 = impls = g = None
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- the fp8_rowwise output (issue 43)

rowwise_chain = _eager.norm_scale_shift_fp8_rowwise_eager  # (q, s, y, v)
# The chains of the benchmark calls (Wan's norm1, LTX-2's block norm), by kind.
ROWWISE_CHAINS = {"float32": dict(numerics="float32", eps=1e-6),
                  "mean": dict(norm="rms", eps=1e-6, norm_order="aten_mean")}


def rowwise_pair(x, scale, shift, kind):
    """(e4m3, scales) of a benchmark call's chain: what the compiled baseline computes."""
    return rowwise_chain(x, scale, shift, **ROWWISE_CHAINS[kind])[:2]


compiled_rowwise_pair = torch.compile(rowwise_pair, dynamic=False)  # compiled at its first call, per shape


def rowwise_outputs(x):
    B, S, _ = x.shape
    return dict(fp8_rowwise=torch.empty_like(x, dtype=torch.float8_e4m3fn),
                fp8_scale=torch.full((B, S, 1), 7.0, device=x.device, dtype=torch.float32))


def same_pair(q, s, wq, ws):
    """e4m3 bytes equal and fp32 scales equal bit for bit (a NaN scale equal to a NaN)."""
    nan = torch.isnan(s) & torch.isnan(ws)
    return torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(
        torch.where(nan, 0, s.view(torch.int32)), torch.where(nan, 0, ws.view(torch.int32)))


def rowwise_call(kind, B, S, D, gen, dtype=torch.bfloat16, amp=1.0, site="norm1", per_token=False, with_y=False):
    """One fp8_rowwise call: (ditops keyword tensors, ditops options, the chain's arguments). kind
    "float32": a Wan site (wan_tensors); "mean": an LTX-2 block norm (mean_order_tensors, a gated
    residual for site "residual"); "layer" / "rms": the eager rows, scale / shift chunks of [B, 6 D]."""
    if kind == "float32":
        t, chain = wan_tensors(B, S, D, site, per_token, gen, dtype, amp)
        args = (t["x"], chain.pop("scale", None), chain.pop("shift", None))
        chain.update(numerics="float32", eps=1e-6)
        opts = dict(numerics="float32")
    elif kind == "mean":
        t = mean_order_tensors(B, S, D, per_token, gen, dtype, amp, residual=site == "residual")
        args = (t["x"], t["scale"], t["shift"])
        chain = dict(norm="rms", eps=1e-6, norm_order="aten_mean", residual=t.get("residual"), gate=t.get("gate"))
        opts = dict(norm="rms", norm_order="aten_mean")
    else:
        x = (torch.randn(B, S, D, device="cuda", generator=gen) * amp + 0.25 * amp).to(dtype)
        mod = (torch.randn(B, 6 * D, device="cuda", generator=gen) * 0.3).to(dtype)
        weight = (torch.randn(D, device="cuda", generator=gen) * 0.2 + 1).to(dtype) if kind == "rms" else None
        t = dict(x=x, scale=mod[:, D:2 * D], shift=mod[:, 2 * D:3 * D] if site != "zero" else None, weight=weight,
                 y=torch.empty_like(x))
        if site == "zero":  # 1 + scale = 0: every y a signed zero, the scale 1 (the zero-row rule)
            t["scale"].fill_(-1.0)
        args = (x, t["scale"], t["shift"])
        chain = dict(norm=kind, eps=1e-6, weight=weight)
        opts = dict(norm=kind)
    t = {k: v for k, v in t.items() if v is not None}
    if not with_y:
        t.pop("y", None)
    t.update(rowwise_outputs(t["x"]))
    return t, opts, args, chain


def verify_rowwise(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    calls = []
    for i, (B, S, D, per_token) in enumerate([(1, 32760, 5120, False), (2, 32760, 5120, False), (1, 32760, 1536, False),
                                              (1, 4096, 3072, True), (2, 65, 5120, False), (2, 33, 1536, False),
                                              (3, 5, 68, True)]):
        for site in ("norm1", "norm3_residual", "norm2_gated") if i in (0, 4, 6) else ("norm1",):
            calls.append(("float32", B, S, D, dict(site=site, per_token=per_token, with_y=i % 2 == 1,
                                                   amp=(1e-3, 1.0, 30.0)[i % 3],
                                                   dtype=torch.float16 if i == 5 else torch.bfloat16)))
    for i, (B, S, D, per_token) in enumerate([(1, 6144, 4096, False), (1, 6144, 4096, True), (1, 24576, 4096, False),
                                              (1, 1024, 2048, False), (1, 3, 2048, True), (1, 9, 128, False),
                                              (2, 33, 5120, True)]):
        for site in ("plain", "residual") if i in (0, 3) else ("plain",):
            calls.append(("mean", B, S, D, dict(site=site, per_token=per_token, with_y=i % 2 == 0,
                                                amp=(1.0, 1e-3, 30.0)[i % 3],
                                                dtype=torch.float16 if i == 6 else torch.bfloat16)))
    for kind, B, S, D, kw in [("layer", 1, 4608, 3072, {}), ("rms", 2, 65, 3072, dict(with_y=True)),
                              ("layer", 3, 33, 2240, dict(dtype=torch.float16, amp=100.0)),
                              ("layer", 2, 9, 3072, dict(site="zero", with_y=True))]:
        calls.append((kind, B, S, D, kw))
    summary = dict(cases=0, equal=0)
    for kind, B, S, D, kw in calls:
        t, opts, args, chain = rowwise_call(kind, B, S, D, gen, **kw)
        q, s, y, v = rowwise_chain(*args, **chain)
        impl = dt.run(**opts, eps=1e-6, **t)
        torch.cuda.synchronize()
        ok = same_pair(t["fp8_rowwise"], t["fp8_scale"], q, s)
        ok = ok and ("y" not in t or torch.equal(t["y"], y))
        ok = ok and ("residual_out" not in t or torch.equal(t["residual_out"], v))
        summary["cases"] += 1
        summary["equal"] += int(ok)
        case = dict(kind=kind, B=B, S=S, D=D,
                    **{k: v if isinstance(v, (bool, float)) else str(v) for k, v in kw.items()})
        rows.append(dict(kind="verify", op="norm_scale_shift", impl=impl, case=case, output="fp8_rowwise",
                         oracle="norm_scale_shift_fp8_rowwise_eager", torch_equal=ok))
        if not ok:
            bad = int((t["fp8_rowwise"].view(torch.uint8) != q.view(torch.uint8)).sum().item())
            print("MISMATCH fp8_rowwise", impl, case, f"{bad} bytes", int((t["fp8_scale"] != s).sum().item()),
                  "scales", flush=True)
        t = args = chain = q = s = y = v = None
    print(f"verification of fp8_rowwise vs the chain then fp8_rowwise_eager: {summary['equal']}/{summary['cases']} "
          "cases torch.equal")
    # torch.compile's chain against eager (printed, recorded: the bench times it as the compiled baseline).
    allow_recompiles()
    t, opts, args, chain = rowwise_call("float32", 1, 32760, 5120, gen)
    equal = same_pair(*compiled_rowwise_pair(*args, "float32"), *rowwise_pair(*args, "float32"))
    print(f"torch.compile of the Wan 14B fp8_rowwise chain equals eager: {equal}")
    rows.append(dict(kind="compile_vs_eager", op="norm_scale_shift", output="fp8_rowwise", torch_equal=equal))
    # A captured call replayed on new inputs.
    dt.run(**opts, eps=1e-6, **t)
    graph = graph_of(lambda st: dt.run(**opts, eps=1e-6, stream=st, **t))
    replays = []
    for trial in range(3):
        t2, _, args2, _ = rowwise_call("float32", 1, 32760, 5120, gen, amp=1.0 + trial)
        for name in ("x", "scale", "shift"):
            t[name].copy_(t2[name])
        graph.replay()
        torch.cuda.synchronize()
        replays.append(same_pair(t["fp8_rowwise"], t["fp8_scale"], *rowwise_chain(*args, **chain)[:2]))
    print("fp8_rowwise graph replays equal:", replays)
    rows.append(dict(kind="graph", op="norm_scale_shift", output="fp8_rowwise", replays_equal=replays,
                     torch_equal=all(replays)))
    return summary["equal"] == summary["cases"] and all(replays)


# Wan 14B's norm1 (numerics=float32) and LTX-2's video block norm (aten_mean) with the fp8_rowwise
# output and no y: x read, e4m3 and 4 bytes of scale a row written, the modulation rows
# (f32 for Wan, bf16 for LTX-2) read once.
ROWWISE_CASES = [("Wan 14B 1x32760x5120 float32 norm1 fp8_rowwise", "float32", 1, 32760, 5120),
                 ("LTX-2 video 1x6144x4096 rms aten_mean fp8_rowwise", "mean", 1, 6144, 4096)]


def run_bench_rowwise(dt, rows, meta, gen):
    allow_recompiles()
    for label, kind, B, S, D in ROWWISE_CASES:
        if not case_selected(label):
            continue
        n = B * S * D
        nbytes = 3 * n + 4 * B * S + (8 if kind == "float32" else 4) * B * D
        sets = []
        for _ in range(rotation_count(nbytes)):
            t, opts, args, chain = rowwise_call(kind, B, S, D, gen)
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append((t, args))
        ditops_args = lambda t: {k: v for k, v in t.items() if k not in ("src", "dst")}  # noqa: E731
        t0, a0 = sets[0]
        dt.run(**opts, eps=1e-6, **ditops_args(t0))
        g = graph_of(lambda st: dt.run(**opts, eps=1e-6, stream=st, **ditops_args(t0)))
        impls = [copy_impl([t for t, _ in sets], lambda t: t["src"], lambda t: t["dst"]),
                 ("ditops:jit", g.replay, [lambda t=t: dt.run(**opts, eps=1e-6, **ditops_args(t)) for t, _ in sets]),
                 ("torch_eager", lambda: rowwise_pair(*a0, kind),
                  [lambda a=a: rowwise_pair(*a, kind) for _, a in sets]),
                 ("torch_compile", lambda: compiled_rowwise_pair(*a0, kind),
                  [lambda a=a: compiled_rowwise_pair(*a, kind) for _, a in sets])]
        report(measure(impls), rows, meta, "norm_scale_shift", label, shape_str((B, S, D)), nbytes, 44)
        sets = t0 = a0 = impls = g = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", lambda dt, rows, meta: verify(dt, rows)),
                                ("VERIFY_FLOAT32", lambda dt, rows, meta: verify_float32(dt, rows)),
                                ("VERIFY_MEAN", lambda dt, rows, meta: verify_mean(dt, rows)),
                                ("VERIFY_FP8_ROWWISE", verify_rowwise)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
