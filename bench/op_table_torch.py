"""Every op without a benchmark of its own (bench/<op>_torch.py) on the GPU beside PyTorch, from the
op table alone (ctypes over the C ABI; needs only libditops): its description's example call (the
slots' shapes at its `dims`, the dtype each slot's rule gives first), its eager chain
(@eager in python/ditops/eager) and torch.compile of it.

1. Verification: torch.equal of ditops (jit) against the eager chain at the example call, for the
   ops whose chain is the oracle at the default options (the driver's cases check every other call:
   tests/python/test_ops_eager.py).
2. Benchmark at the example call: device copy of the same bytes, eager, torch.compile, ditops, timed
   as bench/torch_bench_common.py does (cold, rotated, cold graph); byte model: every tensor of the
   call read or written once.

    python3 bench/op_table_torch.py --lib build/libditops.so --json out.json [--ops a,b]
A new op gets its benchmark here until it needs model shapes of its own (then bench/<op>_torch.py
takes it over and this script leaves it out).
"""
import inspect
import json
import os
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

_eager = load_eager()
_BENCH = os.path.dirname(os.path.abspath(__file__))
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f8e4m3fn": torch.float8_e4m3fn,
          "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64}


class Ditops(DitopsLib):
    def __init__(self, path):
        super().__init__(path)
        import ctypes
        n = self.lib.ditops_op_table(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.ditops_op_table(buf, n + 1)
        self.table = {op["name"]: op for op in json.loads(buf.value.decode())}


def covered(dt, selected=None):
    """The ops this script benchmarks: an eager chain and no other bench/*_torch.py that calls the
    op by name (or those named in --ops)."""
    ops = [op for op in dt.table if op in _eager._registry.CHAINS]
    if selected:
        return [op for op in ops if op in selected]
    others = "".join(open(os.path.join(_BENCH, f)).read() for f in sorted(os.listdir(_BENCH))
                     if f.endswith("_torch.py") and f != os.path.basename(__file__))
    return [op for op in ops if f'"{op}"' not in others]


def extents(shape, dims):
    """A slot's symbolic extents ("B,S,Da+Dm", "up128(B*S),D/16") at the example dims."""
    env = dict(dims, up128=lambda v: (v + 127) // 128 * 128)
    return [int(eval(e.replace("/", "//"), {"__builtins__": {}}, env)) for e in shape.split(",")]  # noqa: S307


def example_dims(op):
    dims = {}
    for item in filter(None, op["dims"].split(",")):
        name, value = item.split("=")
        dims[name] = extents(value, dims)[0]
    return dims


def example_call(op, device="cuda", gen=None):
    """The tensors of the op's example call by slot name (required slots only), inputs random."""
    dims, tensors = example_dims(op), {}
    for slot in op["tensors"]:
        if slot["optional"]:
            continue
        first = slot["dtypes"].split("|")[0]
        dtype = tensors[first[1:]].dtype if first.startswith("=") else DTYPES[first]
        shape = [1] if slot["shape"] == "1" else extents(slot["shape"], dims)
        if slot["role"] == "out":
            tensors[slot["name"]] = torch.empty(shape, dtype=dtype, device=device)
        elif shape == [1] and dtype == torch.float32:
            tensors[slot["name"]] = torch.full(shape, 0.02, device=device)  # a scale
        elif dtype.is_floating_point:
            v = torch.randn(shape, device=device, generator=gen)
            tensors[slot["name"]] = v.to(dtype)
        else:
            tensors[slot["name"]] = torch.zeros(shape, dtype=dtype, device=device)  # indices: row 0
    return tensors


def chain_call(op, tensors, chain):
    """The call of the op's eager chain (or torch.compile of it) on `tensors`: its parameters by name
    from the tensors and the op table's default options."""
    kinds = {o["name"]: o for o in op["options"]}
    args = {}
    for p in inspect.signature(chain).parameters.values():
        if p.name in tensors:
            args[p.name] = tensors[p.name]
        elif p.name in kinds:
            args[p.name] = _eager._registry._option_value(kinds[p.name]["default"], kinds[p.name]["kind"], p.default)
        else:
            args[p.name] = None
    return lambda: chain(**args)


def written(op, tensors):
    return [tensors[t["name"]] for t in op["tensors"] if t["role"] != "in" and t["name"] in tensors]


def verify(dt, rows, meta):
    ok = True
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for name in covered(dt, SELECTED):
        op = dt.table[name]
        tensors = example_call(op, gen=gen)
        want = chain_call(op, tensors, _eager._registry.CHAINS[name])()
        want = want if isinstance(want, tuple) else (want,)
        impl = dt.call(name, None, dict(backend="jit"), **tensors)
        torch.cuda.synchronize()
        got = written(op, tensors)
        equal = all(torch.equal(g.view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g,
                                w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w)
                    for g, w in zip(got, want))
        print(f"{name}: {impl} torch.equal {equal}", flush=True)
        ok = ok and equal
        rows.append(dict(kind="verify", op=name, impl=impl, shape=op["dims"], oracle="eager", torch_equal=equal))
    return ok


def run_bench(dt, rows, meta):
    allow_recompiles()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(30)
    for name in covered(dt, SELECTED):
        op = dt.table[name]
        case = f"example {op['dims']}"
        if not case_selected(case):
            continue
        probe = example_call(op, gen=gen)
        nbytes = sum(t.numel() * t.element_size() for t in probe.values())
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = example_call(op, gen=gen)
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        call = {t: {k: v for k, v in s.items() if k not in ("src", "dst")} for t, s in enumerate(sets)}
        chain = _eager._registry.CHAINS[name]
        eager = [chain_call(op, call[i], chain) for i in range(len(sets))]
        compiled_chain = torch.compile(chain, dynamic=False)
        compiled = [chain_call(op, call[i], compiled_chain) for i in range(len(sets))]

        def ditops_fn(i, s=None):
            return dt.call(name, s, dict(backend="jit"), **call[i])

        ditops_fn(0)
        graph = graph_on_side_stream(lambda s: ditops_fn(0, s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", eager[0], eager), ("torch_compile", compiled[0], compiled),
                 ("ditops:jit", graph.replay, [lambda i=i: ditops_fn(i) for i in range(len(sets))])]
        shapes = [tuple(t.shape) for t in probe.values()]
        report(measure(impls), rows, meta, name, case, shape_str(*shapes), nbytes, 30)
        sets = call = eager = compiled = graph = None
        torch.cuda.empty_cache()


SELECTED = None


def main():
    global SELECTED
    if "--ops" in sys.argv:
        i = sys.argv.index("--ops")
        SELECTED = set(sys.argv[i + 1].split(","))
        del sys.argv[i:i + 2]
    return script_main(Ditops, [("VERIFY", verify)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
