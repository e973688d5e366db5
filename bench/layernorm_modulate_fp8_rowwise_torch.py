"""layernorm_modulate_fp8_rowwise on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, byte for byte (out as uint8, out_scale as int32; a NaN scale equals a NaN) against the
   eager chain ditops.eager.layernorm_modulate_fp8_rowwise_eager: F.layer_norm(x) * (1 + scale[:, None])
   (+ shift[:, None]) in bf16, then torchao 0.18's rowwise recipe (fp8_rowwise_eager), with scale and
   shift as chunks of one adaLN projection, both row mappings, shift on and off, amplitudes 1e-4 to 100,
   at the model widths (FLUX.1 / Qwen-Image / HunyuanVideo 3072, FLUX.2 6144) and odd ones; zero rows.
2. Graph capture: a captured call replayed on new inputs.
3. Benchmark: FLUX.1 (1, 4608, 3072) and its 512 text tokens, Qwen-Image CFG (2, 6912, 3072), FLUX.2
   (1, 4608, 6144): device copy of the same bytes, eager, torch.compile, ditops; byte model: x read once
   (2 bytes), e4m3 written once and 4 bytes of scale a row (scale and shift rows are L2-resident):
   rows * (3 D + 4).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

_eager = load_eager()
eager = _eager.layernorm_modulate_fp8_rowwise_eager


class Ditops(DitopsLib):
    def ln(self, x, scale, shift, out, out_scale, mapping="automatic", stream=None, eps=1e-6):
        return self.call("layernorm_modulate_fp8_rowwise", stream, dict(eps=eps, mapping=mapping, backend="jit"),
                         x=x, scale=scale, shift=shift, out=out, out_scale=out_scale)


def make(B, S, D, gen, amp=1.0, shift=True):
    x = (torch.randn(B, S, D, device="cuda", generator=gen) * amp + 0.3).to(torch.bfloat16)
    emb = (torch.randn(B, 6 * D, device="cuda", generator=gen) * 0.3).to(torch.bfloat16)
    return x, emb[:, D:2 * D], emb[:, 2 * D:3 * D] if shift else None


def outputs(x):
    B, S, _ = x.shape
    return torch.empty_like(x, dtype=torch.float8_e4m3fn), torch.empty(B, S, 1, device="cuda", dtype=torch.float32)


def same(got, want):
    (q, s), (wq, ws) = got, want
    nan = torch.isnan(s) & torch.isnan(ws)
    return torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(
        torch.where(nan, 0, s.view(torch.int32)), torch.where(nan, 0, ws.view(torch.int32)))


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    shapes = [(1, 4608, 3072), (1, 512, 3072), (2, 6912, 3072), (1, 4608, 6144), (1, 127, 8192), (2, 33, 516),
              (3, 5, 12), (1, 1, 3072)]
    for B, S, D in shapes:
        for amp, eps in ((1e-4, 1e-6), (1.0, 1e-6), (100.0, 1e-5)):
            for shift in (True, False):
                x, scale, sh = make(B, S, D, gen, amp, shift)
                want = eager(x, scale, sh, eps)
                for mapping in ("warp", "cta"):
                    out = outputs(x)
                    impl = dt.ln(x, scale, sh, *out, mapping=mapping, eps=eps)
                    torch.cuda.synchronize()
                    equal = same(out, want)
                    n += 1
                    if not equal:
                        ok = False
                        bad = (out[0].view(torch.uint8) != want[0].view(torch.uint8)).sum().item()
                        print(f"MISMATCH {impl} {(B, S, D)} amp={amp} shift={shift} mapping={mapping}: {bad} bytes, "
                              f"{(out[1] != want[1]).sum().item()} scales", flush=True)
                    rows.append(dict(kind="verify", op="layernorm_modulate_fp8_rowwise", impl=impl, shape=[B, S, D],
                                     amplitude=amp, eps=eps, shift=shift, mapping=mapping,
                                     oracle="layernorm_modulate_fp8_rowwise_eager", torch_equal=equal))
    # Zero rows: 1 + scale = 0 makes every value a signed zero (scale 1 by our rule).
    x, scale, _ = make(2, 9, 3072, gen)
    scale.fill_(-1.0)
    out = outputs(x)
    dt.ln(x, scale, None, *out)
    torch.cuda.synchronize()
    equal = same(out, eager(x, scale, None, 1e-6))
    n += 1
    ok = ok and equal
    rows.append(dict(kind="verify", op="layernorm_modulate_fp8_rowwise", shape=[2, 9, 3072], case="zero rows",
                     torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == 'layernorm_modulate_fp8_rowwise')}/{n} "
          "runs byte-equal to the eager chain")
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    x, scale, sh = make(1, 4608, 3072, gen)
    equal = same(compiled(x, scale, sh, 1e-6), eager(x, scale, sh, 1e-6))
    print(f"torch.compile of the chain equals eager (1, 4608, 3072): {equal}")
    rows.append(dict(kind="compile_vs_eager", op="layernorm_modulate_fp8_rowwise", torch_equal=equal))
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    x, scale, shift = make(1, 4608, 3072, gen)
    out = outputs(x)
    dt.ln(x, scale, shift, *out)  # resolve outside the capture
    graph = graph_on_side_stream(lambda s: dt.ln(x, scale, shift, *out, stream=s))
    results = {}
    for trial in range(3):
        x2, s2, h2 = make(1, 4608, 3072, gen, 1.0 + trial)
        x.copy_(x2)
        scale.copy_(s2)
        shift.copy_(h2)
        graph.replay()
        torch.cuda.synchronize()
        results[f"replay_{trial}_equal"] = same(out, eager(x, scale, shift, 1e-6))
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="layernorm_modulate_fp8_rowwise", **results))
    return all(results.values())


BENCH = [("flux (1,4608,3072)", 1, 4608, 3072), ("flux text (1,512,3072)", 1, 512, 3072),
         ("qwen cfg (2,6912,3072)", 2, 6912, 3072), ("flux2 (1,4608,6144)", 1, 4608, 6144)]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(30)
    for name, B, S, D in BENCH:
        if not case_selected(name):
            continue
        nbytes = B * S * (3 * D + 4)
        sets = []
        for _ in range(rotation_count(nbytes)):
            x, scale, shift = make(B, S, D, gen)
            t = dict(x=x, scale=scale, shift=shift, out=outputs(x))
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]

        def ditops_fn(t, s=None):
            return dt.ln(t["x"], t["scale"], t["shift"], *t["out"], stream=s)

        ditops_fn(t0)
        graph = graph_on_side_stream(lambda s: ditops_fn(t0, s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["x"], t0["scale"], t0["shift"], 1e-6),
                  [lambda t=t: eager(t["x"], t["scale"], t["shift"], 1e-6) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["x"], t0["scale"], t0["shift"], 1e-6),
                  [lambda t=t: compiled(t["x"], t["scale"], t["shift"], 1e-6) for t in sets]),
                 ("ditops:jit", graph.replay, [lambda t=t: ditops_fn(t) for t in sets])]
        report(measure(impls), rows, meta, "layernorm_modulate_fp8_rowwise", name, shape_str((B, S, D)), nbytes, 30)
        sets = t0 = graph = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
