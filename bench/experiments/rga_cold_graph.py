"""Where residual_gate_add's cold_graph gap to torch.compile comes from (an experiment, not a
benchmark): at the short calls of run 79 ditops' kernel alone in a CUDA graph after the L2 clear
read 0.13-0.77 us more than Inductor's, while back to back (rotated) it was ahead. Each variant
below is one call captured alone in a graph and timed by median_us (do_bench, L2 cleared before
every replay), the variants interleaved over several rounds so drift shows as spread:
  compile          torch.compile of the eager chain (output from the graph's pool)
  ditops           the C ABI into a preallocated output (as the benchmark)
  ditops_nopdl     the same without the PDL launch attribute
  ditops_poolout   the output allocated inside the capture, as torch.compile's is
  triton_inductor  a Triton kernel written like Inductor's (XBLOCK 1024, 4 warps, constant row
                   length) into the preallocated output: the kernel without Inductor's wrapper
                   (timing only: its row-gate indexing is wrong for batch gates)
  triton_poolout   the same kernel, output allocated inside the capture
  base             as ditops, through a second library (env BASE_LIB: e.g. an older commit's
                   build), to compare two versions of the kernel inside one process
The transposed cases (SANA-Video's residual layout) run no Triton variant; CASES=REGEX selects
cases.
With SETS=K each variant runs on K buffer sets of its own (one graph each, rounds interleaved) and
the per-set medians are printed beside their median. Outputs that differ from eager's bytes are
named (torch.compile's does at bf16: Inductor keeps the product in fp32 where eager rounds it to
bf16). Run on the GPU machine after building libditops:
    [BASE_LIB=other/libditops.so] python bench/experiments/rga_cold_graph.py build-dev/libditops.so [VARIANT_REGEX]
"""
import os
import re
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from residual_gate_add_torch import Ditops, eager, make  # noqa: E402
from torch_bench_common import allow_recompiles, median_us  # noqa: E402


@triton.jit
def _gated_sum(r_ptr, u_ptr, g_ptr, out_ptr, n, WIDTH: tl.constexpr, TOKEN: tl.constexpr, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = x < n
    gate_at = x // WIDTH if TOKEN else x % WIDTH
    r = tl.load(r_ptr + x, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + x, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + gate_at, mask=mask, eviction_policy="evict_last").to(tl.float32)
    p = (u * g).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + x, (r + p).to(out_ptr.dtype.element_ty), mask=mask)


def triton_call(r, u, g, out, token):
    n = r.numel()
    _gated_sum[(triton.cdiv(n, 1024),)](r, u, g, out, n, WIDTH=r.shape[-1], TOKEN=token, XBLOCK=1024, num_warps=4)
    return out


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        held = fn()
    return graph, held


CASES = [("flux_image", (1, 4096, 3072), (1, 1, 3072)), ("flux_joint", (1, 4608, 3072), (1, 1, 3072)),
         ("flux_text", (1, 512, 3072), (1, 1, 3072)),
         ("per_token", (1, 512, 3072), (1, 512, 1)), ("odd_width", (2, 33, 65), (2, 1, 65)),
         ("transposed_small", (1, 17, 65), (1, 1, 65), True), ("transposed_medium", (2, 513, 256), (1, 1, 256), True)]


def main():
    dt = Ditops(sys.argv[1])
    base = Ditops(os.environ["BASE_LIB"]) if os.environ.get("BASE_LIB") else None
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    rounds = int(os.environ.get("ROUNDS", "3"))
    sets = int(os.environ.get("SETS", "1"))
    cases = [c for c in CASES if re.search(os.environ.get("CASES", "."), c[0])]
    for name, shape, gshape, *layout in cases:
        transposed = bool(layout and layout[0])  # residual [B, H, T] viewed as [B, T, H] (SANA-Video)
        token = gshape[-1] == 1

        def variants_of(r, u, g, out):
            variants = {
                "compile": lambda: compiled(r, u, g),
                "ditops": lambda: (dt.residual_gate_add(r, u, g, out), out)[1],
                "ditops_nopdl": lambda: (dt.residual_gate_add(r, u, g, out, pdl=False), out)[1],
                "ditops_poolout": lambda: (lambda o: (dt.residual_gate_add(r, u, g, o), o)[1])(torch.empty_like(r)),
                "triton_inductor": lambda: triton_call(r, u, g, out, token),
                "triton_poolout": lambda: triton_call(r, u, g, torch.empty_like(r), token),
            }
            if transposed:  # the Triton kernel indexes a contiguous residual only
                variants = {k: v for k, v in variants.items() if not k.startswith("triton")}
            if base is not None:
                variants["base"] = lambda: (base.residual_gate_add(r, u, g, out), out)[1]
            if len(sys.argv) > 2:
                variants = {k: v for k, v in variants.items() if re.search(sys.argv[2], k)}
            return variants

        # SETS > 1: each variant on `sets` buffer sets of its own (where a buffer lies moves a
        # kernel's cold reading), one graph each; the verdict is the median over the sets.
        graphs = {}
        held_sets = []  # the graphs hold raw pointers: every set's tensors live until the timing ends
        for k in range(sets):
            r, u, g = make(shape, gshape, torch.bfloat16, transposed, 0, gen)
            out = torch.empty_like(r)
            held_sets.append((r, u, g, out))
            ref = eager(r, u, g)
            for label, fn in variants_of(r, u, g, out).items():
                graphs.setdefault(label, []).append(graph_of(fn))
                graphs[label][-1][0].replay()
                torch.cuda.synchronize()
                if k == 0 and not torch.equal(graphs[label][-1][1], ref):
                    print(f"{name} {label}: output differs from eager")
        times = {label: [[] for _ in range(sets)] for label in graphs}
        for _ in range(rounds):
            for k in range(sets):
                for label in graphs:
                    times[label][k].append(median_us(graphs[label][k][0].replay))
        for label, per_set in times.items():
            medians = [statistics.median(ts) for ts in per_set]
            print(f"{name:11s} {label:16s} median {statistics.median(medians):7.2f} us  "
                  + ("sets " + " ".join(f"{m:6.2f}" for m in medians) if sets > 1
                     else "rounds " + " ".join(f"{t:6.2f}" for t in per_set[0])), flush=True)
        graphs = held_sets = None
        torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
