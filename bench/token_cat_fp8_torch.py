"""token_cat_fp8 on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal on uint8 views:
   * fp8_reciprocal=ieee against the eager chain
     `(torch.cat([attn, mlp], -1).float() * (1.0 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)`;
   * fp8_reciprocal=div_full against an emulation of SGLang's Triton quantizer (try_flux2_token_cat_fp8):
     inv = 1.0 / scale computed by a Triton kernel (Triton lowers it to div.full.f32), then the
     same product, clamp and cast;
   over tokens {1, 127, 4096, 4608, 16384} x widths (6144, 18432) and (3072, 9216), bf16, a few
   scales; then f16, odd widths and inputs off 16-byte alignment (storage offsets).
2. Benchmark at the FLUX.2 shapes: device copy of the same bytes, eager (cat + quant),
   torch.compile of it, ditops (ieee, and div_full), each timed cold (triton.testing.do_bench; ditops
   launched as a one-kernel CUDA graph), rotated (buffer sets over 3x the L2 in one CUDA graph) and
   cold alone in a CUDA graph, medians; byte model: attn and mlp read once (2 bytes each), out
   written once (1 byte): 3 * rows * (Da + Dm) bytes.
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)


class Ditops(DitopsLib):
    def token_cat(self, attn, mlp, input_scale, out, div_full=False, stream=None, pdl=True):
        return self.call("token_cat_fp8", stream,
                         dict(fp8_reciprocal="div_full" if div_full else "ieee", use_pdl=pdl, backend="jit"),
                         attn=attn, mlp=mlp, input_scale=input_scale, out=out)


_eager = load_eager()
eager = _eager.token_cat_fp8_eager

_div_full_kernel = None


def div_full_inverse(scale):
    """1.0 / scale as SGLang's Triton static_quant_fp8 computes it (a Triton division of fp32:
    div.full.f32), as a one-element fp32 tensor."""
    global _div_full_kernel
    if _div_full_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def inverse(s_ptr, o_ptr):
            s = tl.load(s_ptr)
            tl.store(o_ptr, 1.0 / s)

        _div_full_kernel = inverse
    out = torch.empty(1, device="cuda", dtype=torch.float32)
    _div_full_kernel[(1,)](scale, out)
    return out


def sglang_emulation(attn, mlp, scale):
    """static_quant_fp8(cat([attn, mlp], -1), scale) with the Triton reciprocal."""
    inv = div_full_inverse(scale)
    return (torch.cat([attn, mlp], -1).float() * inv).clamp(-448, 448).to(torch.float8_e4m3fn)


def same(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def make(B, S, Da, Dm, dtype, gen, offset=0, amp=3.0):
    def rand(D, scale):
        base = torch.empty(B * S * D + offset, device="cuda", dtype=dtype)
        v = base[offset:].view(B, S, D)
        v.copy_(torch.randn(B, S, D, device="cuda", generator=gen) * scale)
        return v
    attn, mlp = rand(Da, amp), rand(Dm, amp / 2)
    attn.view(-1)[::97] = 0.0
    mlp.view(-1)[1::89] = -0.0
    return attn, mlp


SHAPES = [(t, Da, Dm) for Da, Dm in ((6144, 18432), (3072, 9216)) for t in (1, 127, 4096, 4608, 16384)]
SCALES = (0.013, 0.4754464328289032, 0.03125)


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    for s in SCALES:
        st = torch.tensor([s], device="cuda", dtype=torch.float32)
        inv_ieee, inv_full = (1.0 / st).item(), div_full_inverse(st).item()
        print(f"scale {s}: IEEE 1/scale {inv_ieee!r}, Triton div.full {inv_full!r}"
              f"{' (differ)' if inv_ieee != inv_full else ''}")
    cases = [(1, t, Da, Dm, torch.bfloat16, 0) for t, Da, Dm in SHAPES]
    cases += [(1, 4608, 6144, 18432, torch.float16, 0), (2, 127, 3072, 9216, torch.float16, 0),
              (1, 127, 6144, 18432, torch.bfloat16, 1), (2, 33, 6143, 18433, torch.bfloat16, 0),
              (2, 33, 5, 7, torch.float16, 3), (1, 1, 16, 1, torch.bfloat16, 0), (1, 64, 0, 24, torch.bfloat16, 0)]
    for B, S, Da, Dm, dtype, offset in cases:
        attn, mlp = make(B, S, Da, Dm, dtype, gen, offset)
        for s in SCALES if S <= 4608 else SCALES[:1]:
            st = torch.tensor([s], device="cuda", dtype=torch.float32)
            for div_full in (False, True):
                want = sglang_emulation(attn, mlp, st) if div_full else eager(attn, mlp, st)
                out = torch.empty(B, S, Da + Dm, device="cuda", dtype=torch.float8_e4m3fn)
                impl = dt.token_cat(attn, mlp, st, out, div_full=div_full)
                torch.cuda.synchronize()
                equal = same(out, want)
                n += 1
                if not equal:
                    ok = False
                    bad = (out.view(torch.uint8) != want.view(torch.uint8)).sum().item()
                    print(f"MISMATCH {impl} {(B, S, Da, Dm)} {dtype} offset={offset} scale={s}: {bad} bytes", flush=True)
                rows.append(dict(kind="verify", op="token_cat_fp8", impl=impl, shape=[B, S, Da, Dm], dtype=str(dtype),
                                 storage_offset=offset, scale=s, oracle="sglang_div_full" if div_full else "eager",
                                 torch_equal=equal))
    # Special values in both paths: signed zeros, bf16 subnormals, e4m3 rounding midpoints, +-448 and
    # beyond, +-inf, NaN of both signs (eager's NaN byte on CUDA is the contract's 0x7F).
    specials = torch.tensor([0x0000, 0x8000, 0x0001, 0x8001, 0x3F88, 0x3F98, 0xBF98, 0x3A80, 0xBA80, 0x3AC0,
                             0x3B40, 0x3C70, 0x43E0, 0xC3E0, 0x43E8, 0x43F0, 0x7149, 0xF149, 0x7F80, 0xFF80,
                             0x7FC0, 0xFFC0, 0x4348, 0x4378], dtype=torch.int32, device="cuda").to(torch.int16)
    for Da in (64, 63):
        attn, mlp = make(1, 5, Da, 128, torch.bfloat16, gen)
        attn.view(torch.int16).view(-1)[: 3 * specials.numel(): 3] = specials
        for s in (1.0, 0.013):
            st = torch.tensor([s], device="cuda", dtype=torch.float32)
            for div_full in (False, True):
                want = sglang_emulation(attn, mlp, st) if div_full else eager(attn, mlp, st)
                out = torch.empty(1, 5, Da + 128, device="cuda", dtype=torch.float8_e4m3fn)
                impl = dt.token_cat(attn, mlp, st, out, div_full=div_full)
                torch.cuda.synchronize()
                equal = same(out, want)
                n += 1
                if not equal:
                    ok = False
                    print(f"MISMATCH special values {impl} Da={Da} scale={s}: "
                          f"{(out.view(torch.uint8) != want.view(torch.uint8)).sum().item()} bytes", flush=True)
                rows.append(dict(kind="verify", op="token_cat_fp8", impl=impl, shape=[1, 5, Da, 128], dtype="special",
                                 storage_offset=0, scale=s, oracle="sglang_div_full" if div_full else "eager",
                                 torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == 'token_cat_fp8')}/{n} runs torch.equal "
          f"(ieee vs eager, div_full vs the Triton emulation)")
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    attn, mlp = make(1, 4608, 6144, 18432, torch.bfloat16, gen)
    st = torch.tensor([0.013], device="cuda")
    out = torch.empty(1, 4608, 24576, device="cuda", dtype=torch.float8_e4m3fn)
    dt.token_cat(attn, mlp, st, out)  # resolve outside the capture
    graph = graph_on_side_stream(lambda stream: dt.token_cat(attn, mlp, st, out, stream=stream))
    results = {}
    for trial, s in enumerate((0.013, 0.02, 0.4754464328289032)):
        a2, m2 = make(1, 4608, 6144, 18432, torch.bfloat16, gen)
        attn.copy_(a2)
        mlp.copy_(m2)
        st.fill_(s)  # the scale is read on the device at every replay
        graph.replay()
        torch.cuda.synchronize()
        results[f"replay_{trial}_equal"] = same(out, eager(a2, m2, st))
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="token_cat_fp8", **results))
    return all(results.values())


BENCH = [("flux2 (1,4608) 6144+18432", 1, 4608, 6144, 18432), ("flux2 (1,4096) 6144+18432", 1, 4096, 6144, 18432),
         ("flux2 (1,16384) 6144+18432", 1, 16384, 6144, 18432), ("flux2 (1,127) 6144+18432", 1, 127, 6144, 18432),
         ("flux2 (1,1) 6144+18432", 1, 1, 6144, 18432), ("klein (1,4608) 3072+9216", 1, 4608, 3072, 9216)]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    st = torch.tensor([0.013], device="cuda")
    report_header(30)
    for name, B, S, Da, Dm in BENCH:
        if not case_selected(name):
            continue
        nbytes = 3 * B * S * (Da + Dm)
        sets = []  # dicts of one call's tensors
        for _ in range(rotation_count(nbytes)):
            attn, mlp = make(B, S, Da, Dm, torch.bfloat16, gen)
            t = dict(attn=attn, mlp=mlp, out=torch.empty(B, S, Da + Dm, device="cuda", dtype=torch.float8_e4m3fn))
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]

        def ditops_fn(t, s=None, div_full=False):
            return dt.token_cat(t["attn"], t["mlp"], st, t["out"], div_full=div_full, stream=s)

        graphs = {}  # cold: the ctypes call's host time would outlast a short kernel: ditops runs as a one-kernel graph
        for div_full in (False, True):
            ditops_fn(t0, div_full=div_full)
            graphs[div_full] = graph_on_side_stream(lambda s, d=div_full: ditops_fn(t0, s, d))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["attn"], t0["mlp"], st),
                  [lambda t=t: eager(t["attn"], t["mlp"], st) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["attn"], t0["mlp"], st),
                  [lambda t=t: compiled(t["attn"], t["mlp"], st) for t in sets]),
                 ("ditops:jit", graphs[False].replay, [lambda t=t: ditops_fn(t) for t in sets]),
                 ("ditops:jit:div_full", graphs[True].replay, [lambda t=t: ditops_fn(t, div_full=True) for t in sets])]
        report(measure(impls), rows, meta, "token_cat_fp8", name, shape_str((B, S, Da), (B, S, Dm)), nbytes, 30)
        sets = t0 = graphs = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
