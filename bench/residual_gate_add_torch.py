"""residual_gate_add on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. Verification: ditops (every CUDA backend) against eager `residual + update * gate` on CUDA with
   torch.equal over SGLang's test grid: GATE_CASES, per-token, batch and per-frame gates, dtype
   sweeps (fp16/bf16/fp32), the transposed SANA-Video layout, non-zero storage offsets (pointers
   off 16-byte alignment); out keeps residual's strides. Wan's promoted chain (an f32 gate beside
   bf16/f16 data, `(x.float() + update * gate).type_as(x)`) with the gate as Wan builds it: a
   chunk of [B, 6, D] or of [B, S, 6, D] (strided views), at Wan's shapes too.
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
eager_float32 = _eager.residual_gate_add_float32_eager  # an f32 gate beside 16-bit data (Wan)


def chain_of(g, r):
    """The eager chain a call is bit-exact with: the promoted one for an f32 gate beside 16-bit data."""
    return eager_float32 if g.dtype == torch.float32 and r.dtype != torch.float32 else eager


def make(shape, gate_shape, dtype, transposed=False, offset=0, gen=None, gate_dtype=None, chunk=False):
    """residual (transposed: a [B, H, T] tensor viewed as [B, T, H]), update, gate; offset > 0
    places every tensor `offset` elements into a larger buffer (storage offset, misaligned).
    gate_dtype: the gate's (default dtype); chunk: the gate as Wan's modulation chunk 2 of
    [B, 6, D] ([B, 1, D] gates) or of [B, S, 6, D] ([B, S, D] gates), a strided view."""
    def rand(shp, scale, dt=dtype):
        n = 1
        for s in shp:
            n *= s
        base = torch.empty(n + offset, device="cuda", dtype=dt)
        v = base[offset:].view(shp)
        v.copy_(torch.randn(shp, device="cuda", generator=gen) * scale)
        return v
    if transposed:
        B, T, H = shape
        r = rand((B, H, T), 4.0).transpose(1, 2)
    else:
        r = rand(shape, 4.0)
    gdt = gate_dtype or dtype
    if chunk and gate_shape[1] == 1:
        g = rand((gate_shape[0], 6, gate_shape[2]), 0.5, gdt)[:, 2:3]
    elif chunk:
        g = rand((*gate_shape[:2], 6, gate_shape[2]), 0.5, gdt)[:, :, 2]
    else:
        g = rand(gate_shape, 0.5, gdt)
    return r, rand(shape, 1.0), g


GATE_CASES = [((1, 1024, 4096), (1, 1, 4096)), ((1, 512, 4096), (1, 512, 4096)), ((1, 17, 65), (1, 1, 65)),
              ((1, 17, 65), (1, 17, 65)), ((1, 4096, 3072), (1, 1, 3072)), ((1, 512, 3072), (1, 1, 3072)),
              ((1, 4608, 3072), (1, 1, 3072)), ((1, 4608, 6144), (1, 1, 6144)), ((1, 4216, 4096), (1, 1, 4096))]


# Wan's gated residuals: (shape, gate shape, dtype, chunk) with an f32 gate; 14B D = 5120, 1.3B
# D = 1536, 81 frames 720p S = 32760, batch 2; per token (2.2 TI2V) a chunk of [B, S, 6, D].
WAN_GATES = [((1, 32760, 5120), (1, 1, 5120), torch.bfloat16, True), ((2, 32760, 5120), (2, 1, 5120), torch.bfloat16, True),
             ((1, 32760, 1536), (1, 1, 1536), torch.bfloat16, True), ((1, 4096, 3072), (1, 4096, 3072), torch.bfloat16, True),
             ((2, 257, 1536), (2, 1, 1536), torch.float16, True), ((2, 33, 128), (2, 33, 128), torch.bfloat16, True),
             ((2, 33, 65), (2, 1, 65), torch.bfloat16, True), ((3, 1031, 72), (1, 1, 72), torch.bfloat16, False),
             ((2, 33, 128), (2, 33, 1), torch.float16, False), ((2, 3, 5, 64), (2, 3, 1, 64), torch.bfloat16, False)]


def grid():
    """(shape, gate shape, dtype, transposed, storage offset, gate dtype, chunk)."""
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
    cases = [c + (None, False) for c in cases]
    cases += [(s, g, dt, False, 0, f32, chunk) for s, g, dt, chunk in WAN_GATES]
    cases += [((1, 1024, 4096), (1, 1, 4096), bf16, False, 1, f32, False),  # off 16 bytes: the scalar path
              ((2, 513, 256), (2, 1, 256), bf16, False, 0, bf16, True)]  # a strided gate of bf16
    return cases


def verify(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ok, n = True, 0
    for shape, gshape, dtype, transposed, offset, gate_dtype, chunk in grid():
        r, u, g = make(shape, gshape, dtype, transposed, offset, gen, gate_dtype, chunk)
        want = chain_of(g, r)(r, u, g)
        for backend in ("jit",):
            out = torch.empty_strided(r.shape, r.stride(), device="cuda", dtype=dtype)
            impl = dt.residual_gate_add(r, u, g, out, backend=backend)
            torch.cuda.synchronize()
            equal = torch.equal(out, want) and out.stride() == r.stride()
            n += 1
            if not equal:
                ok = False
                print("MISMATCH", impl, shape, gshape, dtype, "transposed" if transposed else "", offset,
                      g.dtype, "chunk" if chunk else "", int((out != want).sum()), flush=True)
            rows.append(dict(kind="verify", impl=impl, shape=list(shape), gate=list(gshape), dtype=str(dtype),
                             transposed=transposed, storage_offset=offset, gate_dtype=str(g.dtype),
                             gate_strides=list(g.stride()), torch_equal=equal))
        r = u = g = want = None  # release the Wan-sized tensors before the next case
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
# Wan's promoted residuals beside the copy, eager and torch.compile: the f32 gate a chunk of the
# [B, 6, D] modulation (a strided view for B = 2).
BENCH_WAN = [("wan14b f32 gate", (1, 32760, 5120), (1, 1, 5120)), ("wan1.3b f32 gate", (1, 32760, 1536), (1, 1, 1536)),
             ("wan14b b2 f32 gate", (2, 32760, 5120), (2, 1, 5120))]



def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = {eager: torch.compile(eager, dynamic=False), eager_float32: torch.compile(eager_float32, dynamic=False)}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    cases = [(n, s, g, t, torch.bfloat16, None) for n, s, g, t in BENCH]
    cases += [(n + " fp16", s, g, t, torch.float16, None) for n, s, g, t in BENCH
              if n in ("flux_image", "flux_joint", "sana_transposed")]
    cases += [(n, s, g, False, torch.bfloat16, torch.float32) for n, s, g in BENCH_WAN]
    report_header(22)
    for name, shape, gshape, transposed, dtype, gate_dtype in cases:
        if not case_selected(name):
            continue
        numel, gnumel = 1, 1
        for d in shape:
            numel *= d
        for d in gshape:
            gnumel *= d
        gate_size = torch.empty((), dtype=gate_dtype or dtype).element_size()
        nbytes = 3 * numel * torch.empty((), dtype=dtype).element_size() + gnumel * gate_size
        sets = []  # (residual, update, gate, out, copy src, copy dst)
        for _ in range(rotation_count(nbytes)):
            r, u, g = make(shape, gshape, dtype, transposed, 0, gen, gate_dtype, gate_dtype is not None)
            sets.append((r, u, g, torch.empty_strided(r.shape, r.stride(), device="cuda", dtype=dtype), *copy_buffers(nbytes)))
        r, u, g, out = sets[0][:4]
        chain = chain_of(g, r)
        compiled_chain = compiled[chain]
        one_kernel_graph = {}  # the cold timing launches ditops as a graph: the ctypes call's host time would outlast a short kernel
        for pdl in (True, False):
            dt.residual_gate_add(r, u, g, out, pdl=pdl)
            one_kernel_graph[pdl] = graph_on_side_stream(
                lambda stream, pdl=pdl: dt.residual_gate_add(r, u, g, out, stream=stream, pdl=pdl))
        measured = measure([
            copy_impl(sets, lambda s: s[4], lambda s: s[5]),
            ("torch_eager", lambda: chain(r, u, g), [lambda s=s: chain(*s[:3]) for s in sets]),
            ("torch_compile", lambda: compiled_chain(r, u, g), [lambda s=s: compiled_chain(*s[:3]) for s in sets]),
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
