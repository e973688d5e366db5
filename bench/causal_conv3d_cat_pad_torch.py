"""causal_conv3d_cat_pad on the GPU beside PyTorch, in one process (run by scripts/device_run.sh).

1. Verification: ditops (the CUDA backend) against eager `F.pad(torch.cat([cache, x], 2), (wl, wr,
   ht, hb, dl - ct, dr))` on CUDA with torch.equal on integer views (inputs are random bits, so
   NaN payloads and -0 count): the issue's (C, T, H, W) in {(1024,1,30,52), (1024,2,60,104),
   (512,4,120,208), (256,4,240,416)} x cache time {1, 2} with padding (1, 1, 1, 1, ct, 0), the
   SGLang reference point [1, 192, 2, 360, 640] with a 2-frame cache, dl > ct, no cache, dr > 0,
   asymmetric padding, fp16 and fp32, channels-last-3d, odd totals, storage offsets (pointers off
   16 bytes).
2. CUDA-graph capture and replay with new inputs on a side stream.
3. Benchmark: every shape of bench/results/h200/causal_conv3d_cat_pad.json (the issue's 8 and
   SGLang's point) in both layouts and all three dtypes: device copy, eager cat + F.pad,
   torch.compile of that chain, ditops (with PDL, and without at the SGLang point), and with
   --lib-base another build's ditops ("ditops:base", e.g. main's kernels, in the same process for
   an A/B), each timed cold-L2, rotated-graph and cold-graph as bench/torch_bench_common.py does
   for every op (DITOPS_BENCH_METHODS=cold_graph: that one only, to fit the grid into one device
   call). Every case is first checked with torch.equal for each ditops build. Byte model: x and
   cache read once, out written once; the device copy moves the same bytes (half each way). Ends
   with the issue's acceptance per case: faster than torch.compile, >= 0.85 of the copy where the
   copy takes >= 20 us, SGLang's point <= 220 us (eager 957 us, SGLang's CUDA kernel 323.6 us on
   the H200).

Calls ditops through its C ABI (include/ditops/c_api.h) with ctypes: needs only libditops.so.
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

PAD_NAMES = ("pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right")


class Ditops(DitopsLib):
    def causal_conv3d_cat_pad(self, x, cache, out, padding, backend=None, stream=None, pdl=True):
        """padding: F.pad's (wl, wr, ht, hb, dl, dr), dl the whole left time padding (>= ct)."""
        options = dict(zip(PAD_NAMES, padding), use_pdl=pdl, backend=backend)
        return self.call("causal_conv3d_cat_pad", stream, options, x=x, cache=cache, out=out)


# One copy of the eager chain, in the Python package, loaded by path (no compiled module needed).
_eager = load_eager()
eager = _eager.causal_conv3d_cat_pad_eager

INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def random_bits(shape, dtype, channels_last, offset, gen):
    """A [B, C, T, H, W] tensor of random bit patterns (NaNs, infinities, -0 among them), NCTHW or
    channels-last-3d, `offset` elements into a larger buffer (offset > 0: off 16 bytes)."""
    B, C, T, H, W = shape
    n = B * C * T * H * W
    it = INT_VIEW[dtype]
    info = torch.iinfo(it)
    base = torch.randint(info.min, info.max, (n + offset,), device="cuda", dtype=it, generator=gen).view(dtype)
    if channels_last:
        return base[offset:].view(B, T, H, W, C).permute(0, 4, 1, 2, 3)
    return base[offset:].view(B, C, T, H, W)


def out_shape(shape, padding):
    """[B, C, T + dl + dr, H + ht + hb, W + wl + wr] (the cache's frames are part of dl)."""
    wl, wr, ht, hb, dl, dr = padding
    B, C, T, H, W = shape
    return B, C, T + dl + dr, H + ht + hb, W + wl + wr


def new_out(x, padding, channels_last, offset=0):
    B, C, T, H, W = out_shape(tuple(x.shape), padding)
    n = B * C * T * H * W
    base = torch.empty(n + offset, device="cuda", dtype=x.dtype)
    if channels_last:
        return base[offset:].view(B, T, H, W, C).permute(0, 4, 1, 2, 3)
    return base[offset:].view(B, C, T, H, W)


def make(shape, ct, dtype, channels_last=False, offset=0, gen=None):
    """x [B, C, T, H, W] and cache [B, C, ct, H, W] (None for ct = None)."""
    x = random_bits(shape, dtype, channels_last, offset, gen)
    cache = None if ct is None else random_bits((shape[0], shape[1], ct, shape[3], shape[4]), dtype, channels_last,
                                                offset, gen)
    return x, cache


ISSUE_SHAPES = [(1024, 1, 30, 52), (1024, 2, 60, 104), (512, 4, 120, 208), (256, 4, 240, 416)]
SGLANG_POINT = (1, 192, 2, 360, 640)  # 2-frame cache, padding (1, 1, 1, 1, 2, 0)


def grid():
    """(x shape, cache frames or None, padding, dtype, channels_last, storage offset)."""
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = []
    for C, T, H, W in ISSUE_SHAPES:
        for ct in (1, 2):
            cases.append(((1, C, T, H, W), ct, (1, 1, 1, 1, ct, 0), bf16, False, 0))
    cases.append((SGLANG_POINT, 2, (1, 1, 1, 1, 2, 0), bf16, False, 0))
    cases.append((SGLANG_POINT, 2, (1, 1, 1, 1, 2, 0), bf16, True, 0))
    for C, T, H, W in ISSUE_SHAPES[:3]:
        cases.append(((1, C, T, H, W), 2, (1, 1, 1, 1, 2, 0), bf16, True, 0))  # channels-last
    for dt in (f16, bf16, f32):
        for cl in (False, True):
            cases += [((1, 64, 3, 30, 52), 1, (1, 1, 1, 1, 3, 0), dt, cl, 0),   # dl > ct: a zero frame
                      ((1, 64, 3, 30, 52), None, (1, 1, 1, 1, 2, 0), dt, cl, 0),  # no cache
                      ((1, 3, 5, 7, 9), 3, (2, 1, 0, 3, 4, 2), dt, cl, 0),      # odd total, asymmetric, dr > 0
                      ((2, 5, 3, 4, 7), None, (1, 2, 1, 0, 2, 0), dt, cl, 1),   # odd, storage offset 1
                      ((1, 33, 2, 17, 61), 1, (3, 2, 1, 1, 1, 0), dt, cl, 3),   # odd widths, offset 3
                      ((1, 256, 2, 60, 104), 2, (1, 1, 1, 1, 2, 0), dt, cl, 0)]
    return cases


def verify(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    ok, n = True, 0
    for shape, ct, padding, dtype, cl, offset in grid():
        x, cache = make(shape, ct, dtype, cl, offset, gen)
        want = eager(x, cache, padding)
        out = new_out(x, padding, cl, offset)
        impl = dt.causal_conv3d_cat_pad(x, cache, out, padding, backend="jit")
        torch.cuda.synchronize()
        it = INT_VIEW[dtype]
        equal = tuple(out.shape) == tuple(want.shape) and torch.equal(out.view(it), want.view(it))
        n += 1
        if not equal:
            ok = False
            print("MISMATCH", impl, shape, ct, padding, dtype, "channels_last" if cl else "", offset,
                  int((out.view(it) != want.view(it)).sum()) if out.shape == want.shape else "shape", flush=True)
        rows.append(dict(kind="verify", impl=impl, shape=list(shape), cache_frames=ct, padding=list(padding),
                         dtype=str(dtype), channels_last=cl, storage_offset=offset, torch_equal=equal))
        x = cache = out = want = None
    torch.cuda.empty_cache()
    print(f"verification: {sum(r['torch_equal'] for r in rows if r['kind'] == 'verify')}/{n} cases torch.equal "
          "(integer views) to eager")
    return ok


def graph_replay(dt, rows):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    results = {}
    padding = (1, 1, 1, 1, 2, 0)
    for cl in (False, True):
        x, cache = make((1, 256, 4, 60, 104), 2, torch.bfloat16, cl, 0, gen)
        out = new_out(x, padding, cl)
        dt.causal_conv3d_cat_pad(x, cache, out, padding)  # resolve outside the capture
        graph = graph_on_side_stream(lambda stream: dt.causal_conv3d_cat_pad(x, cache, out, padding, stream=stream))
        for trial in range(2):
            x2, c2 = make((1, 256, 4, 60, 104), 2, torch.bfloat16, cl, 0, gen)
            x.copy_(x2)
            cache.copy_(c2)
            graph.replay()
            torch.cuda.synchronize()
            results[f"{'channels_last' if cl else 'ncthw'}_replay_{trial}_equal"] = torch.equal(
                out.view(torch.int16), eager(x2, c2, padding).view(torch.int16))
    print("graph replay:", results)
    rows.append(dict(kind="graph", **results))
    return all(results.values())


def bench_cases():
    """(label, x shape, cache frames, padding, dtype, channels_last, with the nopdl row): every shape
    of the records (the issue's 8 and SGLang's point) in both layouts and all three dtypes. bf16
    NCTHW keeps the records' labels; the others add the dtype and the layout."""
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    shapes = [("sglang_point", SGLANG_POINT, 2)]
    shapes += [(f"C{C} T{T} {H}x{W} ct{ct}", (1, C, T, H, W), ct) for C, T, H, W in ISSUE_SHAPES for ct in (1, 2)]
    cases = []
    for base, shape, ct in shapes:
        for dtype in (bf16, f16, f32):
            for cl in (False, True):
                suffix = ("" if dtype == bf16 else " fp16" if dtype == f16 else " fp32") + (" channels_last" if cl else "")
                label = base + suffix
                if base == "sglang_point" and not suffix:
                    label = "sglang_point [1,192,2,360,640] ct2"
                cases.append((label, shape, ct, (1, 1, 1, 1, ct, 0), dtype, cl, base == "sglang_point" and not suffix))
    return cases


def acceptance(summary):
    """The issue's acceptance per case, from the cold-graph timings (rotated-graph where cold graph
    was not measured): faster than torch.compile; >= 0.85 of a device copy where the copy takes
    >= 20 us; SGLang's point (bf16 NCTHW) <= 220 us. Returns whether every case met it."""
    print(f"\nacceptance ({'cold graph' if summary and summary[0][2] == 2 else 'rotated graph'}): "
          "ditops and torch.compile in us, ditops over a copy, torch.compile / ditops")
    print(f"{'case':40s} {'copy':>8s} {'compile':>8s} {'ditops':>8s} {'base':>8s} {'copy%':>6s} {'compile/':>8s}  verdict")
    ok_all = True
    for name, measured, method in summary:
        t = {k: v[method] for k, v in measured.items() if v[method] is not None}
        if not {"device_copy", "torch_compile", "ditops:jit"} <= set(t):
            print(f"{name:40s} (not measured)")
            ok_all = False
            continue
        copy, comp, new = t["device_copy"], t["torch_compile"], t["ditops:jit"]
        base = t.get("ditops:base")
        problems = []
        if new >= comp:
            problems.append("not faster than torch.compile")
        if copy >= 20.0 and copy / new < 0.85:
            problems.append("below 0.85 of the copy")
        if name.startswith("sglang_point [") and new > 220.0:
            problems.append("over 220 us")
        ok_all = ok_all and not problems
        print(f"{name:40s} {copy:8.2f} {comp:8.2f} {new:8.2f} {base if base is not None else float('nan'):8.2f} "
              f"{100 * copy / new:5.1f}% {comp / new:8.3f}  {'ok' if not problems else '; '.join(problems)}", flush=True)
    print("ACCEPTANCE", "PASS" if ok_all else "FAIL")
    return ok_all


def run_bench(dt, rows, meta, base=None):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    report_header(40)
    builds = [("ditops:jit", dt)] + ([("ditops:base", base)] if base is not None else [])
    summary = []
    for name, shape, ct, padding, dtype, cl, with_nopdl in bench_cases():
        if not case_selected(name):
            continue
        es = torch.empty((), dtype=dtype).element_size()
        B, C, T, H, W = shape
        out_numel = 1
        for d in out_shape(shape, padding):
            out_numel *= d
        nbytes = (B * C * (T + ct) * H * W + out_numel) * es
        sets = []  # (x, cache, out, copy src, copy dst)
        for _ in range(rotation_count(nbytes)):
            x, cache = make(shape, ct, dtype, cl, 0, gen)
            sets.append((x, cache, new_out(x, padding, cl), *copy_buffers(nbytes)))
        x, cache, out = sets[0][:3]
        # torch.equal of each build at the case itself, before it is timed.
        want = eager(x, cache, padding)
        it = INT_VIEW[dtype]
        for label, lib in builds:
            out.view(it).fill_(0x5A5A if it == torch.int16 else 0x5A5A5A5A)  # not a byte of any output
            impl = lib.causal_conv3d_cat_pad(x, cache, out, padding, backend="jit")
            torch.cuda.synchronize()
            equal = torch.equal(out.view(it), want.view(it))
            if not equal:
                print("MISMATCH", label, impl, name, int((out.view(it) != want.view(it)).sum()), flush=True)
            # impl: the implementation that ran for this build; another build's is kept apart ("base:").
            rows.append(dict(kind="verify", impl=impl if label == "ditops:jit" else f"base:{impl}", build=label, case=name,
                             shape=list(shape), cache_frames=ct, padding=list(padding), dtype=str(dtype),
                             channels_last=cl, storage_offset=0, torch_equal=equal))
        want = None
        pdls = (True, False) if with_nopdl else (True,)
        impls = [copy_impl(sets, lambda s: s[3], lambda s: s[4]),
                 ("torch_eager", lambda: eager(x, cache, padding), [lambda s=s: eager(s[0], s[1], padding) for s in sets]),
                 ("torch_compile", lambda: compiled(x, cache, padding),
                  [lambda s=s: compiled(s[0], s[1], padding) for s in sets])]
        graphs = []  # the cold timing launches ditops as a graph: the ctypes call's host time would outlast a short kernel
        for label, lib in builds:
            for pdl in pdls:
                lib.causal_conv3d_cat_pad(x, cache, out, padding, pdl=pdl)
                graph = graph_on_side_stream(
                    lambda stream, lib=lib, pdl=pdl: lib.causal_conv3d_cat_pad(x, cache, out, padding, stream=stream,
                                                                                pdl=pdl))
                graphs.append(graph)
                impls.append((label + ("" if pdl else " nopdl"), graph.replay,
                              [lambda s=s, lib=lib, pdl=pdl: lib.causal_conv3d_cat_pad(s[0], s[1], s[2], padding, pdl=pdl)
                               for s in sets]))
        measured = measure(impls)
        report(measured, rows, meta, "causal_conv3d_cat_pad", name, shape_str(shape, (B, C, ct, H, W)), nbytes, 40)
        if measured and "device_copy" in measured:
            method = 2 if measured["device_copy"][2] is not None else 1
            summary.append((name, measured, method))
        sets = x = cache = out = graphs = measured = None  # release before the next case allocates
        torch.cuda.empty_cache()
    checked = [r for r in rows if r.get("kind") == "verify" and "case" in r]
    print(f"bench cases: {sum(r['torch_equal'] for r in checked)}/{len(checked)} (case, build) pairs torch.equal "
          "(integer views) to eager")
    acceptance(summary)  # printed only: a measurement, not a check of the records


def main():
    # --lib-base PATH: another libditops (e.g. main's, built from its tree) timed beside this one as
    # "ditops:base" and checked with torch.equal at every bench case; taken off argv before
    # script_main parses the shared options.
    base = None
    if "--lib-base" in sys.argv:
        i = sys.argv.index("--lib-base")
        base = Ditops(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    return script_main(Ditops, [("VERIFY", lambda dt, rows, meta: verify(dt, rows)),
                                ("GRAPH", lambda dt, rows, meta: graph_replay(dt, rows))],
                       lambda dt, rows, meta: run_bench(dt, rows, meta, base))


if __name__ == "__main__":
    sys.exit(main())
