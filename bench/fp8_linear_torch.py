"""fp8_linear and fp8_static_quant on the GPU beside PyTorch (ctypes over the C ABI; needs only
libditops). Written without a GPU: not run yet (docs/fp8_linear.md).

1. VERIFY
   * fp8_static_quant: torch.equal (uint8 views) against eager
     `(x.float() * (1.0 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)` (ieee) and against a
     Triton emulation of SGLang's quantizer (div_full: Triton lowers 1.0 / scale to div.full.f32);
   * fp8_linear, every CUDA implementation (backend=jit: the GEMV and the swap-AB mma kernel;
     backend=vendor: cuBLASLt) at every whitelisted (K, N) and M in {1, 2, 3, 4, 8, 9, 16}, seeds
     0, 1, 7, random scales: within the contract of the fp64 dequantized product (every output
     within 1 bf16 ulp + K * 2^-24 * sum|xq w| * scales, >= 99.9 % within 1 ulp), bitwise
     identical on a second run (jit), and torch._scaled_mm beside it (its own distance to fp64);
     the issue's boundary inputs (+-448, +-11.25, 0.013 with x_scale 0.025).
2. GRAPH: a CUDA graph of each implementation replayed after x and both scales changed: the
   output equals a fresh call's.
3. Benchmark at the whitelisted shapes and M in {1, 2, 4, 8, 9, 16}: a pure read of the same
   weight bytes (Triton, the reference figure), torch._scaled_mm (x already e4m3; and with eager's
   quantization before it), bf16 F.linear, ditops jit (bf16 x and e4m3 x) and vendor. Weights
   rotated over >= 3x the L2 (rotation_count) in one CUDA graph (rotated_graph_us), and each call
   alone in a graph from a cleared L2 (cold_graph_us). Byte model: the weight, N * K bytes (x and
   out are under 1 % at M <= 16); the records' copy_fraction is the read kernel's time over the
   implementation's.

--lib PATH (libditops), --json PATH, --commit SHA, --skip-bench; DITOPS_BENCH_CASES /
DITOPS_BENCH_IMPLS select cases and implementations (torch_bench_common.py).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, case_selected, cold_graph_us, graph_on_side_stream, load_eager, record,
                                rotated_graph_us, rotation_count, script_main, shape_str)

E4M3 = torch.float8_e4m3fn

# (K, N, bias, label): the whitelist of src/ops/fp8_linear/fp8_linear_whitelist.cpp.
SHAPES = [(5120, 8192, False, "qwen3.8 qkv"), (5120, 5120, False, "qwen3-14b o"), (5120, 7168, False, "qwen3-14b qkv"),
          (5120, 16384, False, "qwen3.8 gdn in"), (5120, 34816, False, "gate-up"), (6144, 5120, False, "qwen3.8 out"),
          (4096, 4096, False, "8b o"), (4096, 5376, False, "nemotron up"), (5376, 4096, False, "nemotron"),
          (3072, 18432, True, "flux.1 adaln"), (3072, 9216, True, "flux.1 single adaln"),
          (6144, 36864, True, "flux.2 adaln"), (6144, 18432, True, "flux.2 single adaln"), (5120, 30720, True, "wan adaln")]
VERIFY_M = (1, 2, 3, 4, 8, 9, 16)
BENCH_M = (1, 2, 4, 8, 9, 16)


class Ditops(DitopsLib):
    def linear(self, x, xs, w, ws, out, bias=None, backend="jit", stream=None, div_full=False):
        # backend None: the automatic choice at the default quality (cuBLASLt, the bit-exact one)
        return self.call("fp8_linear", stream,
                         dict(backend=backend, quality="high" if backend == "jit" else None,
                              fp8_reciprocal="div_full" if div_full else "ieee"),
                         x=x, x_scale=xs, w=w, w_scale=ws, bias=bias, out=out)

    def quant(self, x, scale, out, div_full=False, stream=None):
        return self.call("fp8_static_quant", stream,
                         dict(backend="jit", fp8_reciprocal="div_full" if div_full else "ieee"),
                         x=x, scale=scale, out=out)


_eager = load_eager()
_div_full_kernel = None


def div_full_inverse(scale):
    """1.0 / scale as a Triton kernel computes it (div.full.f32), one fp32 element."""
    global _div_full_kernel
    if _div_full_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def inverse(s_ptr, o_ptr):
            tl.store(o_ptr, 1.0 / tl.load(s_ptr))

        _div_full_kernel = inverse
    out = torch.empty(1, device="cuda", dtype=torch.float32)
    _div_full_kernel[(1,)](scale, out)
    return out


def sglang_quant(x, scale):
    return (x.float() * div_full_inverse(scale)).clamp(-448, 448).to(E4M3)


def scaled_mm(xq, w, xs, ws, bias=None):
    """torch._scaled_mm (cuBLASLt) for x @ w.T: mat2 is the column-major view w.t()."""
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws, bias=bias, out_dtype=torch.bfloat16)


def make(M, N, K, gen, bias):
    x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", generator=gen) * 32).to(E4M3)
    b = (torch.randn(N, device="cuda", generator=gen) * 4).to(torch.bfloat16) if bias else None
    return x, w, b


def contract(out, x, xs, w, ws, bias):
    """(beyond the bound, within 1 ulp, outputs) of out against the fp64 dequantized product."""
    xq = x if x.dtype == E4M3 else _eager.static_quant_fp8_eager(x, xs)
    a, b = xq.double(), w.double()
    y = (a @ b.t()) * xs.double() * ws.double()
    bound_acc = (a.abs() @ b.abs().t()) * xs.double() * ws.double() * x.shape[1] * 2.0 ** -24
    if bias is not None:
        y = y + bias.double()
    mag = y.abs().clamp_min(2.0 ** -126)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    err = (out.double() - y).abs()
    return int((err > ulp + bound_acc).sum()), int((err <= ulp).sum()), out.numel()


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    ok = True
    # fp8_static_quant
    gen.manual_seed(1)
    for M, K in ((1, 5120), (16, 6144), (9, 17408), (7, 1000)):
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16) * 4
        for s in (0.025, 0.4754464328289032):
            st = torch.tensor([s], device="cuda")
            for div_full in (False, True):
                out = torch.empty(M, K, device="cuda", dtype=E4M3)
                impl = dt.quant(x, st, out, div_full=div_full)
                want = sglang_quant(x, st) if div_full else _eager.fp8_static_quant_eager(x, st)
                torch.cuda.synchronize()
                equal = torch.equal(out.view(torch.uint8), want.view(torch.uint8))
                ok &= equal
                rows.append(dict(kind="verify", op="fp8_static_quant", impl=impl, shape=[M, K], scale=s,
                                 oracle="sglang_div_full" if div_full else "eager", torch_equal=equal))
    # fp8_linear.cublaslt's contract: byte-equal to torch._scaled_mm at every whitelisted (K, N), every
    # M from 1 to 16 and a few beyond, with and without the bias, a bf16 and an e4m3 x; also within the
    # K bound of the fp64 product (its 1-ulp fraction reported).
    equal_cases = differing = 0
    vendor_tally = [0, 0, 0]
    for K, N, has_bias, label in SHAPES:
        gen.manual_seed(K * 7 + N)
        w = (torch.randn(N, K, device="cuda", generator=gen) * 32).to(E4M3)
        bias_values = (torch.randn(N, device="cuda", generator=gen) * 4).to(torch.bfloat16)
        for M in tuple(range(1, 17)) + (24, 33, 64):
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            xs = torch.rand(1, device="cuda", generator=gen) * 0.02 + 0.015
            ws = torch.rand(1, device="cuda", generator=gen) * 0.02 + 0.01
            for bias in (bias_values if has_bias else None, None if has_bias else bias_values):
                xq = _eager.static_quant_fp8_eager(x, xs)
                want = scaled_mm(xq, w, xs, ws, bias)
                for xin in (x, xq):
                    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    impl = dt.linear(xin, xs, w, ws, out, bias=bias, backend="vendor")
                    torch.cuda.synchronize()
                    equal = torch.equal(out, want)
                    equal_cases += equal
                    differing += not equal
                    if not equal:
                        n = int((out != want).sum())
                        print(f"{impl} {label} (K, N, M) = ({K}, {N}, {M}) bias={bias is not None} x={xin.dtype}: "
                              f"{n} of {out.numel()} differ from torch._scaled_mm")
                    rows.append(dict(kind="verify", op="fp8_linear", impl=impl, shape=[M, N, K],
                                     bias=bias is not None, x_dtype=str(xin.dtype), oracle="torch._scaled_mm",
                                     torch_equal=equal))
                if M in (1, 2, 9, 16) and bias is not None and not has_bias or (has_bias and bias is not None):
                    beyond, within, n = contract(want, x, xs, w, ws, bias)
                    vendor_tally[0] += beyond
                    vendor_tally[1] += within
                    vendor_tally[2] += n
    ok &= differing == 0 and vendor_tally[0] == 0
    print(f"fp8_linear.cublaslt: torch.equal to torch._scaled_mm in {equal_cases} of {equal_cases + differing} calls; "
          f"beyond the K bound {vendor_tally[0]}, within 1 ulp of fp64 {vendor_tally[1]}/{vendor_tally[2]} "
          f"({100 * vendor_tally[1] / max(vendor_tally[2], 1):.3f} %)")
    rows.append(dict(kind="verify", op="fp8_linear", impl="fp8_linear.cublaslt", case="contract_summary",
                     torch_equal_calls=equal_cases, differing_calls=differing, beyond_bound=vendor_tally[0],
                     within_ulp=vendor_tally[1], outputs=vendor_tally[2]))
    # The jit kernels' contract: within the K bound, >= 99.9 % within 1 ulp, bitwise identical run to run.
    totals = {}
    for K, N, has_bias, label in SHAPES:
        for M in VERIFY_M if not has_bias else (1, 2):
            for seed in (0, 1, 7):
                gen.manual_seed(seed)
                x, w, b = make(M, N, K, gen, has_bias)
                xs = torch.rand(1, device="cuda", generator=gen) * 0.02 + 0.015
                ws = torch.rand(1, device="cuda", generator=gen) * 0.02 + 0.01
                out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                try:
                    impl = dt.linear(x, xs, w, ws, out, bias=b, backend="jit")
                except RuntimeError as e:
                    print(f"jit {(K, N, M)}: {str(e)[:200]}")
                    ok = False
                    continue
                torch.cuda.synchronize()
                beyond, within, n = contract(out, x, xs, w, ws, b)
                again = torch.empty_like(out)
                dt.linear(x, xs, w, ws, again, bias=b, backend="jit")
                torch.cuda.synchronize()
                stable = torch.equal(out, again)
                t = totals.setdefault(impl, [0, 0, 0, True])
                t[0] += beyond
                t[1] += within
                t[2] += n
                t[3] &= stable
                rows.append(dict(kind="verify", op="fp8_linear", impl=impl, shape=[M, N, K], seed=seed,
                                 beyond_bound=beyond, within_ulp=within, outputs=n, run_to_run_equal=stable))
    for impl, (beyond, within, n, stable) in totals.items():
        good = beyond == 0 and within >= 0.999 * n and stable
        ok &= good
        print(f"{impl:28s} beyond bound {beyond}, within 1 ulp {within}/{n} ({100 * within / max(n, 1):.3f} %), "
              f"run-to-run {'equal' if stable else 'DIFFERS'}{'' if good else '  FAIL'}")
    # The boundary inputs through a one-hot weight: out[n] = xq[n] * x_scale.
    xv = torch.tensor([448, -448, 11.25, -11.25, 11.0, -11.0, 0.013, -0.013, 32, -32, 0, 1, 0.5, 2, 3, 4],
                      device="cuda").to(torch.bfloat16)[None]
    w = torch.eye(16, device="cuda").to(E4M3)
    xs, one = torch.tensor([0.025], device="cuda"), torch.tensor([1.0], device="cuda")
    want = (_eager.static_quant_fp8_eager(xv, xs).float() * 0.025).to(torch.bfloat16)
    for backend in ("jit", "vendor"):
        out = torch.empty(1, 16, device="cuda", dtype=torch.bfloat16)
        impl = dt.linear(xv, xs, w, one, out, backend=backend)
        torch.cuda.synchronize()
        equal = torch.equal(out, want)
        ok &= equal
        print(f"boundary inputs {impl}: {'equal' if equal else 'DIFFER'}")
        rows.append(dict(kind="verify", op="fp8_linear", impl=impl, case="boundary", torch_equal=equal))
    return ok


def graph_replay(dt, rows, meta):
    """Each implementation captured on a side stream the library has not seen (the vendor path:
    without a warm-up there, so its workspace is made during the capture), replayed after x and both
    scales changed: the output equals a fresh call's. The automatic choice (no backend) too."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    ok = True
    for M, backend in ((1, "jit"), (9, "jit"), (9, "vendor"), (3, None)):
        x, w, _ = make(M, 8192, 5120, gen, False)
        xs, ws = torch.tensor([0.025], device="cuda"), torch.tensor([0.02], device="cuda")
        out = torch.empty(M, 8192, device="cuda", dtype=torch.bfloat16)
        if backend == "jit":
            dt.linear(x, xs, w, ws, out, backend=backend)  # the JIT's compile outside the capture
        try:
            graph = graph_on_side_stream(lambda s: dt.linear(x, xs, w, ws, out, backend=backend, stream=s))
        except Exception as e:  # noqa: BLE001 (report and go on)
            print(f"graph capture {backend} M={M}: {repr(e)[:300]}")
            ok = False
            continue
        x.copy_(torch.randn(M, 5120, device="cuda", generator=gen))
        xs.fill_(0.031)
        ws.fill_(0.017)
        graph.replay()
        fresh = torch.empty_like(out)
        dt.linear(x, xs, w, ws, fresh, backend=backend)
        torch.cuda.synchronize()
        equal = torch.equal(out, fresh)
        torch.randn(4, device="cuda")  # the process's CUDA RNG still works after the capture
        ok &= equal
        print(f"graph replay {backend or 'auto'} M={M}: {'equal' if equal else 'DIFFERS'}")
        rows.append(dict(kind="graph", op="fp8_linear", impl=backend or "auto", shape=[M, 8192, 5120], equal=equal))
    return ok


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _read_words(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(src_ptr + offsets, mask=offsets < n, other=0)
        tl.store(out_ptr + tl.program_id(0), tl.sum(v, axis=0))
except ImportError:
    _read_words = None


def read_kernel(buf, sink):
    """A pure read of buf's bytes (one int32 word per program written): the bandwidth reference."""
    words = buf.view(torch.int32).view(-1)
    n = words.numel()
    _read_words[(triton.cdiv(n, 4096),)](words, sink, n, BLOCK=4096, num_warps=8)


def run_bench(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    xs, ws = torch.tensor([0.025], device="cuda"), torch.tensor([0.02], device="cuda")
    print(f"\n{'case':28s} {'impl':26s} {'rotated us':>10s} {'GB/s':>7s} {'read%':>6s} {'graph cold':>10s} {'read%':>6s}")
    for K, N, has_bias, label in SHAPES:
        nbytes = N * K
        weights = [(torch.randn(N, K, device="cuda", generator=gen) * 32).to(E4M3)
                   for _ in range(rotation_count(nbytes))]
        w16 = [w.to(torch.bfloat16) for w in weights[:2]]  # bf16 F.linear: 2x the bytes, two sets rotate past L2 too
        bias = (torch.randn(N, device="cuda", generator=gen) * 4).to(torch.bfloat16) if has_bias else None
        sink = torch.empty(triton.cdiv(nbytes // 4, 4096), device="cuda", dtype=torch.int32)
        for M in BENCH_M if not has_bias else (1, 2):
            case = f"{label} ({K},{N}) M={M}"
            if not case_selected(case):
                continue
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            xq = _eager.static_quant_fp8_eager(x, xs)
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)

            def ditops_call(w, backend, xin):
                dt.linear(xin, xs, w, ws, out, bias=bias, backend=backend)

            impls = [("weight_read", [lambda w=w: read_kernel(w, sink) for w in weights]),
                     ("torch_scaled_mm", [lambda w=w: scaled_mm(xq, w, xs, ws, bias) for w in weights]),
                     ("torch_quant_scaled_mm",
                      [lambda w=w: scaled_mm(_eager.static_quant_fp8_eager(x, xs), w, xs, ws, bias) for w in weights]),
                     ("torch_bf16_linear",
                      [lambda w=w: torch.nn.functional.linear(x, w, bias) for w in w16]),
                     ("ditops:jit", [lambda w=w: ditops_call(w, "jit", x) for w in weights]),
                     ("ditops:jit:e4m3_x", [lambda w=w: ditops_call(w, "jit", xq) for w in weights]),
                     ("ditops:vendor", [lambda w=w: ditops_call(w, "vendor", x) for w in weights])]
            measured = {}
            for name, calls in impls:
                try:
                    measured[name] = (rotated_graph_us(calls), cold_graph_us(calls))
                except Exception as e:  # noqa: BLE001 (report and go on)
                    print(f"  {name} failed: {repr(e)[:200]}", flush=True)
            if "weight_read" not in measured:
                continue
            read_rot, read_cold = measured["weight_read"]
            for name, (rot, cold) in measured.items():
                bytes_read = 2 * nbytes if name == "torch_bf16_linear" else nbytes
                print(f"{case:28s} {name:26s} {rot:10.2f} {bytes_read / (rot * 1e-6) / 1e9:7.1f} "
                      f"{100 * read_rot * bytes_read / nbytes / rot:5.1f}% {cold:10.2f} "
                      f"{100 * read_cold * bytes_read / nbytes / cold:5.1f}%", flush=True)
                for method, us, ref in (("rotated_graph", rot, read_rot), ("cold_graph", cold, read_cold)):
                    record(rows, meta, "fp8_linear", case, shape_str((M, K), (N, K)), name, method, us, bytes_read,
                           ref * bytes_read / nbytes)
        weights = w16 = None
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
