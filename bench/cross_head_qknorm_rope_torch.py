"""cross_head_qknorm_rope on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. VERIFY: torch.equal against the eager chain (ditops.eager.cross_head_qknorm_rope_eager:
   torch.nn.RMSNorm over the whole row, then the model's RoPE) at Wan 14B / 1.3B, Wan's text
   cross-attention, LTX-2 video / audio (split, per-head tables), LTX-2's interleaved form, its
   a2v cross attention (k from the other modality, own tables), fp16, batch 2, a packed QKV view,
   with and without weights; rounding=fp32 reports its distance (close).
2. GRAPH: a captured call replayed on new inputs equals the eager chain.
3. Benchmark at Wan 14B (1 x 32760, 5120) and LTX-2 video (1 x 6144 and 1 x 24576, 32 x 128):
   ditops beside the eager chain, torch.compile of it and a device copy of the same bytes (q and k
   read and written once, each table read once), cold L2, rotated buffers in one CUDA graph, and
   alone in a graph from a cleared L2.

--lib PATH (libditops), --json PATH, --commit SHA, --skip-bench; DITOPS_BENCH_CASES /
DITOPS_BENCH_IMPLS select cases and implementations (torch_bench_common.py).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count, script_main,
                                shape_str)

_eager = load_eager()
chain = _eager.cross_head_qknorm_rope_eager


class Ditops(DitopsLib):
    def run(self, q, k, wq, wk, tables, *, head_dim, rope, rounding="rounded", stream=None, backend=None):
        return self.call("cross_head_qknorm_rope", stream,
                         dict(head_dim=head_dim, rope=rope, rounding=rounding, backend=backend),
                         q=q, k=k, q_weight=wq, k_weight=wk, **tables)


def tables_for(kind, B, S, H, D, gen):
    """cos/sin as the models build them, and the views the op reads ([1|B, S, 1|H, D/2])."""
    dev = "cuda"
    if kind == "wan":  # WanRotaryPosEmbed: [1, S, 1, D], each frequency twice; cos[..., 0::2], sin[..., 1::2]
        t = torch.arange(S, device=dev, dtype=torch.float64)[:, None]
        inv = 10000.0 ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
        cos = torch.cos(t * inv).repeat_interleave(2, -1).float().reshape(1, S, 1, D)
        sin = torch.sin(t * inv).repeat_interleave(2, -1).float().reshape(1, S, 1, D)
        return cos[..., 0::2], sin[..., 1::2]
    if kind == "per_head":  # LTX-2 split: [B, H, S, D/2], read as [B, S, H, D/2]
        angle = torch.rand(B, H, S, D // 2, device=dev, generator=gen) * 6.3
        return angle.cos().transpose(1, 2), angle.sin().transpose(1, 2)
    if kind == "full_width":  # LTX-2 interleaved: [B, S, H*D], each frequency twice
        angle = torch.rand(B, S, H * D // 2, device=dev, generator=gen).repeat_interleave(2, -1) * 6.3
        return (angle.cos()[..., 0::2].unflatten(-1, (H, D // 2)), angle.sin()[..., 0::2].unflatten(-1, (H, D // 2)))
    raise ValueError(kind)


def make(case, gen, dtype=torch.bfloat16):
    B, S, Nq, Sk, Nk, D, rope, table, weights, packed = case
    dev = "cuda"
    if packed:  # q and k: chunks of a fused QKV projection (Wan's to_qkv)
        qkv = torch.randn(B, S, 3 * Nq, device=dev, generator=gen).to(dtype)
        q, k = qkv[..., :Nq], qkv[..., Nq:2 * Nq]
    else:
        q = torch.randn(B, S, Nq, device=dev, generator=gen).to(dtype)
        k = torch.randn(B, Sk, Nk, device=dev, generator=gen).to(dtype)
    wq = wk = None
    if weights:
        wq = (1 + 0.25 * torch.randn(Nq, device=dev, generator=gen)).to(dtype)
        wk = (1 + 0.25 * torch.randn(Nk, device=dev, generator=gen)).to(dtype)
    tables = {}
    if rope != "none":
        tables["q_cos"], tables["q_sin"] = tables_for(table, B, S, Nq // D, D, gen)
        if Sk != S:
            tables["k_cos"], tables["k_sin"] = tables_for(table, B, Sk, Nk // D, D, gen)
    return q, k, wq, wk, tables


# (B, S, Nq, Sk, Nk, head_dim, rope, table, weights, packed)
VERIFY = {
    "wan14b": (1, 32760, 5120, 32760, 5120, 128, "interleaved", "wan", True, False),
    "wan14b_short": (1, 4680, 5120, 4680, 5120, 128, "interleaved", "wan", True, False),
    "wan14b_batch2": (2, 1560, 5120, 1560, 5120, 128, "interleaved", "wan", True, False),
    "wan1.3b": (1, 32760, 1536, 32760, 1536, 128, "interleaved", "wan", True, False),
    "wan_fused_qkv": (1, 1560, 5120, 1560, 5120, 128, "interleaved", "wan", True, True),
    "wan_cross": (1, 32760, 5120, 512, 5120, 128, "none", None, True, False),
    "ltx2_video": (1, 6144, 4096, 6144, 4096, 128, "split", "per_head", False, False),
    "ltx2_video_weights": (1, 6144, 4096, 6144, 4096, 128, "split", "per_head", True, False),
    "ltx2_audio": (1, 126, 2048, 126, 2048, 64, "split", "per_head", False, False),
    "ltx2_a2v": (1, 6144, 2048, 126, 2048, 64, "split", "per_head", False, False),
    "ltx2_video_batch2": (2, 3072, 4096, 3072, 4096, 128, "split", "per_head", False, False),
    "ltx2_interleaved": (1, 6144, 4096, 6144, 4096, 128, "interleaved", "full_width", False, False),
    "ltx2_text_cross": (1, 6144, 4096, 1024, 4096, 128, "none", None, False, False),
}


def float64_bound_check(out, x, w, cos, sin, head_dim, rope, eps=1e-6):
    """rounding=fp32 is close: every element within the contract's float64 bound, the driver's
    (tests/cases/cross_head_qknorm_rope_cases.cpp): |out - want| <= 3u m + 2u |want| + 1e-5 m +
    floor, want the chain in float64, m = |a cos| + |c sin| per rotated pair (|n| unrotated)."""
    n = torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), None if w is None else w.double(), eps)
    heads = n.unflatten(-1, (n.shape[-1] // head_dim, head_dim))
    if rope == "none":
        want, m = heads, heads.abs()
    else:
        if rope == "interleaved":
            a, c = heads.unflatten(-1, (-1, 2)).unbind(-1)
        else:
            a, c = heads[..., : head_dim // 2], heads[..., head_dim // 2:]
        co, si = cos.double(), sin.double()
        first, second = a * co - c * si, c * co + a * si
        mag = (a * co).abs() + (c * si).abs()
        mag2 = (c * co).abs() + (a * si).abs()
        if rope == "interleaved":
            want = torch.stack([first, second], -1).flatten(-2)
            m = torch.stack([mag, mag2], -1).flatten(-2)
        else:
            want, m = torch.cat([first, second], -1), torch.cat([mag, mag2], -1)
    u = 2.0 ** -11 if x.dtype == torch.float16 else 2.0 ** -8
    floor = 3 * 2.0 ** -24 if x.dtype == torch.float16 else 1e-30
    bound = 3 * u * m + 2 * u * want.abs() + 1e-5 * m + floor
    return bool(((out.double() - want.flatten(-2)).abs() <= bound.flatten(-2)).all())


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    ok = True
    for name, case in VERIFY.items():
        for dtype in (torch.bfloat16, torch.float16) if name == "wan14b_short" else (torch.bfloat16,):
            gen.manual_seed(sum(map(ord, name)))  # fixed per case (hash() is salted per process)
            q, k, wq, wk, tables = make(case, gen, dtype)
            D, rope = case[5], case[6]
            want_q, want_k = chain(q, k, wq, wk, **tables, head_dim=D, rope=rope)
            for rounding in ("rounded", "fp32"):
                q2, k2 = q.clone(), k.clone()
                if case[9]:  # keep the packed views' strides: a copy of the whole projection
                    qkv = q._base.clone()
                    q2, k2 = qkv[..., :case[2]], qkv[..., case[2]:2 * case[2]]
                impl = dt.run(q2, k2, wq, wk, tables, head_dim=D, rope=rope, rounding=rounding)
                torch.cuda.synchronize()
                equal = torch.equal(q2, want_q) and torch.equal(k2, want_k)
                differ = int((q2 != want_q).sum() + (k2 != want_k).sum())
                worst = max(float((q2.double() - want_q.double()).abs().max()),
                            float((k2.double() - want_k.double()).abs().max()))
                if rounding == "rounded":
                    ok &= equal
                else:  # close: its own oracle and bound
                    k_cos, k_sin = tables.get("k_cos", tables.get("q_cos")), tables.get("k_sin", tables.get("q_sin"))
                    within = (float64_bound_check(q2, q, wq, tables.get("q_cos"), tables.get("q_sin"), D, rope)
                              and float64_bound_check(k2, k, wk, k_cos, k_sin, D, rope))
                    ok &= within
                print(f"{name:20s} {str(dtype)[6:]:9s} {rounding:8s} {impl:28s} "
                      f"{'torch.equal' if equal else f'{differ} differ, max {worst:.3g}'}", flush=True)
                # rounding=fp32 is close: its distance is recorded, not counted as a torch.equal check
                check = {"torch_equal": equal} if rounding == "rounded" else \
                    {"equal_to_rounded_chain": equal, "within_bound": within}
                rows.append(dict(kind="verify", op="cross_head_qknorm_rope", impl=impl, case=name, dtype=str(dtype),
                                 rounding=rounding, differing=differ, max_abs_diff=worst, **check))
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    case = VERIFY["wan14b_short"]
    q, k, wq, wk, tables = make(case, gen)
    dt.run(q, k, wq, wk, tables, head_dim=128, rope="interleaved")  # compile outside the capture
    graph = graph_on_side_stream(lambda s: dt.run(q, k, wq, wk, tables, head_dim=128, rope="interleaved", stream=s))
    ok = True
    for trial in range(2):
        q0, k0, _, _, _ = make(case, gen)
        q.copy_(q0)
        k.copy_(k0)
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_k = chain(q0, k0, wq, wk, **tables, head_dim=128, rope="interleaved")
        equal = torch.equal(q, want_q) and torch.equal(k, want_k)
        ok &= equal
        rows.append(dict(kind="graph", op="cross_head_qknorm_rope", case="wan14b_short", trial=trial, equal=equal))
    print("graph replay:", "equal" if ok else "DIFFERS")
    return ok


BENCH = {
    "wan14b (1x32760, 40x128)": VERIFY["wan14b"],
    "wan1.3b (1x32760, 12x128)": VERIFY["wan1.3b"],
    "ltx2_video (1x6144, 32x128)": VERIFY["ltx2_video"],
    "ltx2_video (1x24576, 32x128)": (1, 24576, 4096, 24576, 4096, 128, "split", "per_head", False, False),
    "ltx2_audio (1x126, 32x64)": VERIFY["ltx2_audio"],
}


def table_bytes(tables):
    """Each distinct table read once: the elements its view addresses, 4 bytes each."""
    seen, total = set(), 0
    for t in tables.values():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * 4
    return total


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(chain, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(30)
    for name, case in BENCH.items():
        if not case_selected(name):
            continue
        D, rope = case[5], case[6]
        q, k, wq, wk, tables = make(case, gen)
        nbytes = 2 * (q.numel() + k.numel()) * 2 + table_bytes(tables)
        sets = []
        for _ in range(rotation_count(nbytes)):
            q1, k1 = q.clone(), k.clone()
            sets.append((q1, k1, *copy_buffers(nbytes)))
        one_kernel_graph = graph_on_side_stream(
            lambda s: dt.run(q, k, wq, wk, tables, head_dim=D, rope=rope, stream=s))
        measured = measure([
            copy_impl(sets, lambda s: s[2], lambda s: s[3]),
            ("torch_eager", lambda: chain(q, k, wq, wk, **tables, head_dim=D, rope=rope),
             [lambda s=s: chain(s[0], s[1], wq, wk, **tables, head_dim=D, rope=rope) for s in sets]),
            ("torch_compile", lambda: compiled(q, k, wq, wk, **tables, head_dim=D, rope=rope),
             [lambda s=s: compiled(s[0], s[1], wq, wk, **tables, head_dim=D, rope=rope) for s in sets]),
            ("ditops:jit", one_kernel_graph.replay,
             [lambda s=s: dt.run(s[0], s[1], wq, wk, tables, head_dim=D, rope=rope) for s in sets])])
        report(measured, rows, meta, "cross_head_qknorm_rope", name, shape_str(q.shape, k.shape), nbytes, 30)
        sets = q = k = one_kernel_graph = tables = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
