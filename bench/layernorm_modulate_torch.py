"""layernorm_modulate family on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification: torch.equal (int16 / uint8 views) against the eager chain on CUDA over SGLang's
   test grid: amplitudes 1e-4/1/100, eps 1e-6/1e-5, shift on/off, chunk(4)/chunk(6) views,
   signed zeros and scales -1/0/1, every row mapping; per-head QK LayerNorm; fp8 against
   `(y.float() * (1.0 / input_scale)).clamp(-448, 448).to(torch.float8_e4m3fn)` (eager
   `1.0 / tensor` is Tensor.reciprocal, an IEEE division: fp8_reciprocal=ieee matches it).
2. Benchmark at the model shapes: device copy, eager, torch.compile, ditops, each timed cold
   (triton.testing.do_bench; ditops launched as a one-kernel CUDA graph) and rotated (buffer sets
   over 3x the L2 captured round after round in one CUDA graph) and cold with every implementation
   alone in a CUDA graph ("cold_graph"), medians; GB/s by the byte model
   and the fraction of a device copy timed the same way (torch_bench_common.measure / report).
"""
import ctypes
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, copy_buffers, copy_impl, dltensor, graph_on_side_stream as as_graph,
                                case_selected, load_eager, measure, report, report_header, rotation_count, script_main,
                                shape_str)


MAPPINGS = {"auto": "automatic", "warp": "warp", "cta": "cta"}


class Ditops(DitopsLib):
    def ln_mod(self, x, scale, shift, out, eps, mapping="auto", stream=None):
        return self.call("layernorm_modulate", stream, dict(eps=eps, mapping=MAPPINGS[mapping], backend="jit"),
                         x=x, scale=scale, shift=shift, out=out)

    def ln_mod_fp8(self, x, scale, shift, input_scale, out, eps, mapping="auto", div_full=False, stream=None):
        return self.call("layernorm_modulate_fp8", stream,
                         dict(eps=eps, mapping=MAPPINGS[mapping], fp8_reciprocal="div_full" if div_full else "ieee",
                              backend="jit"),
                         x=x, scale=scale, shift=shift, input_scale=input_scale, out=out)

    def qk(self, q, k, qo, ko, eps, stream=None):
        return self.call("qk_head_layernorm", stream, dict(eps=eps, backend="jit"), q=q, k=k, q_out=qo, k_out=ko)


# One copy of the eager chains, in the Python package; loaded by path so this script needs no
# compiled ditops module (only libditops through ctypes).
_eager = load_eager()
eager, quant = _eager.layernorm_modulate_eager, _eager.static_quant_fp8_eager
qk_eager = _eager.qk_head_layernorm_eager


def same(a, b):
    v = torch.int16 if a.element_size() == 2 else torch.uint8
    return torch.equal(a.contiguous().view(v), b.contiguous().view(v))


def make(B, S, D, chunks, amp, gen):
    x = (torch.randn(B, S, D, device="cuda", generator=gen) * amp + 0.3 * amp).bfloat16()
    x.view(-1)[::97] = 0.0
    x.view(-1)[1::89] = -0.0
    emb = (torch.randn(B, chunks * D, device="cuda", generator=gen) * 0.3).bfloat16()
    idx = torch.arange(0, chunks * D, 31, device="cuda")
    emb[:, idx] = ((idx % 3) - 1).to(torch.bfloat16)[None, :].expand(B, -1)  # scales -1, 0, 1
    emb[:, 5::41] = -0.0
    parts = emb.chunk(chunks, dim=1)
    return x, parts[0], parts[1]


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok = True
    shapes = [(1, 1, 128, 4), (1, 4359, 4096, 4), (2, 1024, 4096, 4), (1, 4608, 3072, 6), (2, 300, 3072, 6),
              (1, 37, 2240, 6), (2, 1024, 2240, 6), (1, 17, 256, 6), (1, 9, 8192, 4), (1, 64, 5120, 6)]
    n = 0
    for B, S, D, chunks in shapes:
        for amp, eps in ((1e-4, 1e-6), (1.0, 1e-6), (100.0, 1e-5)):
            x, scale, shift = make(B, S, D, chunks, amp, gen)
            for sh in (shift, None):
                ref = eager(x, scale, sh, eps)
                for mapping in ("auto", "warp", "cta"):
                    out = torch.empty_like(x)
                    dt.ln_mod(x, scale, sh, out, eps, mapping)
                    n += 1
                    if not same(out, ref):
                        ok = False
                        bad = (out.view(torch.int16) != ref.view(torch.int16)).sum().item()
                        print(f"MISMATCH ln_mod {(B, S, D)} amp={amp} eps={eps} shift={sh is not None} "
                              f"{mapping}: {bad} elements")
    print(f"layernorm_modulate: {n} runs, {'all torch.equal' if ok else 'MISMATCHES'}")
    qk_ok = True
    for B, S, H, Dh in ((1, 4360, 32, 128), (2, 37, 3, 40), (1, 129, 5, 64), (1, 7, 2, 4)):
        q = (torch.randn(B, S, H, Dh, device="cuda", generator=gen) * 3 + 1).bfloat16()
        k = torch.randn(B, S, H, Dh, device="cuda", generator=gen).bfloat16()
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        dt.qk(q, k, qo, ko, 1e-6)
        ref_q, ref_k = qk_eager(q, k, 1e-6)
        good = same(qo, ref_q) and same(ko, ref_k)
        qk_ok &= good
        if not good:
            print(f"MISMATCH qk_head {(B, S, H, Dh)}")
    print(f"qk_head_layernorm: {'all torch.equal' if qk_ok else 'MISMATCHES'}")
    fp8_ok = True
    s1 = torch.tensor([0.4754464328289032], device="cuda")
    print("eager 1.0/input_scale == IEEE fp32 reciprocal:",
          (1.0 / s1).item() == torch.tensor(1.0 / s1.double().item(), dtype=torch.float32).item())
    for rows_ in (1, 127, 512):
        x, scale, shift = make(1, rows_, 6144, 6, 3.0, gen)
        y = eager(x, scale, shift, 1e-6)
        for s in (0.005, 0.03125, 0.25, 0.4754464328289032, 1.0):
            st = torch.tensor([s], device="cuda", dtype=torch.float32)
            ref = quant(y, st)
            for mapping in ("auto", "warp", "cta"):
                out = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
                dt.ln_mod_fp8(x, scale, shift, st, out, 1e-6, mapping)
                if not same(out, ref):
                    fp8_ok = False
                    print(f"MISMATCH fp8 rows={rows_} s={s} {mapping}")
            out = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
            dt.ln_mod_fp8(x, scale, shift, st, out, 1e-6, div_full=True)
            d = (out.view(torch.uint8) != ref.view(torch.uint8)).sum().item()
            print(f"  fp8 div_full rows={rows_} s={s}: {d} bytes differ from the eager (IEEE) quant")
    print(f"layernorm_modulate_fp8 (ieee): {'all torch.equal' if fp8_ok else 'MISMATCHES'}")
    rows.append(dict(kind="verify", op="layernorm_modulate", ln_mod=ok, qk_head=qk_ok, fp8=fp8_ok, **meta))
    return ok and qk_ok and fp8_ok




def run_bench(dt, rows, meta):
    allow_recompiles()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    compiled = torch.compile(eager, dynamic=False)
    compiled_q = torch.compile(lambda y, s: quant(y, s), dynamic=False)
    compiled_fp8 = torch.compile(lambda x, a, b, s, e: quant(eager(x, a, b, e), s), dynamic=False)
    compiled_qk = torch.compile(lambda q, k: qk_eager(q, k, 1e-6), dynamic=False)
    report_header()
    cases = [("FLUX.1 (1,4608,3072)", 1, 4608, 3072), ("Qwen CFG (2,6912,3072)", 2, 6912, 3072),
             ("Wan (1,32760,5120)", 1, 32760, 5120), ("(1,512,3072)", 1, 512, 3072),
             ("GLM (1,4096,4096)", 1, 4096, 4096), ("FLUX.2 fp8 (1,4608,6144)", 1, 4608, 6144),
             ("FLUX.2 fp8 (1,512,6144)", 1, 512, 6144), ("GLM qk-head (1,4360,32,128)", 1, 4360, 32 * 128)]
    st = torch.tensor([0.03125], device="cuda")
    for name, B, S, D in cases:
        if not case_selected(name):
            continue
        fp8, qk = "fp8" in name, "qk-head" in name
        nbytes = 8 * B * S * D if qk else B * S * D * (3 if fp8 else 4) + 4 * B * D
        sets = []  # dicts of one call's tensors
        for _ in range(rotation_count(nbytes)):
            x, scale, shift = make(B, S, D, 6, 1.0, gen)
            t = dict(x=x, scale=scale, shift=shift)
            if qk:
                t.update(q=x.view(B, S, 32, 128), k=x.clone().view(B, S, 32, 128))
                t.update(qo=torch.empty_like(t["q"]), ko=torch.empty_like(t["k"]))
            else:
                t["out"] = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn if fp8 else x.dtype)
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        if qk:
            ditops_fn = lambda t, s=None: dt.qk(t["q"], t["k"], t["qo"], t["ko"], 1e-6, stream=s)  # noqa: E731
            torch_fns = [("torch_eager", lambda t: qk_eager(t["q"], t["k"], 1e-6)),
                         ("torch_compile", lambda t: compiled_qk(t["q"], t["k"]))]
        elif fp8:
            ditops_fn = lambda t, s=None: dt.ln_mod_fp8(t["x"], t["scale"], t["shift"], st, t["out"], 1e-6, stream=s)  # noqa: E731
            torch_fns = [("torch_eager", lambda t: quant(eager(t["x"], t["scale"], t["shift"], 1e-6), st)),
                         ("torch_compile", lambda t: compiled_fp8(t["x"], t["scale"], t["shift"], st, 1e-6)),
                         ("torch_compile:quant_only", lambda t: compiled_q(t["x"], st))]
        else:
            ditops_fn = lambda t, s=None: dt.ln_mod(t["x"], t["scale"], t["shift"], t["out"], 1e-6, stream=s)  # noqa: E731
            torch_fns = [("torch_eager", lambda t: eager(t["x"], t["scale"], t["shift"], 1e-6)),
                         ("torch_compile", lambda t: compiled(t["x"], t["scale"], t["shift"], 1e-6))]
        t0 = sets[0]
        ditops_fn(t0)
        one_kernel_graph = as_graph(lambda s: ditops_fn(t0, s))  # cold: the ctypes call's host time would outlast a short kernel
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"])]
        impls += [(label, lambda f=f: f(t0), [lambda t=t, f=f: f(t) for t in sets]) for label, f in torch_fns]
        impls.append(("ditops:jit", one_kernel_graph.replay, [lambda t=t: ditops_fn(t) for t in sets]))
        report(measure(impls), rows, meta, "layernorm_modulate", name,
               shape_str((B, S, 32, 128) if qk else (B, S, D)), nbytes)
        sets = t0 = one_kernel_graph = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
