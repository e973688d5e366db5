"""residual_gate_add on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. Verification: ditops (every CUDA backend) against eager `residual + update * gate` on CUDA with
   torch.equal over SGLang's test grid: GATE_CASES, per-token, batch and per-frame gates, dtype
   sweeps (fp16/bf16/fp32), the transposed SANA-Video layout, non-zero storage offsets (pointers
   off 16-byte alignment); out keeps residual's strides.
2. CUDA-graph capture and replay with new inputs on a side stream.
3. Benchmark, every implementation (device copy, eager, torch.compile, ditops with and without
   PDL) timed three ways in the same run: "cold" = triton.testing.do_bench (a 256 MiB cache clear
   before each call, median; ditops launched as a one-kernel CUDA graph, since the ctypes call
   costs tens of microseconds of host time), and "rotated" = rotated_graph_us (round after round
   over buffer sets > 3x the L2, captured in one CUDA graph: GPU time only, no flush write-back
   overlapping the call, the same for every implementation), and "cold_graph" = do_bench of each
   implementation's call alone in a CUDA graph (every one launched as ditops is in "cold"). GB/s
   by the byte model (residual,
   update, gate read once, out written once) and the fraction of a device copy of the same bytes
   (cold: torch's copy_; rotated and cold_graph: a Triton copy kernel, as a captured copy_ runs on
   a copy engine).

Calls ditops through its C ABI (include/ditops/c_api.h) with ctypes: needs only libditops.so.
"""
import ctypes
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl, dltensor, graph_on_side_stream,
                                load_eager, measure, report, report_header, rotation_count, script_main, shape_str)


class Ditops(DitopsLib):
    def residual_gate_add(self, residual, update, gate, out, backend=None, stream=None, pdl=True):
        return self.call("residual_gate_add", stream, dict(use_pdl=pdl, backend=backend),
                         residual=residual, update=update, gate=gate, out=out)


# One copy of the eager chains, in the Python package; loaded by path so this script needs no
# compiled ditops module (only libditops through ctypes).
_eager = load_eager()
eager = _eager.residual_gate_add_eager


def make(shape, gate_shape, dtype, transposed=False, offset=0, gen=None):
    """residual (transposed: a [B, H, T] tensor viewed as [B, T, H]), update, gate; offset > 0
    places every tensor `offset` elements into a larger buffer (storage offset, misaligned)."""
    def rand(shp, scale):
        n = 1
        for s in shp:
            n *= s
        base = torch.empty(n + offset, device="cuda", dtype=dtype)
        v = base[offset:].view(shp)
        v.copy_(torch.randn(shp, device="cuda", generator=gen) * scale)
        return v
    if transposed:
        B, T, H = shape
        r = rand((B, H, T), 4.0).transpose(1, 2)
    else:
        r = rand(shape, 4.0)
    return r, rand(shape, 1.0), rand(gate_shape, 0.5)


GATE_CASES = [((1, 1024, 4096), (1, 1, 4096)), ((1, 512, 4096), (1, 512, 4096)), ((1, 17, 65), (1, 1, 65)),
              ((1, 17, 65), (1, 17, 65)), ((1, 4096, 3072), (1, 1, 3072)), ((1, 512, 3072), (1, 1, 3072)),
              ((1, 4608, 3072), (1, 1, 3072)), ((1, 4608, 6144), (1, 1, 6144)), ((1, 4216, 4096), (1, 1, 4096))]


def grid():
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = [(s, g, bf16, False, 0) for s, g in GATE_CASES]
    cases += [((1, 2560, 512), (1, 2560, 1), bf16, False, 0), ((1, 17, 65), (1, 17, 1), bf16, False, 0),
              ((2, 33, 128), (2, 33, 1), bf16, False, 0)]
    for dt in (f16, bf16, f32):
        cases += [((1, 2560, 512), (1, 2560, 1), dt, False, 0), ((1, 9, 64), (1, 1, 64), dt, False, 0),
                  ((1, 9, 64), (1, 9, 64), dt, False, 0), ((2, 33, 65), (2, 1, 65), dt, False, 0),
                  ((2, 1031, 128), (2, 1, 128), dt, False, 0), ((2, 3, 5, 64), (2, 3, 1, 64), dt, False, 0)]
        for s in ((1, 17, 65), (1, 7800, 2240), (2, 33, 128), (1, 7801, 2240)):
            cases.append((s, (1, 1, s[2]), dt, True, 0))
        cases += [((2, 33, 128), (2, 1, 128), dt, True, 0), ((2, 33, 128), (2, 33, 1), dt, True, 0)]
        # non-zero storage offsets for all three tensors
        cases += [((1, 1024, 4096), (1, 1, 4096), dt, False, 1), ((2, 33, 128), (2, 33, 1), dt, False, 3),
                  ((2, 513, 256), (1, 1, 256), dt, True, 1)]
    cases.append(((1, 32760, 2240), (1, 1, 2240), bf16, True, 0))
    return cases


def verify(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ok, n = True, 0
    for shape, gshape, dtype, transposed, offset in grid():
        r, u, g = make(shape, gshape, dtype, transposed, offset, gen)
        want = eager(r, u, g)
        for backend in ("jit",):
            out = torch.empty_strided(r.shape, r.stride(), device="cuda", dtype=dtype)
            impl = dt.residual_gate_add(r, u, g, out, backend=backend)
            torch.cuda.synchronize()
            equal = torch.equal(out, want) and out.stride() == r.stride()
            n += 1
            if not equal:
                ok = False
                print("MISMATCH", impl, shape, gshape, dtype, "transposed" if transposed else "", offset,
                      int((out != want).sum()), flush=True)
            rows.append(dict(kind="verify", impl=impl, shape=list(shape), gate=list(gshape), dtype=str(dtype),
                             transposed=transposed, storage_offset=offset, torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r['kind'] == 'verify')}/{n} cases torch.equal to eager")
    return ok


def graph_replay(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    results = {}
    for shape, gshape, transposed in (((1, 4608, 3072), (1, 1, 3072), False), ((1, 7800, 2240), (1, 1, 2240), True)):
        r, u, g = make(shape, gshape, torch.bfloat16, transposed, 0, gen)
        out = torch.empty_strided(r.shape, r.stride(), device="cuda", dtype=r.dtype)
        dt.residual_gate_add(r, u, g, out)  # resolve outside the capture
        graph = graph_on_side_stream(lambda stream: dt.residual_gate_add(r, u, g, out, stream=stream))
        for trial in range(3):
            r2, u2, g2 = make(shape, gshape, torch.bfloat16, transposed, 0, gen)
            r.copy_(r2)
            u.copy_(u2)
            g.copy_(g2)
            graph.replay()
            torch.cuda.synchronize()
            results[f"{'transposed' if transposed else 'flat'}_replay_{trial}_equal"] = torch.equal(out, eager(r2, u2, g2))
    print("graph replay:", results)
    rows.append(dict(kind="graph", **results))
    return all(results.values())


BENCH = [("flux_text", (1, 512, 3072), (1, 1, 3072), False), ("flux_image", (1, 4096, 3072), (1, 1, 3072), False),
         ("flux_joint", (1, 4608, 3072), (1, 1, 3072), False), ("flux2_joint", (1, 4608, 6144), (1, 1, 6144), False),
         ("qwen_cfg", (2, 6912, 3072), (2, 1, 3072), False), ("wan", (1, 32760, 5120), (1, 1, 5120), False),
         ("full_gate", (1, 512, 4096), (1, 512, 4096), False), ("per_token", (1, 2560, 512), (1, 2560, 1), False),
         ("odd_width", (2, 33, 65), (1, 1, 65), False), ("sana_transposed", (1, 32760, 2240), (1, 1, 2240), True),
         ("transposed_small", (1, 17, 65), (1, 1, 65), True), ("transposed_medium", (2, 513, 256), (1, 1, 256), True),
         ("sana_odd_tokens", (1, 32761, 2240), (1, 1, 2240), True)]



def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    cases = [(n, s, g, t, torch.bfloat16) for n, s, g, t in BENCH]
    cases += [(n + " fp16", s, g, t, torch.float16) for n, s, g, t in BENCH if n in ("flux_image", "flux_joint", "sana_transposed")]
    report_header(22)
    for name, shape, gshape, transposed, dtype in cases:
        if not case_selected(name):
            continue
        numel, gnumel = 1, 1
        for d in shape:
            numel *= d
        for d in gshape:
            gnumel *= d
        nbytes = (3 * numel + gnumel) * torch.empty((), dtype=dtype).element_size()
        sets = []  # (residual, update, gate, out, copy src, copy dst)
        for _ in range(rotation_count(nbytes)):
            r, u, g = make(shape, gshape, dtype, transposed, 0, gen)
            sets.append((r, u, g, torch.empty_strided(r.shape, r.stride(), device="cuda", dtype=dtype), *copy_buffers(nbytes)))
        r, u, g, out = sets[0][:4]
        one_kernel_graph = {}  # the cold timing launches ditops as a graph: ctypes costs ~20 us of host time
        for pdl in (True, False):
            dt.residual_gate_add(r, u, g, out, pdl=pdl)
            one_kernel_graph[pdl] = graph_on_side_stream(
                lambda stream, pdl=pdl: dt.residual_gate_add(r, u, g, out, stream=stream, pdl=pdl))
        measured = measure([
            copy_impl(sets, lambda s: s[4], lambda s: s[5]),
            ("torch_eager", lambda: eager(r, u, g), [lambda s=s: eager(*s[:3]) for s in sets]),
            ("torch_compile", lambda: compiled(r, u, g), [lambda s=s: compiled(*s[:3]) for s in sets]),
            ("ditops:jit", one_kernel_graph[True].replay, [lambda s=s: dt.residual_gate_add(*s[:4]) for s in sets]),
            ("ditops:jit nopdl", one_kernel_graph[False].replay,
             [lambda s=s: dt.residual_gate_add(*s[:4], pdl=False) for s in sets])])
        report(measured, rows, meta, "residual_gate_add", name, shape_str(shape), nbytes, 22)
        sets = r = u = g = out = one_kernel_graph = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", lambda dt, rows, meta: verify(dt, rows)),
                                ("GRAPH", lambda dt, rows, meta: graph_replay(dt, rows))], run_bench)


if __name__ == "__main__":
    sys.exit(main())
