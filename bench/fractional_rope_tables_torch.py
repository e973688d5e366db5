"""fractional_rope_tables on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal against the eager chain (ditops.eager.fractional_rope_tables: LTX-2's
   LTX2AudioVideoRotaryPosEmbed.forward after its frequencies) and against the diffusers module
   itself where diffusers imports: LTX-2's video tables (the pipeline's pixel-space bounds of a
   16 x 24 x 16 latent grid at 24 fps, dim 4096, split: two padding columns), the audio and the
   cross-modal attentions' one-axis tables, the interleaved layout, positions given as [B, A, P],
   random and large positions; then a CUDA graph replay on fresh coords.
2. Benchmark at the LTX-2 shapes: device copy of the same bytes, eager (about 20 kernels),
   torch.compile of it, ditops, each timed cold (ditops as a one-kernel CUDA graph), rotated
   (buffer sets over 3x the L2 in one CUDA graph) and cold alone in a CUDA graph, medians; byte
   model: coords and freqs read once, cos and sin written once (2 x B x P x W f32).
"""
import sys

import torch
from torch_bench_common import (DitopsLib, allow_recompiles, case_selected, copy_buffers, copy_impl,
                                graph_on_side_stream, load_eager, measure, report, report_header, rotation_count,
                                script_main, shape_str)

_eager = load_eager()
VIDEO_BASES, AUDIO_BASES = (20, 2048, 2048), (20,)


def options(bases, layout, pdl=True):
    b = list(bases) + [1, 1]
    return dict(max_pos0=b[0], max_pos1=b[1], max_pos2=b[2], layout=layout, use_pdl=pdl, backend="jit")


class Ditops(DitopsLib):
    def tables(self, coords, freqs, cos, sin, bases, layout, stream=None, pdl=True):
        return self.call("fractional_rope_tables", stream, options(bases, layout, pdl), coords=coords, freqs=freqs,
                         cos=cos, sin=sin)


def eager(coords, freqs, bases, width, layout):
    return _eager.fractional_rope_tables(coords, freqs, bases, width, layout)


def video_coords(frames, height, width, fps=24.0, batch=1):
    """The pipeline's pixel-space bounds (LTX2AudioVideoRotaryPosEmbed.prepare_video_coords, patch 1,
    scale factors 8, 32, 32, causal offset 1), written out: [B, 3, P, 2]."""
    f, h, w = torch.meshgrid(torch.arange(frames, dtype=torch.float32), torch.arange(height, dtype=torch.float32),
                             torch.arange(width, dtype=torch.float32), indexing="ij")
    grid = torch.stack([f, h, w]).flatten(1)
    bounds = torch.stack([grid, grid + 1], -1) * torch.tensor([8.0, 32.0, 32.0]).view(3, 1, 1)
    bounds[0] = (bounds[0] + 1 - 8).clamp(min=0) / fps
    return bounds.unsqueeze(0).repeat(batch, 1, 1, 1).cuda()


def audio_coords(frames, batch=1):
    """prepare_audio_coords (scale 4, hop 160, 16 kHz, causal offset 1): [B, 1, P, 2] seconds."""
    grid = torch.arange(frames, dtype=torch.float32)
    start = (grid * 4 + 1 - 4).clip(min=0) * 160 / 16000
    end = ((grid + 1) * 4 + 1 - 4).clip(min=0) * 160 / 16000
    return torch.stack([start, end], -1).view(1, 1, frames, 2).repeat(batch, 1, 1, 1).cuda()


def freqs_for(frequencies):
    return _eager.module_freqs(10000.0, frequencies, True, torch.device("cuda"))


# (label, coords, dim, bases, layout)
def cases(gen):
    return [("ltx2 video 6144", video_coords(16, 24, 16), 4096, VIDEO_BASES, "split"),
            ("ltx2 audio 126", audio_coords(126), 2048, AUDIO_BASES, "split"),
            ("ltx2 cross-attn video 6144", video_coords(16, 24, 16)[:, 0:1], 2048, VIDEO_BASES, "split"),
            ("ltx2 video interleaved", video_coords(4, 8, 8), 4096, VIDEO_BASES, "interleaved"),
            ("positions [B, A, P]", video_coords(4, 8, 8).mean(-1), 4096, VIDEO_BASES, "split"),
            ("batch 2", video_coords(2, 4, 4, batch=2), 96, VIDEO_BASES, "split"),
            ("odd width", torch.rand(1, 3, 37, 2, device="cuda", generator=gen) * 2000, 130, VIDEO_BASES, "split"),
            ("large positions", torch.rand(1, 3, 64, 2, device="cuda", generator=gen) * 1e5, 4096, VIDEO_BASES,
             "split")]


def run(dt, coords, dim, bases, layout, pdl=True):
    axes = coords.shape[1]
    frequencies = dim // (2 * axes)
    width = dim // 2 if layout == "split" else dim
    freqs = freqs_for(frequencies)
    cos = torch.empty(coords.shape[0], coords.shape[2], width, device="cuda")
    sin = torch.empty_like(cos)
    impl = dt.tables(coords, freqs, cos, sin, bases, layout, pdl=pdl)
    torch.cuda.synchronize()
    return impl, freqs, width, cos, sin


def module_tables(coords, dim, bases, layout):
    """The diffusers module's own forward (None where diffusers does not import); its modality is the
    one whose base sizes the case uses."""
    try:
        from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed
    except ImportError:
        return None
    modality = "video" if bases == VIDEO_BASES else "audio"
    module = LTX2AudioVideoRotaryPosEmbed(dim=dim, modality=modality, rope_type=layout, num_attention_heads=32)
    return module(coords)


def verify(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    ok, n = True, 0
    for label, coords, dim, bases, layout in cases(gen):
        for pdl in (True, False):
            impl, freqs, width, cos, sin = run(dt, coords, dim, bases, layout, pdl)
            want_cos, want_sin = eager(coords, freqs, bases, width, layout)
            equal = torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
            n += 1
            ok = ok and equal
            if not equal:
                print(f"MISMATCH {impl} {label} pdl={pdl}: cos {(cos != want_cos).sum().item()}, "
                      f"sin {(sin != want_sin).sum().item()} elements of {cos.numel()}", flush=True)
            rows.append(dict(kind="verify", op="fractional_rope_tables", impl=impl, case=label + ("" if pdl else " nopdl"),
                             shape=list(coords.shape), dim=dim, layout=layout, oracle="eager", torch_equal=equal))
        if label.startswith("ltx2 video 6144") or label.startswith("ltx2 audio"):
            module = module_tables(coords, dim, bases, layout)
            if module is not None:
                B, P = cos.shape[:2]
                got = (cos.reshape(B, P, 32, -1).swapaxes(1, 2), sin.reshape(B, P, 32, -1).swapaxes(1, 2))
                equal = torch.equal(got[0], module[0]) and torch.equal(got[1], module[1])
                n += 1
                ok = ok and equal
                print(f"{label}: equal to the diffusers module: {equal}")
                rows.append(dict(kind="verify", op="fractional_rope_tables", impl=impl, case=label + " (module)",
                                 shape=list(coords.shape), dim=dim, layout=layout, oracle="diffusers module",
                                 torch_equal=equal))
    print(f"verification: {sum(r['torch_equal'] for r in rows if r.get('op') == 'fractional_rope_tables')}/{n} "
          "runs torch.equal")
    return ok


def graph_replay(dt, rows, meta):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(3)
    coords = video_coords(16, 24, 16)
    freqs = freqs_for(682)
    cos = torch.empty(1, coords.shape[2], 2048, device="cuda")
    sin = torch.empty_like(cos)
    dt.tables(coords, freqs, cos, sin, VIDEO_BASES, "split")  # resolve outside the capture
    graph = graph_on_side_stream(lambda stream: dt.tables(coords, freqs, cos, sin, VIDEO_BASES, "split", stream=stream))
    results = {}
    for trial in range(3):
        coords.copy_(torch.rand(coords.shape, device="cuda", generator=gen) * 2000)
        graph.replay()
        torch.cuda.synchronize()
        want_cos, want_sin = eager(coords, freqs, VIDEO_BASES, 2048, "split")
        results[f"replay_{trial}_equal"] = torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    print("graph replay:", results)
    rows.append(dict(kind="graph", op="fractional_rope_tables", **results))
    return all(results.values())


BENCH = [("ltx2 video 6144 (dim 4096)", lambda: video_coords(16, 24, 16), 4096, VIDEO_BASES),
         ("ltx2 video 24576 (dim 4096)", lambda: video_coords(16, 48, 32), 4096, VIDEO_BASES),
         ("ltx2 cross-attn 6144 (dim 2048)", lambda: video_coords(16, 24, 16)[:, 0:1].contiguous(), 2048,
          VIDEO_BASES)]


def run_bench(dt, rows, meta):
    allow_recompiles()
    compiled = torch.compile(eager, dynamic=False)
    report_header(30)
    for name, make_coords, dim, bases in BENCH:
        if not case_selected(name):
            continue
        coords0 = make_coords()
        B, A, P = coords0.shape[:3]
        F, W = dim // (2 * A), dim // 2
        freqs = freqs_for(F)
        nbytes = coords0.numel() * 4 + F * 4 + 2 * 4 * B * P * W
        sets = []
        for _ in range(rotation_count(nbytes)):
            t = dict(coords=coords0.clone(), cos=torch.empty(B, P, W, device="cuda"),
                     sin=torch.empty(B, P, W, device="cuda"))
            t["src"], t["dst"] = copy_buffers(nbytes)
            sets.append(t)
        t0 = sets[0]
        dt.tables(t0["coords"], freqs, t0["cos"], t0["sin"], bases, "split")
        graph = graph_on_side_stream(
            lambda s: dt.tables(t0["coords"], freqs, t0["cos"], t0["sin"], bases, "split", stream=s))
        impls = [copy_impl(sets, lambda t: t["src"], lambda t: t["dst"]),
                 ("torch_eager", lambda: eager(t0["coords"], freqs, bases, W, "split"),
                  [lambda t=t: eager(t["coords"], freqs, bases, W, "split") for t in sets]),
                 ("torch_compile", lambda: compiled(t0["coords"], freqs, bases, W, "split"),
                  [lambda t=t: compiled(t["coords"], freqs, bases, W, "split") for t in sets]),
                 ("ditops:jit", graph.replay,
                  [lambda t=t: dt.tables(t["coords"], freqs, t["cos"], t["sin"], bases, "split") for t in sets])]
        report(measure(impls), rows, meta, "fractional_rope_tables", name, shape_str((B, A, P)), nbytes, 30)
        sets = t0 = graph = None  # release before the next case allocates
        torch.cuda.empty_cache()


def main():
    return script_main(Ditops, [("VERIFY", verify), ("GRAPH", graph_replay)], run_bench)


if __name__ == "__main__":
    sys.exit(main())
