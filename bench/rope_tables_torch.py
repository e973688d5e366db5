"""rope_tables on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal against the eager chain (ditops.eager.rope_tables: diffusers'
   get_1d_rotary_pos_embed per axis with float64 frequencies, cat over the axes): FLUX.1's joint
   ids (512 text rows of zeros, then (0, h, w) over the latent grid; axes 16, 56, 56; theta 10000),
   FLUX.2's image ids (0, h, w, 0) and text ids (0, 0, 0, l) (axes 32 x 4; theta 2000), one row,
   one axis, a column slice of a wider ids tensor, a column-major ids, large and negative
   positions, other bases; then a CUDA graph replay on fresh ids.
2. Benchmark at the FLUX shapes: device copy of the same bytes, eager (about 13 kernels per axis
   and the cats), torch.compile of it, ditops, each timed cold (ditops as a one-kernel CUDA graph),
   rotated (buffer sets over 3x the L2 in one CUDA graph) and cold alone in a CUDA graph, medians;
   byte model: ids read once (S x A f32), cos and sin written once (2 x S x D f32).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

FLUX1 = ((16, 56, 56), 10000.0)
FLUX2 = ((32, 32, 32, 32), 2000.0)


def options(axes, theta, pdl=True):
    o = {f"axes_dim{a}": (axes[a] if a < len(axes) else 0) for a in range(4)}
    return dict(o, theta=repr(float(theta)), use_pdl=pdl, backend="jit")


class Ditops(DitopsLib):
    def rope_tables(self, ids, cos, sin, axes, theta, stream=None, pdl=True):
        return self.call("rope_tables", stream, options(axes, theta, pdl), ids=ids, cos=cos, sin=sin)


_eager = load_eager()


def eager(ids, axes, theta):
    return _eager.rope_tables(ids, list(axes), theta)


def flux1_ids(text, H, W):
    grid = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(H, dtype=torch.float32),
                                      torch.arange(W, dtype=torch.float32), indexing="ij"), -1).reshape(-1, 3)
    return torch.cat([torch.zeros(text, 3), grid]).cuda()


def flux2_image_ids(H, W):
    h, w = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing="ij")
    z = torch.zeros_like(h)
    return torch.stack([z, h, w, z], -1).reshape(-1, 4).cuda()


def flux2_text_ids(L):
    ids = torch.zeros(L, 4)
    ids[:, 3] = torch.arange(L, dtype=torch.float32)
    return ids.cuda()


def random_ids(S, A, gen, scale=40.0):
    return torch.randn(S, A, device="cuda", generator=gen) * scale


def large_ids():
    v = torch.tensor([1e4, -1e4, -1.0, -4095.5, 32767.0, -65536.0, 1e5, 0.5, -0.0, 0.0, 12345.678, -0.25])
    return torch.stack([v, -v, v * 0.5, torch.where(v == 0, torch.zeros_like(v), 1 / v)], -1).cuda()


def cases(gen):
    """(label, ids, axes, theta)."""
    wide = random_ids(11, 7, gen)
    return [("flux1 joint 4608 (512 + 64x64)", flux1_ids(512, 64, 64), *FLUX1),
            ("flux1 joint 5120 (512 + 64x72)", flux1_ids(512, 64, 72), *FLUX1),
            ("flux2 image 4096 (64x64)", flux2_image_ids(64, 64), *FLUX2),
            ("flux2 text 512", flux2_text_ids(512), *FLUX2),
            ("flux2 image 16384 (128x128)", flux2_image_ids(128, 128), *FLUX2),
            ("one row", random_ids(1, 4, gen), *FLUX2),
            ("seven rows flux1 widths", random_ids(7, 3, gen), *FLUX1),
            ("one axis", random_ids(7, 1, gen), (8,), 10000.0),
            ("more columns than axes", random_ids(9, 5, gen), *FLUX2),
            ("ids column slice", wide[:, 2:5], *FLUX1),
            ("ids column major", random_ids(4, 13, gen).t(), *FLUX2),
            ("large negative positions", large_ids(), *FLUX2),
            ("large negative positions flux1", large_ids()[:, :3], *FLUX1),
            ("theta 256", random_ids(6, 4, gen), FLUX2[0], 256.0),
            ("theta 1e6", random_ids(6, 3, gen), FLUX1[0], 1e6)]


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    for label, ids, axes, theta in cases(gen):
        for pdl in (True, False):
            D = sum(axes)
            cos = torch.full((ids.shape[0], D), float("nan"), device="cuda")
            sin = torch.full_like(cos, float("nan"))
            impl = dt.rope_tables(ids, cos, sin, axes, theta, pdl=pdl)
            torch.cuda.synchronize()
            want_cos, want_sin = eager(ids, axes, theta)
            equal = torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
            n += 1
            ok = ok and equal
            if not equal:
                print(f"MISMATCH {impl} {label} pdl={pdl}: cos {(cos != want_cos).sum().item()}, "
                      f"sin {(sin != want_sin).sum().item()} elements of {cos.numel()}", flush=True)
            rows.append(dict(kind="verify", op="rope_tables", impl=impl, case=label + ("" if pdl else " nopdl"),
                             shape=list(ids.shape), axes=list(axes), theta=theta, oracle="eager",
                             torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == 'rope_tables')}/{n} runs torch.equal")
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    axes, theta = FLUX2
    ids = flux2_image_ids(64, 64)
    cos = torch.empty(ids.shape[0], sum(axes), device="cuda")
    sin = torch.empty_like(cos)
    dt.rope_tables(ids, cos, sin, axes, theta)  # resolve outside the capture
    graph = graph_on_side_stream(lambda stream: dt.rope_tables(ids, cos, sin, axes, theta, stream=stream))
    results = {}
    for trial in range(3):
        ids.copy_(random_ids(ids.shape[0], 4, gen, scale=100.0))
        graph.replay()
        torch.cuda.synchronize()
        want_cos, want_sin = eager(ids, axes, theta)
        results[f"replay_{trial}_equal"] = torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="rope_tables", **results))
    return all(results.values())


BENCH = [("flux1 joint 4608 (16,56,56)", lambda: flux1_ids(512, 64, 64), FLUX1),
         ("flux2 image 4096 (32x4)", lambda: flux2_image_ids(64, 64), FLUX2),
         ("flux2 text 512 (32x4)", lambda: flux2_text_ids(512), FLUX2)]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    report_header(30)
    for name, make_ids, (axes, theta) in BENCH:
        if not case_selected(name):
            continue
        ids0 = make_ids()
        S, A, D = ids0.shape[0], ids0.shape[1], sum(axes)
        nbytes = 4 * S * A + 2 * 4 * S * D
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = dict(ids=ids0.clone(), cos=torch.empty(S, D, device="cuda"), sin=torch.empty(S, D, device="cuda"))
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]
        dt.rope_tables(t0["ids"], t0["cos"], t0["sin"], axes, theta)
        graph = graph_on_side_stream(lambda s: dt.rope_tables(t0["ids"], t0["cos"], t0["sin"], axes, theta, stream=s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["ids"], axes, theta),
                  [lambda t=t: eager(t["ids"], axes, theta) for t in sets]),
                 ("torch_compile", lambda: compiled(t0["ids"], axes, theta),
                  [lambda t=t: compiled(t["ids"], axes, theta) for t in sets]),
                 ("ditops:jit", graph.replay,
                  [lambda t=t: dt.rope_tables(t["ids"], t["cos"], t["sin"], axes, theta) for t in sets])]
        report(measure(impls), rows, meta, "rope_tables", name, shape_str((S, A)), nbytes, 30)
        sets = t0 = graph = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
