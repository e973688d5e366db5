"""gelu_tanh on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal against the eager chain F.gelu(x, approximate="tanh")
   (ditops.eager.gelu_tanh): FLUX.1-dev's and HunyuanVideo's feed-forward (image and text tokens,
   N = 12288) and single block (out the columns [D, D + N) of the cat buffer before proj_out, its
   attention columns left as they were; x also the mlp columns of a fused projection), f16 and f32,
   odd widths (the scalar path), inputs off 16-byte alignment, and special values compared bytewise
   with NaN patterns taken as equal; then a CUDA graph replay on fresh inputs.
2. Benchmark at the FLUX.1 / HunyuanVideo shapes: device copy of the same bytes, eager (one GELU
   kernel), torch.compile of it, ditops, each timed cold (ditops as a one-kernel CUDA graph), rotated
   (buffer sets over 3x the L2 in one CUDA graph) and cold alone in a CUDA graph, medians; byte
   model: x read once, out written once: 2 * rows * N * itemsize bytes. The single block's case
   writes into the cat buffer's columns (eager and compile write a contiguous output there: the
   cat's pass over those columns is what the model saves).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)


class Ditops(DitopsLib):
    def gelu_tanh(self, x, out, stream=None, pdl=True):
        return self.call("gelu_tanh", stream, dict(use_pdl=pdl, backend="jit"), x=x, out=out)


_eager = load_eager()
eager = _eager.gelu_tanh


def make_x(M, N, dtype, gen, row=None, col=0, offset=0):
    """x [M, N]: a view of rows `row` elements apart from column `col` of its buffer, `offset`
    elements into it (off 16-byte alignment for odd offsets)."""
    row = row or N
    base = torch.empty(M * row + offset, device="cuda", dtype=dtype)
    buf = base[offset:].view(M, row)
    buf.copy_(torch.randn(M, row, device="cuda", generator=gen) * 3)
    return buf[:, col:col + N]


def same(a, b, nan_equal=False):
    if nan_equal:
        return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
            torch.nan_to_num(a, nan=0.0).contiguous().view(torch.uint8),
            torch.nan_to_num(b, nan=0.0).contiguous().view(torch.uint8))
    return torch.equal(a, b)


# (label, M, N, dtype, x row, x column, out row, out column, storage offset)
CASES = [("flux ff image", 4608, 12288, torch.bfloat16, None, 0, None, 0, 0),
         ("flux ff text", 512, 12288, torch.bfloat16, None, 0, None, 0, 0),
         ("flux single block", 4608, 12288, torch.bfloat16, None, 0, 3072 + 12288, 3072, 0),
         ("fused projection", 5120, 12288, torch.bfloat16, 3 * 3072 + 12288, 3 * 3072, 3072 + 12288, 3072, 0),
         ("f16", 1024, 12288, torch.float16, None, 0, None, 0, 0),
         ("f32", 1024, 4608, torch.float32, None, 0, None, 0, 0),
         ("odd width", 33, 3071, torch.bfloat16, None, 0, None, 0, 0),
         ("odd width f16", 7, 17, torch.float16, None, 0, None, 0, 0),
         ("odd width f32", 5, 33, torch.float32, None, 0, None, 0, 0),
         ("misaligned", 127, 12288, torch.bfloat16, None, 0, None, 0, 1),
         ("one row", 1, 12288, torch.bfloat16, None, 0, None, 0, 0)]


def run_case(dt, M, N, dtype, gen, x_row, x_col, out_row, out_col, offset, x=None):
    x = make_x(M, N, dtype, gen, x_row, x_col, offset) if x is None else x
    out_row = out_row or N
    buf = torch.randn(M, out_row, device="cuda", generator=gen).to(dtype)
    before = buf.clone()
    out = buf[:, out_col:out_col + N]
    impl = dt.gelu_tanh(x, out)
    torch.cuda.synchronize()
    untouched = torch.equal(buf[:, :out_col], before[:, :out_col]) and torch.equal(
        buf[:, out_col + N:], before[:, out_col + N:])
    return impl, x, out, untouched


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    for label, M, N, dtype, x_row, x_col, out_row, out_col, offset in CASES:
        impl, x, out, untouched = run_case(dt, M, N, dtype, gen, x_row, x_col, out_row, out_col, offset)
        equal = same(out, eager(x)) and untouched
        n += 1
        ok = ok and equal
        if not equal:
            print(f"MISMATCH {impl} {label} {(M, N)} {dtype}: "
                  f"{(out != eager(x)).sum().item()} elements, other columns untouched: {untouched}", flush=True)
        rows.append(dict(kind="verify", op="gelu_tanh", impl=impl, case=label, shape=[M, N], dtype=str(dtype),
                         storage_offset=offset, oracle="eager", torch_equal=equal))
    # Special values of each dtype (NaN patterns compared as NaN): GELU's edges and tanh's cancellation.
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = make_x(6, 64, dtype, gen)
        fin = torch.finfo(dtype)
        specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), fin.max, -fin.max, fin.tiny,
                                 fin.tiny / 4, -100.0, 100.0, -5.0, -4.0, -6.5, -10.0, 1.0, -1.0], device="cuda").to(dtype)
        x.view(-1)[: 5 * specials.numel(): 5] = specials
        impl, x, out, untouched = run_case(dt, 6, 64, dtype, gen, None, 0, None, 0, 0, x=x)
        equal = same(out, eager(x), nan_equal=True) and untouched
        n += 1
        ok = ok and equal
        if not equal:
            print(f"MISMATCH special values {impl} {dtype}", flush=True)
        rows.append(dict(kind="verify", op="gelu_tanh", impl=impl, case="special values", shape=[6, 64],
                         dtype=str(dtype), storage_offset=0, oracle="eager", torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == 'gelu_tanh')}/{n} runs torch.equal")
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    M, N, D = 4608 + 512, 12288, 3072
    x = make_x(M, N, torch.bfloat16, gen)
    cat = torch.zeros(M, D + N, device="cuda", dtype=torch.bfloat16)
    out = cat[:, D:]
    dt.gelu_tanh(x, out)  # resolve outside the capture
    graph = graph_on_side_stream(lambda stream: dt.gelu_tanh(x, out, stream=stream))
    results = {}
    for trial in range(3):
        x.copy_(torch.randn(M, N, device="cuda", generator=gen).to(torch.bfloat16) * 3)
        graph.replay()
        torch.cuda.synchronize()
        results[f"replay_{trial}_equal"] = same(out, eager(x))
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="gelu_tanh", **results))
    return all(results.values())


BENCH = [("flux ff (4608) 12288", 4608, 12288, None, 0, None, 0),
         ("flux ff text (512) 12288", 512, 12288, None, 0, None, 0),
         ("flux single (4608) cat", 4608, 12288, None, 0, 3072 + 12288, 3072),
         ("hunyuan single (32760) cat", 32760, 12288, None, 0, 3072 + 12288, 3072)]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(30)
    for name, M, N, x_row, x_col, out_row, out_col in BENCH:
        if not case_selected(name):
            continue
        nbytes = 2 * M * N * 2
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = dict(x=make_x(M, N, torch.bfloat16, gen, x_row, x_col))
            t["out"] = torch.empty(M, out_row or N, device="cuda", dtype=torch.bfloat16)[:, out_col:out_col + N]
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]
        dt.gelu_tanh(t0["x"], t0["out"])
        graph = graph_on_side_stream(lambda s: dt.gelu_tanh(t0["x"], t0["out"], stream=s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["x"]), [lambda t=t: eager(t["x"]) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["x"]), [lambda t=t: compiled(t["x"]) for t in sets]),
                 ("ditops:jit", graph.replay, [lambda t=t: dt.gelu_tanh(t["x"], t["out"]) for t in sets])]
        report(measure(impls), rows, meta, "gelu_tanh", name, shape_str((M, N)), nbytes, 30)
        sets = t0 = graph = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
