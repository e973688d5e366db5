"""joint_qknorm_rope on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. VERIFY: torch.equal against the model's chain (the dual-stream processors of FLUX.1 and FLUX.2:
   F.rms_norm per stream, torch.cat([text, image]) of q, k and v, then the interleaved RoPE in
   float32 from [S, D] cos/sin, one rounding) and against ditops.eager's chain, at FLUX.1 (24 x 128),
   FLUX.2-dev (48 x 128) and FLUX.2-klein 9B (32 x 128) widths with 512 + 4096 tokens, separate and
   fused (packed) projections, batch 2; rounding=fp32 reports its distance (close).
2. GRAPH: a captured call replayed on new inputs equals the chain.
3. Benchmark at FLUX.1 and FLUX.2-dev (1 x (512 + 4096) tokens): ditops beside the model's chain in
   eager and torch.compile and a device copy of the same bytes (the six inputs read and the three
   outputs written once, the cache rows and positions read once), cold L2, rotated buffers in one
   CUDA graph, and alone in a graph from a cleared L2.

--lib PATH (libditops), --json PATH, --commit SHA, --skip-bench; DITOPS_BENCH_CASES /
DITOPS_BENCH_IMPLS select cases and implementations (torch_bench_common.py).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

_eager = load_eager()
eager_chain = _eager.joint_qknorm_rope_eager
NAMES = ("q1", "k1", "v1", "q2", "k2", "v2")
WEIGHTS = ("q1_weight", "k1_weight", "q2_weight", "k2_weight")


class Ditops(DitopsLib):
    def run(self, x, w, cache, positions, out, *, rounding="rounded", stream=None, backend=None):
        tensors = dict(zip(NAMES, x), **dict(zip(WEIGHTS, w)), cos_sin_cache=cache, positions=positions,
                       q=out[0], k=out[1], v=out[2])
        # rounding="fp32" is a close contract: the exact quality tier (the default) admits none.
        quality = "high" if rounding == "fp32" else None
        return self.call("joint_qknorm_rope", stream,
                         dict(cache_full_width=True, rounding=rounding, backend=backend, quality=quality), **tensors)


def model_chain(x, w, cos, sin, eps=1e-6):
    """The processors' code (diffusers 0.42.1 FluxAttnProcessor / Flux2AttnProcessor with
    torch.nn.RMSNorm norms and apply_rotary_emb(use_real=True, sequence_dim=1)), written out."""
    q1, k1, v1, q2, k2, v2 = x
    D = q1.shape[-1]

    def norm(t, weight):
        return torch.nn.functional.rms_norm(t, (D,), weight, eps)

    def rope(t):
        real, imag = t.reshape(*t.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(3)
        return (t.float() * cos[None, :, None, :] + rotated.float() * sin[None, :, None, :]).to(t.dtype)

    q = torch.cat([norm(q1, w[0]), norm(q2, w[2])], dim=1)
    k = torch.cat([norm(k1, w[1]), norm(k2, w[3])], dim=1)
    return rope(q), rope(k), torch.cat([v1, v2], dim=1)


def flux_rope(J, D):
    """FLUX's tables as Flux2PosEmbed / FluxPosEmbed build them: float32 [J, D], each frequency twice
    (theta 2000, a 1-D position: the values are realistic, the layout is the model's)."""
    t = torch.arange(J, device="cuda", dtype=torch.float64)[:, None]
    inv = 2000.0 ** (-torch.arange(0, D, 2, device="cuda", dtype=torch.float64) / D)
    return (t * inv).cos().repeat_interleave(2, -1).float(), (t * inv).sin().repeat_interleave(2, -1).float()


def make(case, gen):
    B, S1, S2, H, packed = case
    D, dev = 128, "cuda"

    def stream(S):
        if packed:  # the fused to_qkv / to_added_qkv projection: token-strided thirds
            qkv = torch.randn(B, S, 3 * H * D, device=dev, generator=gen).bfloat16()
            return [t.unflatten(-1, (H, D)) for t in qkv.chunk(3, -1)]
        return [torch.randn(B, S, H, D, device=dev, generator=gen).bfloat16() for _ in range(3)]

    x = stream(S1) + stream(S2)
    w = [(1 + 0.25 * torch.randn(D, device=dev, generator=gen)).bfloat16() for _ in range(4)]
    cos, sin = flux_rope(S1 + S2, D)
    return x, w, cos, sin, torch.cat([cos, sin], -1), torch.arange(S1 + S2, device=dev)


def outputs_like(x):
    B, S1, H, D = x[0].shape
    J = S1 + x[3].shape[1]
    return [torch.empty(B, J, H, D, device="cuda", dtype=x[0].dtype) for _ in range(3)]


# (B, S1 text, S2 image, H, packed projections)
VERIFY = {
    "flux1": (1, 512, 4096, 24, False),
    "flux1_fused_qkv": (1, 512, 4096, 24, True),
    "flux2_dev": (1, 512, 4096, 48, False),
    "flux2_dev_fused_qkv": (1, 512, 4096, 48, True),
    "flux2_klein_9b": (1, 512, 4096, 32, False),
    "flux2_dev_batch2": (2, 512, 1024, 48, False),
    "flux2_dev_short_text": (1, 77, 4096, 48, False),
}


def float64_bound_check(out, x, w, cos, sin, eps=1e-6):
    """rounding=fp32 is close: every q/k element within the driver's float64 bound
    (tests/cases/joint_qknorm_rope_cases.cpp): 3u m + 2u |want| + 1e-5 m, m = |a cos| + |b sin|."""
    q1, k1, _, q2, k2, _ = x
    ok = True
    for got, a, b, wa, wb in ((out[0], q1, q2, w[0], w[2]), (out[1], k1, k2, w[1], w[3])):
        D = a.shape[-1]
        n = torch.cat([torch.nn.functional.rms_norm(a.double(), (D,), wa.double(), eps),
                       torch.nn.functional.rms_norm(b.double(), (D,), wb.double(), eps)], 1)
        real, imag = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-imag, real], -1).flatten(3)
        c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
        want = n * c + rotated * s
        m = (n * c).abs() + (rotated * s).abs()
        u = 2.0 ** -8
        ok &= bool(((got.double() - want).abs() <= 3 * u * m + 2 * u * want.abs() + 1e-5 * m + 1e-30).all())
    return ok


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    ok = True
    for name, case in VERIFY.items():
        gen.manual_seed(sum(map(ord, name)))  # fixed per case (hash() is salted per process)
        x, w, cos, sin, cache, positions = make(case, gen)
        want = model_chain(x, w, cos, sin)
        oracle = eager_chain(*x, *w, cache, positions, 128, False, 1e-6, True)
        chains_agree = all(torch.equal(a, b) for a, b in zip(want, oracle))
        ok &= chains_agree
        for rounding in ("rounded", "fp32"):
            out = outputs_like(x)
            impl = dt.run(x, w, cache, positions, out, rounding=rounding)
            torch.cuda.synchronize()
            equal = all(torch.equal(a, b) for a, b in zip(out, want))
            differ = sum(int((a != b).sum()) for a, b in zip(out, want))
            worst = max(float((a.double() - b.double()).abs().max()) for a, b in zip(out, want))
            if rounding == "rounded":
                ok &= equal
                check = {"torch_equal": equal, "model_chain_equals_eager_chain": chains_agree}
            else:  # close: its own oracle and bound; v is a copy in either mode
                within = float64_bound_check(out, x, w, cos, sin) and torch.equal(out[2], want[2])
                ok &= within
                check = {"equal_to_rounded_chain": equal, "within_bound": within}
            print(f"{name:22s} {rounding:8s} {impl:26s} "
                  f"{'torch.equal' if equal else f'{differ} differ, max {worst:.3g}'}"
                  f"{'' if chains_agree else ' (the model chain and the eager chain DIFFER)'}", flush=True)
            rows.append(dict(kind="verify", op="joint_qknorm_rope", impl=impl, case=name, dtype="torch.bfloat16",
                             rounding=rounding, differing=differ, max_abs_diff=worst, **check))
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    case = VERIFY["flux2_dev"]
    x, w, cos, sin, cache, positions = make(case, gen)
    out = outputs_like(x)
    dt.run(x, w, cache, positions, out)  # compile outside the capture
    graph = graph_on_side_stream(lambda s: dt.run(x, w, cache, positions, out, stream=s))
    ok = True
    for trial in range(2):
        fresh, _, _, _, _, _ = make(case, gen)
        for a, b in zip(x, fresh):
            a.copy_(b)
        graph.replay()
        torch.cuda.synchronize()
        equal = all(torch.equal(a, b) for a, b in zip(out, model_chain(fresh, w, cos, sin)))
        ok &= equal
        rows.append(dict(kind="graph", op="joint_qknorm_rope", case="flux2_dev", trial=trial, equal=equal))
    print("graph replay:", "equal" if ok else "DIFFERS")
    return ok


BENCH = {
    "flux1 (1x(512+4096), 24x128)": VERIFY["flux1"],
    "flux2_dev (1x(512+4096), 48x128)": VERIFY["flux2_dev"],
    "flux2_dev fused qkv (1x(512+4096), 48x128)": VERIFY["flux2_dev_fused_qkv"],
}


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(model_chain, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(44)
    for name, case in BENCH.items():
        if not case_selected(name):
            continue
        x, w, cos, sin, cache, positions = make(case, gen)
        out = outputs_like(x)
        J = cache.shape[0]
        nbytes = 2 * sum(t.numel() * 2 for t in x) + J * cache.shape[1] * 4 + J * 8
        sets = []
        for _ in range(rotation_count(nbytes)):
            if case[4]:  # keep the packed views' strides: copies of the two projections
                first, second = x[0]._base.clone(), x[3]._base.clone()
                H, D = x[0].shape[2], x[0].shape[3]
                xs = [t.unflatten(-1, (H, D)) for p in (first, second) for t in p.chunk(3, -1)]
            else:
                xs = [t.clone() for t in x]
            sets.append((xs, outputs_like(x), *copy_buffers(nbytes)))
        one_kernel_graph = graph_on_side_stream(lambda s: dt.run(x, w, cache, positions, out, stream=s))
        measured = measure([
            copy_impl(sets, lambda s: s[2], lambda s: s[3]),
            ("torch_eager", lambda: model_chain(x, w, cos, sin),
             [lambda s=s: model_chain(s[0], w, cos, sin) for s in sets]),
            ("torch_compile", lambda: compiled(x, w, cos, sin),
             [lambda s=s: compiled(s[0], w, cos, sin) for s in sets]),
            ("ditops:jit", one_kernel_graph.replay,
             [lambda s=s: dt.run(s[0], w, cache, positions, s[1]) for s in sets])])
        report(measured, rows, meta, "joint_qknorm_rope", name, shape_str(x[0].shape, x[3].shape), nbytes, 44)
        sets = x = out = one_kernel_graph = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
