"""What bench/swiglu_torch.py and bench/gelu_tanh_torch.py share: the activation ops that write
act(x) row by row into the caller's out (a column slice of a cat buffer). An ActBench names the op,
its input columns per output column (swiglu 2: [gate | up]; gelu_tanh 1), its eager chain and its
cases; verify, graph_replay and run_bench run them (imported from the scripts' own folder)."""
from dataclasses import dataclass

import torch
from torch_bench_common import (allow_recompiles, case_selected, copy_buffers, copy_impl, graph_on_side_stream,
                                measure, report, report_header, rotation_count, shape_str)


@dataclass
class ActBench:
    op: str
    x_columns: int  # input columns per output column
    eager: object   # the eager chain: eager(x) -> [..., N]
    cases: list     # (label, M, N, dtype, x row, x column, out row, out column, storage offset)
    bench: list     # (name, M, N, x row, x column, out row, out column)
    specials: list  # values written into x (NaN patterns compared as NaN)
    graph: tuple    # (M, N, x row, x column, out row, out column) of the graph replay
    # (label, M, N, Kp): out = cat([prefix, act(x)], -1), the whole [M, Kp + N] buffer in one call
    prefix_cases: tuple = ()


def make_x(spec, M, N, dtype, gen, row=None, col=0, offset=0):
    """x [M, x_columns * N]: a view of rows `row` elements apart from column `col` of its buffer,
    `offset` elements into it (off 16-byte alignment for odd offsets)."""
    K = spec.x_columns * N
    row = row or K
    base = torch.empty(M * row + offset, device="cuda", dtype=dtype)
    buf = base[offset:].view(M, row)
    buf.copy_(torch.randn(M, row, device="cuda", generator=gen) * 3)
    return buf[:, col:col + K]


def same(a, b, nan_equal=False):
    if nan_equal:
        return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
            torch.nan_to_num(a, nan=0.0).contiguous().view(torch.uint8),
            torch.nan_to_num(b, nan=0.0).contiguous().view(torch.uint8))
    return torch.equal(a, b)


def call(dt, spec, x, out, stream=None, pdl=True, prefix=None):
    tensors = dict(x=x, out=out) if prefix is None else dict(x=x, out=out, prefix=prefix)
    return dt.call(spec.op, stream, dict(use_pdl=pdl, backend="jit"), **tensors)


def eager_cat(spec, x, prefix):
    """The single block's chain: torch.cat([prefix, act(x)], -1)."""
    return torch.cat([prefix, spec.eager(x)], dim=-1)


def run_case(dt, spec, M, N, dtype, gen, x_row, x_col, out_row, out_col, offset, x=None):
    """The op into the columns [out_col, out_col + N) of a [M, out_row] buffer: (impl, x, out,
    whether the buffer's other columns are untouched)."""
    x = make_x(spec, M, N, dtype, gen, x_row, x_col, offset) if x is None else x
    out_row = out_row or N
    buf = torch.randn(M, out_row, device="cuda", generator=gen).to(dtype)
    before = buf.clone()
    out = buf[:, out_col:out_col + N]
    impl = call(dt, spec, x, out)
    torch.cuda.synchronize()
    untouched = torch.equal(buf[:, :out_col], before[:, :out_col]) and torch.equal(
        buf[:, out_col + N:], before[:, out_col + N:])
    return impl, x, out, untouched


def verify(dt, spec, rows):
    """torch.equal against the eager chain in every case, then the special values of each dtype."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    for label, M, N, dtype, x_row, x_col, out_row, out_col, offset in spec.cases:
        impl, x, out, untouched = run_case(dt, spec, M, N, dtype, gen, x_row, x_col, out_row, out_col, offset)
        equal = same(out, spec.eager(x)) and untouched
        n += 1
        ok = ok and equal
        if not equal:
            print(f"MISMATCH {impl} {label} {(M, N)} {dtype}: "
                  f"{(out != spec.eager(x)).sum().item()} elements, other columns untouched: {untouched}", flush=True)
        rows.append(dict(kind="verify", op=spec.op, impl=impl, case=label, shape=[M, spec.x_columns * N],
                         dtype=str(dtype), storage_offset=offset, oracle="eager", torch_equal=equal))
    for label, M, N, Kp in spec.prefix_cases:
        x = make_x(spec, M, N, torch.bfloat16, gen)
        prefix = torch.randn(M, Kp, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty(M, Kp + N, device="cuda", dtype=torch.bfloat16)
        impl = call(dt, spec, x, out, prefix=prefix)
        torch.cuda.synchronize()
        equal = same(out, eager_cat(spec, x, prefix))
        n += 1
        ok = ok and equal
        if not equal:
            print(f"MISMATCH {impl} {label} (prefix {Kp})", flush=True)
        rows.append(dict(kind="verify", op=spec.op, impl=impl, case=label, shape=[M, spec.x_columns * N],
                         prefix=Kp, dtype="torch.bfloat16", storage_offset=0, oracle="eager", torch_equal=equal))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = make_x(spec, 6, 64, dtype, gen)
        fin = torch.finfo(dtype)
        values = [fin.max if v == "max" else -fin.max if v == "-max" else fin.tiny if v == "tiny" else
                  fin.tiny / 4 if v == "tiny/4" else v for v in spec.specials]
        specials = torch.tensor(values, device="cuda").to(dtype)
        x.view(-1)[: 5 * specials.numel(): 5] = specials
        if spec.x_columns > 1:  # the other half too (swiglu's up columns)
            x.view(-1)[64: 64 + 3 * specials.numel(): 3] = specials
        impl, x, out, untouched = run_case(dt, spec, 6, 64, dtype, gen, None, 0, None, 0, 0, x=x)
        equal = same(out, spec.eager(x), nan_equal=True) and untouched
        n += 1
        ok = ok and equal
        if not equal:
            print(f"MISMATCH special values {impl} {dtype}", flush=True)
        rows.append(dict(kind="verify", op=spec.op, impl=impl, case="special values", shape=[6, 64 * spec.x_columns],
                         dtype=str(dtype), storage_offset=0, oracle="eager", torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == spec.op)}/{n} runs torch.equal")
    return ok


def graph_replay(dt, spec, rows):
    """The op captured in a CUDA graph, replayed on fresh inputs, equal to eager each time."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    M, N, x_row, x_col, out_row, out_col = spec.graph
    x = make_x(spec, M, N, torch.bfloat16, gen, x_row, x_col)
    buf = torch.zeros(M, out_row or N, device="cuda", dtype=torch.bfloat16)
    out = buf[:, out_col:out_col + N]
    call(dt, spec, x, out)  # resolve outside the capture
    graph = graph_on_side_stream(lambda stream: call(dt, spec, x, out, stream=stream))
    results = {}
    for trial in range(3):
        x.copy_(torch.randn(M, spec.x_columns * N, device="cuda", generator=gen).to(torch.bfloat16) * 3)
        graph.replay()
        torch.cuda.synchronize()
        results[f"replay_{trial}_equal"] = same(out, spec.eager(x))
    print("graph replay:", results)
    rows.append(dict(kind="graph", op=spec.op, **results))
    return all(results.values())


def run_bench(dt, spec, rows, meta):
    """A device copy of the same bytes, eager, torch.compile of it and ditops (as a one-kernel graph);
    byte model: x read once, out written once: (x_columns + 1) * M * N * 2 bytes (bf16)."""
    allow_recompiles()
    compiled = torch.compile(spec.eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(30)
    for name, M, N, x_row, x_col, out_row, out_col in spec.bench:
        if not case_selected(name):
            continue
        nbytes = (spec.x_columns + 1) * M * N * 2
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = dict(x=make_x(spec, M, N, torch.bfloat16, gen, x_row, x_col))
            t["out"] = torch.empty(M, out_row or N, device="cuda", dtype=torch.bfloat16)[:, out_col:out_col + N]
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]
        call(dt, spec, t0["x"], t0["out"])
        graph = graph_on_side_stream(lambda s: call(dt, spec, t0["x"], t0["out"], stream=s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: spec.eager(t0["x"]), [lambda t=t: spec.eager(t["x"]) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["x"]), [lambda t=t: compiled(t["x"]) for t in sets]),
                 ("ditops:jit", graph.replay, [lambda t=t: call(dt, spec, t["x"], t["out"]) for t in sets])]
        report(measure(impls), rows, meta, spec.op, name, shape_str((M, spec.x_columns * N)), nbytes, 30)
        sets = t0 = graph = None  # release before the next case allocates
        torch.cuda.empty_cache()
    # The whole cat buffer: prefix and act(x) in one call beside eager's and compile's torch.cat of them.
    compiled_cat = torch.compile(lambda x, p: eager_cat(spec, x, p), dynamic=False)
    for label, M, N, Kp in spec.prefix_cases:
        name = f"{label} (whole cat)"
        if not case_selected(name):
            continue
        nbytes = (spec.x_columns * M * N + M * Kp + M * (Kp + N)) * 2
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = dict(x=make_x(spec, M, N, torch.bfloat16, gen),
                     prefix=torch.randn(M, Kp, device="cuda", generator=gen).to(torch.bfloat16),
                     out=torch.empty(M, Kp + N, device="cuda", dtype=torch.bfloat16))
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]
        call(dt, spec, t0["x"], t0["out"], prefix=t0["prefix"])
        graph = graph_on_side_stream(lambda s: call(dt, spec, t0["x"], t0["out"], stream=s, prefix=t0["prefix"]))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager_cat(spec, t0["x"], t0["prefix"]),
                  [lambda t=t: eager_cat(spec, t["x"], t["prefix"]) for t in sets]),
                 ("torch_compile", lambda: compiled_cat(t0["x"], t0["prefix"]),
                  [lambda t=t: compiled_cat(t["x"], t["prefix"]) for t in sets]),
                 ("ditops:jit", graph.replay,
                  [lambda t=t: call(dt, spec, t["x"], t["out"], prefix=t["prefix"]) for t in sets])]
        report(measure(impls), rows, meta, spec.op, name, shape_str((M, spec.x_columns * N)), nbytes, 30)
        sets = t0 = graph = None
        torch.cuda.empty_cache()
