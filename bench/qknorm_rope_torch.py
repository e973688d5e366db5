"""qknorm_rope on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. Verification: every mode of the fused kernel against the PyTorch eager chain on CUDA
   (F.rms_norm, then RoPE in eager ops) over a grid of tokens, heads, head dims, rope dims,
   pairings, position dtypes and packed-QKV views; reports the fraction of differing elements and
   the largest difference in ulps. Rounded mode must be byte-equal (torch.equal).
2. CUDA-graph capture and replay with mutated inputs, a non-default stream, the host overhead of
   one call through the C ABI.
3. Benchmark: ditops (aot / jit), eager and torch.compile on the model shapes, cold L2
   (triton.testing.do_bench flushes it), median; GB/s by the byte model and the fraction of a
   device copy of the same bytes measured in the same run.

Calls ditops through its C ABI (include/ditops/c_api.h) with ctypes, so it needs only the
built libditops.so.
"""
import ctypes
import sys
import time

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, load_eager, record, script_main, shape_str,
                                median_us as bench)

# ---------------------------------------------------------------- C ABI


class Ditops(DitopsLib):
    def qknorm_rope(self, q, k, wq, wk, cache, pos, *, neox, eps=1e-6, rope_dim=0, full_width=False,
                    rounding="rounded", order="aten", backend=None, quality=None, stream=None,
                    weight_rounding=None, rope_product=None):
        return self.call("qknorm_rope", stream, dict(is_neox=neox, eps=eps, rope_dim=rope_dim,
                                                     cache_full_width=full_width, rounding=rounding,
                                                     norm_order=order, backend=backend, quality=quality,
                                                     norm_weight_rounding=weight_rounding,
                                                     rope_product=rope_product),
                         q=q, k=k, q_weight=wq, k_weight=wk, cos_sin_cache=cache, positions=pos)


# ---------------------------------------------------------------- the eager chain (the oracle)

# One copy of the chain, in the Python package; loaded by path so this script needs no compiled
# ditops module (only libditops through ctypes).
_eager = load_eager()
rope_eager, full_cos_sin, eager_chain = _eager.rope_eager, _eager.full_cos_sin, _eager.eager_chain
qknorm_rope_eager = _eager.qknorm_rope_eager


def ulp_diff(a, b):
    """Largest distance in units in the last place between two 16-bit tensors of one dtype."""
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    # Map sign-magnitude to a monotonic integer line.
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((ia - ib).abs().max().item()) if a.numel() else 0


# ---------------------------------------------------------------- verification


def float64_bound_check(out, x, w, cache, pos, R, neox, eps, full_width):
    """rounding=fp32 is close: every element within the contract's float64 bound, the driver's
    (tests/cases/qknorm_rope_cases.cpp qk_float64): |out - want| <= 3u m + 2u |want| + 1e-5 m +
    floor, want the chain in float64, m = |n c| + |n' s| (n the normalized row, n' its partner)."""
    D = x.shape[-1]
    n = torch.nn.functional.rms_norm(x.double(), (D,), w.double(), eps)
    cos, sin = full_cos_sin(cache.double(), pos, R, neox, full_width)
    want = rope_eager(n, cos, sin, R, neox, True)
    nr = n[..., :R]
    partner = torch.cat([nr[..., R // 2:], nr[..., : R // 2]], -1) if neox else \
        nr.unflatten(-1, (R // 2, 2)).flip(-1).flatten(-2)
    m = n.abs().clone()
    m[..., :R] = nr.abs() * cos[:, None, :].abs() + partner.abs() * sin[:, None, :].abs()
    u = 2.0 ** -11 if x.dtype == torch.float16 else 2.0 ** -8
    floor = 3 * 2.0 ** -24 if x.dtype == torch.float16 else 1e-30
    bound = 3 * u * m + 2 * u * want.abs() + 1e-5 * m + floor
    return bool(((out.double() - want).abs() <= bound).all())


def make_inputs(T, Hq, Hk, D, R, cache_dtype, pos_dtype, dtype, packed, full_width, gen, amp=1.0):
    dev = "cuda"
    if packed:  # q and k as views of one packed QKV projection [T, (Hq + 2 Hk) * D]
        qkv = torch.randn(T, (Hq + 2 * Hk) * D, device=dev, generator=gen).to(dtype) * amp
        q = qkv[:, : Hq * D].view(T, Hq, D)
        k = qkv[:, Hq * D: (Hq + Hk) * D].view(T, Hk, D)
        holder = qkv
    else:
        q = (torch.randn(T, Hq, D, device=dev, generator=gen) * amp).to(dtype)
        k = (torch.randn(T, Hk, D, device=dev, generator=gen) * amp).to(dtype)
        holder = None
    wq = (torch.rand(D, device=dev, generator=gen) + 0.5).to(dtype)
    wk = (torch.rand(D, device=dev, generator=gen) + 0.5).to(dtype)
    P = max(2 * T, 64)
    width = 2 * R if full_width else R
    t = torch.arange(P, device=dev, dtype=torch.float64)[:, None]
    if full_width:
        # Per-channel values that differ inside a pair, to catch index mistakes.
        cache = torch.randn(P, width, device=dev, generator=gen, dtype=torch.float64)
    else:
        inv = 10000.0 ** (-torch.arange(0, R // 2, device=dev, dtype=torch.float64) * 2 / R)
        cache = torch.cat([torch.cos(t * inv), torch.sin(t * inv)], -1)
    cache = cache.to(cache_dtype)
    pos = torch.randperm(P, device=dev, generator=gen)[:T].to(pos_dtype)
    return q, k, wq, wk, cache, pos, holder


def verify(dt, out_rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    cases = []
    for D in (64, 128, 256):
        for R in sorted({D, D // 2, 32 if D == 64 else 96 if D == 128 else 128}):
            for neox in (False, True):
                if neox and R % 16:
                    continue
                for T, Hq, Hk in ((1, 8, 8), (9, 24, 24), (129, 32, 8), (4097, 40, 40)):
                    for pos_dtype in (torch.int32, torch.int64):
                        cases.append(dict(D=D, R=R, neox=neox, T=T, Hq=Hq, Hk=Hk, pos_dtype=pos_dtype,
                                          dtype=torch.bfloat16, cache_dtype=torch.float32,
                                          packed=(T == 129), full_width=False))
    # dtype / cache / layout variants on FLUX-like rows
    for dtype in (torch.bfloat16, torch.float16):
        for cache_dtype in (torch.float32, dtype):
            for full_width in (False, True):
                for neox in (False, True):
                    cases.append(dict(D=128, R=128, neox=neox, T=257, Hq=28, Hk=28, pos_dtype=torch.int64,
                                      dtype=dtype, cache_dtype=cache_dtype, packed=True, full_width=full_width))
    summary = {}
    for c in cases:
        q, k, wq, wk, cache, pos, _ = make_inputs(c["T"], c["Hq"], c["Hk"], c["D"], c["R"], c["cache_dtype"],
                                                  c["pos_dtype"], c["dtype"], c["packed"], c["full_width"], gen)
        eps = 1e-6
        ref_q, ref_k = eager_chain(q, k, wq, wk, cache, pos, c["R"], c["neox"], eps, c["full_width"])
        for rounding in ("rounded", "fp32"):
            for backend in ("jit", "aot"):
                qq, kk = q.clone(), k.clone()
                if c["packed"]:  # keep the packed layout: run on views of a fresh packed copy
                    qkv = torch.empty(c["T"], (c["Hq"] + 2 * c["Hk"]) * c["D"], device="cuda", dtype=c["dtype"])
                    qkv.fill_(1.25)
                    qq = qkv[:, : c["Hq"] * c["D"]].view(c["T"], c["Hq"], c["D"])
                    kk = qkv[:, c["Hq"] * c["D"]: (c["Hq"] + c["Hk"]) * c["D"]].view(c["T"], c["Hk"], c["D"])
                    qq.copy_(q)
                    kk.copy_(k)
                try:
                    impl = dt.qknorm_rope(qq, kk, wq, wk, cache, pos, neox=c["neox"], eps=eps,
                                          rope_dim=c["R"], full_width=c["full_width"], rounding=rounding,
                                          backend=backend, quality="high")
                except RuntimeError as e:
                    if backend == "aot" and ("no prebuilt" in str(e) or "no eligible implementation" in str(e)):
                        continue
                    raise
                torch.cuda.synchronize()
                if c["packed"]:
                    v = qkv[:, (c["Hq"] + c["Hk"]) * c["D"]:]
                    assert bool((v == 1.25).all()), "the V part of the packed QKV was written"
                exact = torch.equal(qq, ref_q) and torch.equal(kk, ref_k)
                n = qq.numel() + kk.numel()
                differ = int((qq != ref_q).sum().item() + (kk != ref_k).sum().item())
                ulps = max(ulp_diff(qq, ref_q), ulp_diff(kk, ref_k))
                max_abs = max(float((qq.float() - ref_q.float()).abs().max()), float((kk.float() - ref_k.float()).abs().max())) if n else 0.0
                key = (rounding, backend)
                s = summary.setdefault(key, dict(cases=0, exact=0, differ=0, elems=0, max_ulp=0, max_abs=0.0))
                s["max_abs"] = max(s["max_abs"], max_abs)
                s["cases"] += 1
                s["exact"] += int(exact)
                s["differ"] += differ
                s["elems"] += n
                s["max_ulp"] = max(s["max_ulp"], ulps)
                row = dict(kind="verify", impl=impl, rounding=rounding,
                           case={kk2: (str(v2) if not isinstance(v2, (int, bool)) else v2) for kk2, v2 in c.items()},
                           torch_equal=exact, differ_fraction=differ / n, max_ulp=ulps, max_abs=max_abs)
                if rounding == "fp32":  # close: its own oracle and bound, not the rounded chain's bytes
                    row["within_bound"] = (
                        float64_bound_check(qq, q, wq, cache, pos, c["R"], c["neox"], eps, c["full_width"])
                        and float64_bound_check(kk, k, wk, cache, pos, c["R"], c["neox"], eps, c["full_width"]))
                    s["out_of_bound"] = s.get("out_of_bound", 0) + (not row["within_bound"])
                    if not row["within_bound"]:
                        print("OUT OF BOUND", impl, row["case"], flush=True)
                out_rows.append(row)
                if rounding == "rounded" and not exact:
                    print("MISMATCH", impl, row["case"], f"differ {differ}/{n} max_ulp {ulps}", flush=True)
    print("\nverification against the eager chain (torch.equal per case):")
    print("(max ulp: ordinal distance, large only where a value cancels to near zero; max abs: outputs are O(1))")
    print(f"{'rounding':9s} {'backend':8s} {'cases':>6s} {'equal':>6s} {'differ%':>9s} {'max ulp':>8s} {'max abs':>9s}")
    ok = True
    for (rounding, backend), s in sorted(summary.items()):
        print(f"{rounding:9s} {backend:8s} {s['cases']:6d} {s['exact']:6d} {100 * s['differ'] / max(s['elems'], 1):9.4f} {s['max_ulp']:8d} {s['max_abs']:9.2e}")
        if rounding == "rounded" and s["exact"] != s["cases"]:
            ok = False
        if s.get("out_of_bound"):
            print(f"{rounding} {backend}: {s['out_of_bound']} cases outside the float64 bound")
            ok = False
    return ok, summary


def verify_diffusers(dt, out_rows):
    """diffusers' RMSNorm per head (norm_order=aten_mean, norm_weight_rounding=twice: HunyuanVideo,
    Qwen-Image) with the real RoPE form and Qwen-Image's complex product (rope_product=complex),
    torch.equal against the eager chains, weights spread around 1."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    cases = [(13824, 24, 24, 128, 128, False, torch.bfloat16), (1, 24, 24, 128, 128, False, torch.bfloat16),
             (129, 32, 8, 128, 128, True, torch.bfloat16), (9, 4, 4, 64, 64, False, torch.float16),
             (257, 24, 24, 128, 64, False, torch.float16), (4097, 24, 24, 128, 128, True, torch.bfloat16)]
    ok_all, n_ok, n = True, 0, 0
    for (T, Hq, Hk, D, R, packed, dtype), product in [(c, p) for c in cases for p in ("real", "complex")]:
        q, k, wq, wk, cache, pos, _ = make_inputs(T, Hq, Hk, D, R, torch.float32, torch.int64, dtype, packed, False,
                                                  gen, amp=3.0)
        wq = (torch.randn(D, device="cuda", generator=gen) * 0.5 + 1.0).to(dtype)
        wk = (torch.randn(D, device="cuda", generator=gen) * 0.5 + 1.0).to(dtype)
        ref_q, ref_k = qknorm_rope_eager(q, k, wq, wk, cache, pos, R, False, 1e-6, norm_order="aten_mean",
                                         norm_weight_rounding="twice", rope_product=product)
        qq, kk = q.clone(), k.clone()
        impl = dt.qknorm_rope(qq, kk, wq, wk, cache, pos, neox=False, eps=1e-6, rope_dim=R, order="aten_mean",
                              weight_rounding="twice", rope_product=product if product == "complex" else None)
        torch.cuda.synchronize()
        exact = torch.equal(qq, ref_q) and torch.equal(kk, ref_k)
        differ = int((qq != ref_q).sum().item() + (kk != ref_k).sum().item())
        case = dict(T=T, Hq=Hq, Hk=Hk, D=D, R=R, packed=packed, dtype=str(dtype), rope_product=product)
        out_rows.append(dict(kind="verify", impl=impl, rounding="rounded", case=case, torch_equal=exact,
                             differ_fraction=differ / (qq.numel() + kk.numel())))
        n += 1
        n_ok += int(exact)
        if not exact:
            ok_all = False
            print("MISMATCH diffusers", impl, case, f"differ {differ}", flush=True)
    print(f"verification of diffusers' RMSNorm chains (aten_mean, twice; real and complex RoPE): {n_ok}/{n} "
          "cases torch.equal")
    return ok_all


def graph_and_streams(dt, rows):
    """CUDA-graph capture/replay with mutated inputs, a non-default stream, host overhead."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    T, H, D, R = 4608, 24, 128, 128
    q, k, wq, wk, cache, pos, _ = make_inputs(T, H, H, D, R, torch.float32, torch.int64, torch.bfloat16, False, False, gen)
    q0, k0 = q.clone(), k.clone()
    dt.qknorm_rope(q, k, wq, wk, cache, pos, neox=False)  # warm: resolve outside the capture
    q.copy_(q0)
    k.copy_(k0)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        dt.qknorm_rope(q, k, wq, wk, cache, pos, neox=False, stream=s.cuda_stream)
    results = {}
    for trial in range(3):
        new_q = torch.randn(q.shape, device="cuda", generator=gen).to(q.dtype)
        new_k = torch.randn(k.shape, device="cuda", generator=gen).to(k.dtype)
        q.copy_(new_q)
        k.copy_(new_k)
        g.replay()
        torch.cuda.synchronize()
        rq, rk = eager_chain(new_q, new_k, wq, wk, cache, pos, R, False, 1e-6)
        results[f"graph_replay_{trial}_equal"] = torch.equal(q, rq) and torch.equal(k, rk)
    # Non-default stream, ordered after work queued on it.
    q.copy_(q0)
    k.copy_(k0)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        q.mul_(1.0)
        dt.qknorm_rope(q, k, wq, wk, cache, pos, neox=False, stream=s.cuda_stream)
    s.synchronize()
    rq, rk = eager_chain(q0, k0, wq, wk, cache, pos, R, False, 1e-6)
    results["side_stream_equal"] = torch.equal(q, rq) and torch.equal(k, rk)
    # Host overhead of one call through the C ABI (ctypes marshalling included), tiny problem.
    qs, ks = q[:1].clone(), k[:1].clone()
    for _ in range(100):
        dt.qknorm_rope(qs, ks, wq, wk, cache, pos[:1], neox=False)
    torch.cuda.synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        dt.qknorm_rope(qs, ks, wq, wk, cache, pos[:1], neox=False)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    results["host_us_per_call_ctypes"] = round((t1 - t0) / n * 1e6, 2)
    print("graph / streams / overhead:", results)
    rows.append(dict(kind="graph_streams", **results))
    return all(v for kk, v in results.items() if kk.endswith("_equal"))


# ---------------------------------------------------------------- benchmark

CASES = [
    ("FLUX.1 1024px (4608 tok, 24h)", 4608, 24, 24, 128, 128, False),
    ("Qwen-Image 1328px (6912 tok, 24h)", 6912, 24, 24, 128, 128, True),
    ("Z-Image (4096 tok, 30h)", 4096, 30, 30, 128, 128, False),
    ("HunyuanVideo 720p (~30k tok, 24h)", 30000, 24, 24, 128, 128, True),
    ("Wan-like 480p (32760 tok, 40h)", 32760, 40, 40, 128, 128, True),
    ("GQA 32q/8kv hd128 (8192 tok)", 8192, 32, 8, 128, 128, True),
    ("partial rope hd128 r64 (8192 tok)", 8192, 32, 8, 128, 64, True),
    ("small: 256 tok 24h", 256, 24, 24, 128, 128, False),
]



def rms_manual(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def chain_for_compile(q, k, wq, wk, cache, pos, R, neox, eps=1e-6):
    cos, sin = full_cos_sin(cache, pos, R, neox, False)
    D = q.shape[-1]
    return (rope_eager(rms_manual(q, wq, eps), cos, sin, R, neox, False),
            rope_eager(rms_manual(k, wk, eps), cos, sin, R, neox, False))


def case_recorder(rows, meta, name, T, Hq, Hk, D, nbytes):
    """Times a device copy of the case's bytes and returns rec(impl, us): one printed row and record
    per implementation, with the copy fraction."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = bench(lambda: dst.copy_(src))

    def rec(impl, us):
        gbs = nbytes / (us * 1e-6) / 1e9
        print(f"{name:36s} {impl:22s} {us:9.2f} {gbs:8.1f} {100 * copy_us / us:6.1f}%", flush=True)
        record(rows, meta, "qknorm_rope", name, shape_str((T, Hq, D), (T, Hk, D)), impl, "cold_l2", us, nbytes,
               copy_us)

    rec("device_copy", copy_us)
    return rec


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(chain_for_compile, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    print(f"\n{'case':36s} {'impl':22s} {'us':>9s} {'GB/s':>8s} {'copy%':>7s}")
    for name, T, Hq, Hk, D, R, neox in CASES:
        if not case_selected(name):
            continue
        q, k, wq, wk, cache, pos, _ = make_inputs(T, Hq, Hk, D, R, torch.float32, torch.int64, torch.bfloat16,
                                                  False, False, gen)
        nbytes = 2 * (q.numel() + k.numel()) * 2 + T * R * 4 + T * 8 + 2 * D * 2
        rec = case_recorder(rows, meta, name, T, Hq, Hk, D, nbytes)
        for backend in ("aot", "jit"):
            try:
                dt.qknorm_rope(q, k, wq, wk, cache, pos, neox=neox, rope_dim=R, backend=backend)
            except RuntimeError:
                continue
            # Timed as a one-kernel CUDA graph: the ctypes call's host time would otherwise hide the
            # kernel (C++ callers pay the facade's own overhead only).
            side = torch.cuda.Stream()
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=side):
                dt.qknorm_rope(q, k, wq, wk, cache, pos, neox=neox, rope_dim=R, backend=backend,
                               stream=side.cuda_stream)
            rec(f"ditops:{backend}", bench(graph.replay))
        rec("torch_eager", bench(lambda: eager_chain(q, k, wq, wk, cache, pos, R, neox, 1e-6)))
        try:
            rec("torch_compile", bench(lambda: compiled(q, k, wq, wk, cache, pos, R, neox)))
        except Exception as e:  # noqa: BLE001 (report and go on)
            print("torch.compile failed:", repr(e)[:200])
        del q, k, rec
    run_bench_qwen(dt, rows, meta)


def qwen_chain(q, k, wq, wk, cache, pos, R, eps=1e-6):
    return qknorm_rope_eager(q, k, wq, wk, cache, pos, R, False, eps, norm_order="aten_mean",
                             norm_weight_rounding="twice", rope_product="complex")


def run_bench_qwen(dt, rows, meta):
    """Qwen-Image's QK site (diffusers' RMSNorm per head, then the complex64 RoPE) at 2 x 6912 image
    tokens, 24 heads: ditops beside the eager chain and torch.compile of it."""
    compiled = torch.compile(qwen_chain, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(6)
    name, T, H, D = "Qwen-Image diffusers chain (2x6912 tok, 24h)", 13824, 24, 128
    if not case_selected(name):
        return
    q, k, wq, wk, cache, pos, _ = make_inputs(T, H, H, D, D, torch.float32, torch.int64, torch.bfloat16, False,
                                              False, gen)
    nbytes = 2 * (q.numel() + k.numel()) * 2 + T * D * 4 + T * 8 + 2 * D * 2
    rec = case_recorder(rows, meta, name, T, H, H, D, nbytes)
    kw = dict(neox=False, rope_dim=D, order="aten_mean", weight_rounding="twice", rope_product="complex")
    dt.qknorm_rope(q, k, wq, wk, cache, pos, **kw)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=side):
        dt.qknorm_rope(q, k, wq, wk, cache, pos, stream=side.cuda_stream, **kw)
    rec("ditops:jit", bench(graph.replay))
    rec("torch_eager", bench(lambda: qwen_chain(q, k, wq, wk, cache, pos, D)))
    try:
        rec("torch_compile", bench(lambda: compiled(q, k, wq, wk, cache, pos, D)))
    except Exception as e:  # noqa: BLE001 (report and go on)
        print("torch.compile failed:", repr(e)[:200])


def main():
    return script_main(Ditops, [("VERIFY", lambda dt, rows, meta: verify(dt, rows)[0]),
                                ("VERIFY_DIFFUSERS", lambda dt, rows, meta: verify_diffusers(dt, rows)),
                                ("GRAPH", lambda dt, rows, meta: graph_and_streams(dt, rows))], run_bench)


if __name__ == "__main__":
    sys.exit(main())
