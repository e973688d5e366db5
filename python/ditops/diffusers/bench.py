"""Real-width diffusers transformer blocks with random bf16 weights, timed six ways in one run:
eager, eager + ditops, torch.compile, torch.compile + ditops, and the whole forward in CUDA graphs
(ditops.diffusers.capture) without and with ditops: eager + graph, eager + ditops + graph.

    python -m ditops.diffusers.bench --model flux --blocks 2 --tokens 4608 --json flux.json

--fp8 adds the FP8 block linears (issue 43) beside them in the same run: the recipe's plain-torch
chain (fp8chain: every block linear quantizing its input with torch ops, the oracle ditops's FP8
forward equals), torchao's float8 rowwise + torch.compile (torchao 0.18 where it imports; where
it does not, the plain chain compiled, named fp8chain+compile), and ditops FP8 (enable(fp8=True))
eager, + graph, + compile. For those it states the quality against the bf16 eager forward (cosine,
PSNR, max |diff|) after one forward and over a --loop-steps flow-matching Euler denoising loop of
the benched transformer (random weights: compare recipes with it, it is not image quality), the
peak memory, and whether ditops's output is torch.equal to the chain's. --full-depth builds the
released block counts (FLUX.1 19 + 38, Wan 14B 40, Qwen-Image 60, HunyuanVideo 20 + 40, LTX-2 48).

    python -m ditops.diffusers.bench --model flux --full-depth --tokens 4608 --fp8

Prints the median time per forward and per block of each variant (CUDA events around each
forward, after warm-up), the speed-ups, and where the CUDA time goes (torch.profiler over a few
forwards, kernels sorted by name into GEMM, attention, ditops and the rest, the glue: norms,
RoPE, modulation, residuals, copies, fused Triton kernels). --json writes the records with the
device, the date and the commit. The graph variants also print the memory the first graph and
one more graph (the same shapes, another signature) cost. Needs a CUDA device and diffusers.

Shapes: --tokens is the whole sequence. FLUX.1, FLUX.2 and Qwen-Image take --text-tokens of it as
text (default 512) and the rest as a square-ish image grid; FLUX.1's, FLUX.2's and HunyuanVideo's
--blocks are split into double (first half, rounded up) and single blocks (flux2: FLUX.2-dev's
widths, flux2_klein: klein 4B's). Wan and HunyuanVideo take the
tokens as a latent video grid (--grid F,H,W after patching; by default Wan's 480p 81-frame grid
21x30x52 for 32760 tokens, else one frame), with --text-tokens cross-attention / text tokens. LTX-2
takes --tokens video tokens (6144: its 121-frame 768x512 grid 16x16x24) and the audio tokens of
the same duration (126 for 121 frames), with --text-tokens caption tokens per stream.
Models are cast as from_pretrained(torch_dtype=bfloat16) loads them (Wan keeps its float32 modules).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys

VARIANTS = ("eager", "eager+ditops", "compile", "compile+ditops", "eager+graph", "eager+ditops+graph")
# The FP8 variants (issue 43); torchao's quantization cannot be undone, so it runs last.
FP8_VARIANTS = ("fp8chain", "fp8chain+compile", "torchao+compile", "fp8", "fp8+graph", "fp8+compile")
FP8_DEFAULT = ("eager", "compile", "eager+ditops+graph", "fp8chain", "fp8", "fp8+graph", "fp8+compile",
               "torchao+compile")
# The released block counts: (double, single) for FLUX.1 and HunyuanVideo, else the layers.
FULL_DEPTH = {"flux": (19, 38), "flux2": (8, 48), "qwen": 60, "wan": 40, "hunyuan": (20, 40),
              "ltx2": 48}

# Real widths (the released checkpoints' configs); blocks and tokens come from the command line.
CONFIGS = {
    "flux": dict(patch_size=1, in_channels=64, attention_head_dim=128, num_attention_heads=24,
                 joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56)),
    # FLUX.2-dev: 48 x 128 heads (hidden 6144), MLP 18432 after SwiGLU, Mistral-3 text (15360)
    "flux2": dict(patch_size=1, in_channels=128, attention_head_dim=128, num_attention_heads=48,
                  joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
                  axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=True),
    # FLUX.2-klein 4B: 24 x 128 (hidden 3072), Qwen3-4B text (7680), no guidance embedder
    "flux2_klein": dict(patch_size=1, in_channels=128, attention_head_dim=128, num_attention_heads=24,
                        joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
                        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False),
    "qwen": dict(patch_size=2, in_channels=64, out_channels=16, attention_head_dim=128, num_attention_heads=24,
                 joint_attention_dim=3584, axes_dims_rope=(16, 56, 56)),
    "wan": dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, cross_attn_norm=True, eps=1e-6),
    "hunyuan": dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                    num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1, text_embed_dim=4096,
                    pooled_projection_dim=768, rope_axes_dim=(16, 56, 56), guidance_embeds=True),
    # LTX-2 (19B): video 32 x 128, audio 32 x 64, Gemma-3 captions (3840), split RoPE
    "ltx2": dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
                 attention_head_dim=128, cross_attention_dim=4096, audio_in_channels=128, audio_out_channels=128,
                 audio_num_attention_heads=32, audio_attention_head_dim=64, audio_cross_attention_dim=2048,
                 caption_channels=3840, rope_type="split"),
}
CLASSES = {"flux": "FluxTransformer2DModel", "flux2": "Flux2Transformer2DModel",
           "flux2_klein": "Flux2Transformer2DModel", "qwen": "QwenImageTransformer2DModel",
           "wan": "WanTransformer3DModel", "hunyuan": "HunyuanVideoTransformer3DModel",
           "ltx2": "LTX2VideoTransformer3DModel"}

# Kernel name patterns of the profile's categories (first match wins; the rest is glue).
KERNEL_CLASSES = (
    ("ditops", re.compile(r"ditops", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|gmma|hmma|matmul|sm\d+_xmma", re.I)),
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ditops.diffusers.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(CONFIGS), default="flux")
    p.add_argument("--blocks", type=int, default=2, help="transformer blocks (FLUX.1/HunyuanVideo: double + single)")
    p.add_argument("--tokens", type=int, default=4608, help="sequence length: text + image, or latent video tokens")
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--grid", default=None, help="Wan/HunyuanVideo/LTX-2 latent grid after patching: F,H,W")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=30, help="timed forwards per variant (the median is reported)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-iters", type=int, default=3, help="forwards under torch.profiler (0: no profile)")
    p.add_argument("--variants", default=None, help="a comma list of " + ", ".join(VARIANTS + FP8_VARIANTS)
                   + " (default: the first six; with --fp8: " + ", ".join(FP8_DEFAULT) + ")")
    p.add_argument("--fp8", action="store_true", help="the FP8 variants beside bf16 eager / compile")
    p.add_argument("--fp8-skip", default="", help="Fp8Config.skip: comma list of glob patterns kept in bf16")
    p.add_argument("--no-producers", action="store_true", help="Fp8Config(producers=False): the chain everywhere")
    p.add_argument("--loop-steps", type=int, default=28, help="denoising steps of the FP8 quality loop (0: none)")
    p.add_argument("--full-depth", action="store_true", help="the released block counts (overrides --blocks)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: its default)")
    p.add_argument("--no-fullgraph", action="store_true", help="torch.compile without fullgraph=True")
    p.add_argument("--compile-scope", choices=("whole", "regional"), default=None,
                   help="torch.compile of the whole model, or diffusers' compile_repeated_blocks (one compile per "
                        "block class; default: regional with --full-depth, else whole)")
    p.add_argument("--quality", default=None, help="ditops quality tier (default: the bit-exact one)")
    p.add_argument("--probe", action="store_true", help="enable(probe=True): also try undocumented chains")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the records to this path")
    args = p.parse_args(argv)
    default = FP8_DEFAULT if args.fp8 else VARIANTS
    args.variants = [v.strip() for v in (args.variants or ",".join(default)).split(",") if v.strip()]
    unknown = set(args.variants) - set(VARIANTS + FP8_VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    # torchao quantizes the model in place, for good: its variant runs after every other
    args.variants = [v for v in args.variants if v != "torchao+compile"] + \
        [v for v in args.variants if v == "torchao+compile"]
    if args.full_depth:
        depth = FULL_DEPTH[args.model]
        args.blocks = sum(depth) if isinstance(depth, tuple) else depth
    if args.compile_scope is None:
        args.compile_scope = "regional" if args.full_depth else "whole"
    return args


def compile_model(torch, model, args, fullgraph):
    """The compiled callable: torch.compile(model), or the model with its repeated blocks compiled
    in place (diffusers' compile_repeated_blocks, as users compile a full-depth model)."""
    if args.compile_scope == "regional":
        model.compile_repeated_blocks(fullgraph=fullgraph, mode=args.compile_mode)
        return model
    return torch.compile(model, fullgraph=fullgraph, mode=args.compile_mode)


def uncompile(model):
    """Undo compile_repeated_blocks (the blocks' compiled call)."""
    for sub in model.modules():
        if getattr(sub, "_compiled_call_impl", None) is not None:
            sub._compiled_call_impl = None


def near_square(n: int) -> tuple[int, int]:
    h = int(math.isqrt(n))
    while n % h:
        h -= 1
    return h, n // h


def video_grid(args) -> tuple[int, int, int]:
    if args.grid:
        f, h, w = (int(v) for v in args.grid.split(","))
        if f * h * w != args.tokens:
            raise SystemExit(f"--grid {args.grid} has {f * h * w} tokens, not --tokens {args.tokens}")
        return f, h, w
    if args.tokens == 32760:
        return 21, 30, 52
    return (1,) + near_square(args.tokens)


def cast_like_from_pretrained(model, dtype):
    """model in dtype except its _keep_in_fp32_modules (Wan: rotary tables, norm1/2/3, modulation
    tables), as from_pretrained(torch_dtype=dtype) loads it; model.to(dtype) would cast those too."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, module in model.named_modules():
        kept = bool(keep & set(name.split(".")))
        for n, p in module.named_parameters(recurse=False):
            if not (kept or n in keep):
                p.data = p.data.to(dtype)
        for n, b in module.named_buffers(recurse=False):
            if b.is_floating_point() and not (kept or n in keep):
                module._buffers[n] = b.to(dtype)
    return model


def ltx2_inputs(args, torch, dev):
    """LTX-2's inputs as its pipeline makes them: --tokens video tokens on a latent grid (VAE scale
    factors 8, 32, 32, patch 1: 121 frames at 768 x 512 are 16 x 16 x 24 = 6144 tokens, the default
    grid for 6144), the audio tokens of the same duration at 24 fps (16 kHz, hop 160, 4x: 25 per
    second, 126 for 121 frames), --text-tokens caption tokens for each stream (the pipeline: 1024)."""
    B, bf16, text = args.batch, torch.bfloat16, args.text_tokens
    f, h, w = (16, 16, 24) if args.tokens == 6144 and not args.grid else video_grid(args)
    audio = round(((f - 1) * 8 + 1) / 24.0 * 16000 / 160 / 4)
    timestep = torch.full((B,), 500.0, device=dev)
    inputs = dict(hidden_states=torch.randn(B, f * h * w, 128, device=dev, dtype=bf16),
                  audio_hidden_states=torch.randn(B, audio, 128, device=dev, dtype=bf16),
                  encoder_hidden_states=torch.randn(B, text, 3840, device=dev, dtype=bf16),
                  audio_encoder_hidden_states=torch.randn(B, text, 3840, device=dev, dtype=bf16),
                  timestep=timestep, sigma=timestep, num_frames=f, height=h, width=w, fps=24.0,
                  audio_num_frames=audio, use_cross_timestep=True, return_dict=False)
    return inputs, f"video {f}x{h}x{w} + audio {audio} + text {text}"


def flux2_inputs(args, cfg, torch, dev):
    """FLUX.2's inputs as its pipeline makes them: --text-tokens text tokens (ids (0, 0, 0, l)) and the
    rest as a square-ish latent grid (ids (0, h, w, 0)); timestep and guidance per batch element."""
    B, bf16, text = args.batch, torch.bfloat16, args.text_tokens
    image = args.tokens - text
    if image <= 0:
        raise SystemExit("--tokens must exceed --text-tokens")
    h, w = near_square(image)

    def ids(*extents):
        return torch.stack(torch.meshgrid(*[torch.arange(float(n)) for n in extents], indexing="ij"), -1).reshape(-1, 4)

    inputs = dict(hidden_states=torch.randn(B, image, cfg["in_channels"], device=dev, dtype=bf16),
                  encoder_hidden_states=torch.randn(B, text, cfg["joint_attention_dim"], device=dev, dtype=bf16),
                  timestep=torch.full((B,), 0.5, device=dev, dtype=bf16),
                  img_ids=ids(1, h, w, 1).to(dev), txt_ids=ids(1, 1, 1, text).to(dev), return_dict=False)
    if cfg["guidance_embeds"]:
        inputs["guidance"] = torch.full((B,), 4.0, device=dev, dtype=bf16)
    return inputs, f"text {text} + image {h}x{w}"


def build(args, torch, diffusers, device="cuda"):
    """(model, inputs, shape text, config) in bf16 with random weights on `device`; norm weights
    around 1 (not all 1, where norm rounding orders agree by accident)."""
    name, B, blocks = args.model, args.batch, args.blocks
    cfg = dict(CONFIGS[name])
    if name in FULL_DEPTH and isinstance(FULL_DEPTH[name], tuple) and getattr(args, "full_depth", False):
        cfg.update(num_layers=FULL_DEPTH[name][0], num_single_layers=FULL_DEPTH[name][1])
    elif name in ("flux", "flux2", "flux2_klein", "hunyuan"):
        cfg.update(num_layers=(blocks + 1) // 2, num_single_layers=blocks // 2)
    else:
        cfg.update(num_layers=blocks)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = getattr(diffusers, CLASSES[name])(**cfg)
    model = cast_like_from_pretrained(model, torch.bfloat16).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname and pname.endswith("weight"):
                p.normal_(1.0, 0.1)
    dev, bf16 = device, torch.bfloat16
    text = args.text_tokens
    if name in ("flux", "qwen"):
        image = args.tokens - text
        if image <= 0:
            raise SystemExit("--tokens must exceed --text-tokens")
        h, w = near_square(image)
        if name == "flux":
            grid = torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij")
            inputs = dict(hidden_states=torch.randn(B, image, 64, device=dev, dtype=bf16),
                          encoder_hidden_states=torch.randn(B, text, 4096, device=dev, dtype=bf16),
                          pooled_projections=torch.randn(B, 768, device=dev, dtype=bf16),
                          timestep=torch.full((B,), 0.5, device=dev, dtype=bf16),
                          guidance=torch.full((B,), 3.5, device=dev, dtype=bf16),
                          img_ids=torch.stack(grid, -1).reshape(-1, 3).to(dev),
                          txt_ids=torch.zeros(text, 3, device=dev), return_dict=False)
        else:
            inputs = dict(hidden_states=torch.randn(B, image, 64, device=dev, dtype=bf16),
                          encoder_hidden_states=torch.randn(B, text, 3584, device=dev, dtype=bf16),
                          timestep=torch.full((B,), 0.5, device=dev, dtype=bf16),
                          img_shapes=[(1, h, w)] * B, return_dict=False)
        shape = f"text {text} + image {h}x{w}"
    elif name in ("flux2", "flux2_klein"):
        inputs, shape = flux2_inputs(args, cfg, torch, dev)
    elif name == "ltx2":
        inputs, shape = ltx2_inputs(args, torch, dev)
        # LTX2Pipeline prepares the RoPE coordinates once per generation and passes them: the model
        # then builds none from host lists inside its forward (a host-to-device copy per call)
        d = torch.device(dev)
        inputs["video_coords"] = model.rope.prepare_video_coords(B, inputs["num_frames"], inputs["height"],
                                                                 inputs["width"], d, fps=inputs["fps"])
        inputs["audio_coords"] = model.audio_rope.prepare_audio_coords(B, inputs["audio_num_frames"], d)
    else:
        f, h, w = video_grid(args)
        latent = torch.randn(B, 16, f, 2 * h, 2 * w, device=dev, dtype=bf16)
        if name == "wan":
            inputs = dict(hidden_states=latent, timestep=torch.full((B,), 500.0, device=dev),
                          encoder_hidden_states=torch.randn(B, text, 4096, device=dev, dtype=bf16),
                          return_dict=False)
        else:
            inputs = dict(hidden_states=latent, timestep=torch.full((B,), 500.0, device=dev, dtype=bf16),
                          encoder_hidden_states=torch.randn(B, text, 4096, device=dev, dtype=bf16),
                          encoder_attention_mask=torch.ones(B, text, device=dev),
                          pooled_projections=torch.randn(B, 768, device=dev, dtype=bf16),
                          guidance=torch.full((B,), 3.5, device=dev, dtype=bf16), return_dict=False)
        shape = f"video {f}x{h}x{w} + text {text}"
    return model, inputs, shape, cfg


def time_forward(torch, fn, iters, warmup):
    """Median and all times (ms) of fn() on the current stream, CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


def kernel_shares(torch, fn, iters):
    """CUDA kernel time per forward (us) by category, the top kernels of each, and the idle time
    between kernels (kernel_gaps), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals = {"gemm": 0.0, "attention": 0.0, "ditops": 0.0, "glue": 0.0}
    by_name = {}  # kernel name -> [category, us, launches]
    spans = []
    for evt in prof.events():
        if getattr(evt, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = evt.time_range.elapsed_us()
        kind = next((k for k, pattern in KERNEL_CLASSES if pattern.search(evt.name)), "glue")
        totals[kind] += us
        entry = by_name.setdefault(evt.name, [kind, 0.0, 0])
        entry[1] += us
        entry[2] += 1
        spans.append((evt.time_range.start, evt.time_range.end, kind))
    return {k: v / iters for k, v in totals.items()}, top_kernels(by_name, iters), kernel_gaps(spans, iters)


def kernel_gaps(spans, iters, top=6):
    """The device's idle time between kernels per forward (us): the gaps between the union of the
    kernels' [start, end) spans, each put on the pair of categories around it (the kernel that
    ended last before it, the one that starts it), the largest pairs first; and the kernels per
    forward. Where a forward's time not in kernel time goes (launch gaps, graph node overheads)."""
    idle, pairs, end, before = 0.0, {}, None, None
    for start, stop, kind in sorted(spans):
        if end is not None and start > end:
            gap = start - end
            idle += gap
            pair = pairs.setdefault(f"{before} -> {kind}", [0.0, 0])
            pair[0] += gap
            pair[1] += 1
        if end is None or stop >= end:
            end, before = stop, kind
    ranked = sorted(pairs.items(), key=lambda kv: -kv[1][0])[:top]
    return {"idle_us": round(idle / iters, 1), "kernels": round(len(spans) / iters, 2),
            "largest": [{"between": k, "us": round(us / iters, 1), "gaps": round(n / iters, 2)} for k, (us, n) in ranked]}


def top_kernels(by_name, iters, per_class=8, name_chars=160):
    """The kernels that take the most time per forward in each category: [{class, name, us, calls}],
    us and calls per forward (which producer or glue kernel a next change should go after)."""
    rows = sorted(((kind, name, us / iters, calls / iters) for name, (kind, us, calls) in by_name.items()),
                  key=lambda r: -r[2])
    out = []
    for kind in ("ditops", "glue", "gemm", "attention"):
        out += [{"class": k, "name": n[:name_chars], "us": round(us, 1), "calls": round(c, 2)}
                for k, n, us, c in rows if k == kind][:per_class]
    return out


def graph_memory(torch, call):
    """Device memory (MiB) that call() adds: reserved and allocated by PyTorch's allocator, and
    used on the device (cudaMemGetInfo: also the CUDA graph objects themselves)."""
    torch.cuda.synchronize()
    reserved, allocated, free = torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    call()
    torch.cuda.synchronize()
    mib = 1 << 20
    return {"reserved_mib": (torch.cuda.memory_reserved() - reserved) / mib,
            "allocated_mib": (torch.cuda.memory_allocated() - allocated) / mib,
            "device_mib": (free - torch.cuda.mem_get_info()[0]) / mib}


def commit_of_package() -> str:
    """DITOPS_COMMIT when the caller names the tree (a copy without its git history, e.g. a device
    run), else the package's git checkout."""
    if os.environ.get("DITOPS_COMMIT"):
        return os.environ["DITOPS_COMMIT"]
    here = os.path.dirname(os.path.realpath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"], capture_output=True,
                                   text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


# ---------------------------------------------------------------- FP8 (issue 43)

# The latents a denoising loop updates (the outputs in order), and the models whose pipelines pass
# the timestep divided by 1000.
LATENTS = {"ltx2": ("hidden_states", "audio_hidden_states")}
UNIT_TIMESTEP = ("flux", "qwen")


def fp8_config(args):
    from .fp8 import Fp8Config
    return Fp8Config(skip=tuple(p.strip() for p in args.fp8_skip.split(",") if p.strip()),
                     producers=not args.no_producers)


def torchao_rowwise():
    """(quantize(model, paths), torchao version), or (None, why torchao does not import)."""
    try:
        import torchao
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except Exception as e:  # noqa: BLE001 (any import failure: the chain runs in its place)
        return None, f"{type(e).__name__}: {e}"

    def quantize(model, paths):
        # the same linears as ditops's FP8 (quantize_'s default would take every nn.Linear)
        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
                  filter_fn=lambda module, fqn: fqn in paths)
    return quantize, torchao.__version__


def error_stats(torch, out, ref) -> dict:
    """Cosine, PSNR (peak = max |ref|) and max |diff| of out against ref, in float64."""
    x, r = out.double().flatten(), ref.double().flatten()
    mse = float(((x - r) ** 2).mean())
    peak = float(r.abs().max())
    return {"cosine": float(torch.nn.functional.cosine_similarity(x, r, dim=0)),
            "psnr_db": 10 * math.log10(peak ** 2 / mse) if mse > 0 else float("inf"),
            "max_abs": float((x - r).abs().max())}


def denoise(torch, call, inputs, model_name, steps):
    """The latents after `steps` flow-matching Euler steps from sigma 1 to 0, x += (sigma_next -
    sigma) * v(x, sigma), v the transformer's output (FLUX.1's scheduler update, without its
    shift): the same starting latents and conditioning for every variant."""
    keys = LATENTS.get(model_name, ("hidden_states",))
    x = {k: inputs[k].clone() for k in keys}
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for i in range(steps):
        t = sigmas[i] if model_name in UNIT_TIMESTEP else sigmas[i] * 1000.0
        kw = dict(inputs, **x, timestep=torch.full_like(inputs["timestep"], t))
        if "sigma" in inputs:
            kw["sigma"] = torch.full_like(inputs["sigma"], t)
        with torch.inference_mode():
            out = call(kw)
        for k, v in zip(keys, out):
            x[k] = (x[k].float() + (sigmas[i + 1] - sigmas[i]) * v.float()).to(x[k].dtype)
    return torch.cat([x[k].flatten() for k in keys])


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("ditops.diffusers.bench: needs a CUDA device (none is visible)", file=sys.stderr)
        return 2
    try:
        import diffusers
    except ImportError:
        print("ditops.diffusers.bench: needs diffusers (pip install 'ditops[diffusers]')", file=sys.stderr)
        return 2
    import ditops
    import ditops.diffusers as dd
    from . import fp8 as dfp8

    model, inputs, shape, cfg = build(args, torch, diffusers)
    fullgraph = not args.no_fullgraph
    fp8_wanted = any(v in FP8_VARIANTS for v in args.variants)
    config = fp8_config(args)
    torchao_quantize, torchao_version = torchao_rowwise() if "torchao+compile" in args.variants else (None, None)
    if "torchao+compile" in args.variants and torchao_quantize is None:
        print(f"torchao does not import ({torchao_version}): the plain-torch chain of the same recipe, compiled, "
              "runs in its place, named fp8chain+compile", flush=True)
        args.variants = [v for v in args.variants if v != "torchao+compile"]
        if "fp8chain+compile" not in args.variants:
            args.variants.append("fp8chain+compile")

    def forward(m):
        def call():
            with torch.inference_mode():
                out = m(**inputs)
                return out[0] if len(out) == 1 else torch.cat([o.flatten() for o in out])  # LTX-2: video, audio
        return call

    results, outputs, reports, capture_text, capture_dicts, memory = {}, {}, {}, {}, {}, {}
    quality, peaks = {}, {}
    reference = loop_reference = None
    if fp8_wanted:  # the bf16 eager forward and loop every FP8 variant is measured against
        reference = forward(model)()
        if args.loop_steps:
            loop_reference = denoise(torch, lambda kw: model(**kw), inputs, args.model, args.loop_steps)
    chain = None
    for variant in args.variants:
        uses_ditops, compiled = "+ditops" in variant, variant.startswith("compile") or variant.endswith("+compile")
        graphed = variant.endswith("+graph")
        is_fp8 = variant in FP8_VARIANTS
        if dd.enabled(model) or dd.captured(model):
            dd.disable(model)
        if chain is not None:
            chain.restore()
            chain = None
        uncompile(model)
        torch._dynamo.reset()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if variant.startswith("fp8chain"):
            chain = dfp8.plain_chain(model, config)
        elif variant.startswith("fp8"):
            reports[variant] = dd.enable(model, args.quality, probe=args.probe, cuda_graph=graphed, fp8=config)
            forward(model)()  # first-sight checks run eagerly, before any tracing or capture
        elif variant == "torchao+compile":
            torchao_quantize(model, {p for p, _, _, _ in dfp8.select_linears("", model, config)})
            outputs["torchao (eager)"] = forward(model)()
        elif uses_ditops:
            reports[variant] = dd.enable(model, args.quality, probe=args.probe, cuda_graph=graphed)
            forward(model)()  # first-sight checks run eagerly, before any tracing or capture
        elif graphed:
            dd.capture(model)
            forward(model)()  # the signature's first call runs eagerly
        torch.cuda.synchronize()
        after_setup, setup_peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the run's peak, apart from enable's quantization pass
        target = compile_model(torch, model, args, fullgraph) if compiled else model
        fn = forward(target)
        if graphed:
            # the second call captures; then one more graph: the same shapes, another signature
            memory[variant] = {"first_graph": graph_memory(torch, fn)}
            other = dict(inputs, return_dict=True)

            def capture_another():
                with torch.inference_mode():
                    model(**other), model(**other)
            memory[variant]["one_more_graph"] = graph_memory(torch, capture_another)
        outputs[variant] = fn()
        median, times = time_forward(torch, fn, args.iters, args.warmup)
        shares, top, gaps = kernel_shares(torch, fn, args.profile_iters) if args.profile_iters else (None,) * 3
        results[variant] = {"ms": median, "min_ms": min(times), "max_ms": max(times), "kernels_us": shares,
                            "kernels_top": top, "kernel_gaps": gaps}
        if is_fp8 or fp8_wanted:
            peaks[variant] = {"allocated_after_setup_mib": after_setup / (1 << 20),
                              "setup_peak_mib": setup_peak / (1 << 20),
                              "run_peak_mib": torch.cuda.max_memory_allocated() / (1 << 20)}
        if is_fp8:
            quality[variant] = {"one_forward": error_stats(torch, outputs[variant], reference)}
            if args.loop_steps and variant in ("fp8", "fp8chain", "fp8+compile", "fp8chain+compile", "torchao+compile"):
                latents = denoise(torch, lambda kw: target(**kw), inputs, args.model, args.loop_steps)
                quality[variant]["loop"] = error_stats(torch, latents, loop_reference)
        if graphed:
            capture_text[variant], capture_dicts[variant] = str(dd.captured(model)), dd.captured(model).as_dict()
        print(f"{variant:>18}: {median:8.3f} ms per forward, {median / args.blocks:8.3f} ms per block "
              f"(min {min(times):.3f}, max {max(times):.3f}, {len(times)} runs)", flush=True)
    uncompile(model)
    if dd.enabled(model) or dd.captured(model):
        dd.disable(model)
    if chain is not None:
        chain.restore()

    print(f"\n{CLASSES[args.model]} x{args.blocks} blocks, {shape}, batch {args.batch}, bf16, "
          f"{torch.cuda.get_device_name()}")
    base = {"eager+ditops": "eager", "compile+ditops": "compile", "compile": "eager", "eager+graph": "eager",
            "eager+ditops+graph": "eager"}
    speedups = {}
    for variant, ref in base.items():
        if variant in results and ref in results:
            speedups[f"{variant} vs {ref}"] = results[ref]["ms"] / results[variant]["ms"]
    for variant in ("eager+ditops", "eager+ditops+graph") + FP8_VARIANTS:
        if variant in results and "compile" in results and variant != "compile":
            speedups[f"{variant} vs compile"] = results["compile"]["ms"] / results[variant]["ms"]
    fp8_peer = "torchao+compile" if "torchao+compile" in results else "fp8chain+compile"
    for variant in ("fp8", "fp8+graph", "fp8+compile"):
        if variant in results and fp8_peer in results:
            speedups[f"{variant} vs {fp8_peer}"] = results[fp8_peer]["ms"] / results[variant]["ms"]
    if "eager+ditops+graph" in results and "eager+graph" in results:
        speedups["eager+ditops+graph vs eager+graph"] = results["eager+graph"]["ms"] / results["eager+ditops+graph"]["ms"]
    for name, x in speedups.items():
        print(f"  {name}: {x:.3f}x")
    checks = []
    pairs = [("eager+ditops", "eager"), ("compile+ditops", "compile"), ("eager+graph", "eager"),
             ("eager+ditops+graph", "eager"), ("fp8", "fp8chain"), ("fp8+graph", "fp8chain"),
             ("fp8", "torchao (eager)"), ("fp8+compile", "fp8chain+compile")]
    for variant, ref in pairs:
        if variant in outputs and ref in outputs:
            a, b = outputs[variant], outputs[ref]
            checks.append({"variant": variant, "vs": ref, "torch_equal": bool(torch.equal(a, b)),
                           "max_abs_diff": float((a.float() - b.float()).abs().max())})
            print(f"  {variant} output vs {ref}: torch.equal {checks[-1]['torch_equal']}, "
                  f"max |diff| {checks[-1]['max_abs_diff']:.3g}")
    if quality:
        print(f"\n  FP8 against the bf16 eager forward (random weights: compare recipes, not image quality); "
              f"loop: {args.loop_steps} flow-matching Euler steps")
        for variant, q in quality.items():
            rows = [f"{what} cos {m['cosine']:.6f}, PSNR {m['psnr_db']:.2f} dB, max |diff| {m['max_abs']:.4g}"
                    for what, m in q.items()]
            print(f"  {variant:>18}: " + "; ".join(rows))
    if peaks:
        print("\n  memory (MiB, torch.cuda.memory_allocated): after setup (the weights held, inputs, kept outputs) / "
              "peak during setup (enable quantizes linear by linear) / peak while running")
        for variant, m in peaks.items():
            print(f"  {variant:>18}: {m['allocated_after_setup_mib']:10.1f} / {m['setup_peak_mib']:10.1f} / "
                  f"{m['run_peak_mib']:10.1f}")
    if torchao_version and torchao_quantize is not None:
        print(f"  torchao {torchao_version}: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()) on the "
              "same block linears (its set_inductor_config default applies to that variant's compile)")
    if args.profile_iters:
        print("\n  CUDA kernel time per forward (us): gemm / attention / ditops / glue (glue share)")
        for variant, r in results.items():
            k = r["kernels_us"]
            total = sum(k.values()) or 1.0
            print(f"  {variant:>18}: {k['gemm']:9.1f} / {k['attention']:9.1f} / {k['ditops']:9.1f} / "
                  f"{k['glue']:9.1f} ({100 * k['glue'] / total:4.1f} % glue, "
                  f"{100 * k['ditops'] / total:4.1f} % ditops)")
        print("\n  idle between kernels per forward (us, kernels per forward; the largest gaps by the categories around them):")
        for variant, r in results.items():
            g = r["kernel_gaps"]
            print(f"  {variant:>18}: {g['idle_us']:9.1f} ({g['kernels']:g} kernels); "
                  + ", ".join(f"{p['between']} {p['us']:.1f} ({p['gaps']:g})" for p in g["largest"][:4]))
        for variant, r in results.items():  # where the ditops and glue time goes, kernel by kernel
            rows = [t for t in r["kernels_top"] if t["class"] in ("ditops", "glue")]
            print(f"\n  [{variant}] ditops and glue kernels, us per forward (launches):")
            for t in rows:
                print(f"    {t['class']:>6} {t['us']:9.1f} ({t['calls']:g})  {t['name']}")
    for variant, m in memory.items():
        print(f"\n  [{variant}] memory, MiB reserved / allocated / on the device: "
              + "; ".join(f"{what.replace('_', ' ')} +{d['reserved_mib']:.1f} / +{d['allocated_mib']:.1f} / "
                          f"+{d['device_mib']:.1f}" for what, d in m.items()))
    for variant, report in reports.items():
        print(f"\n[{variant}] {report}")
    for variant, text in capture_text.items():
        print(f"\n[{variant}] {text}")

    if args.json:
        props = torch.cuda.get_device_properties(0)
        record_common = {
            "op": f"diffusers:{args.model}", "model": CLASSES[args.model], "blocks": args.blocks,
            "tokens": args.tokens, "text_tokens": args.text_tokens, "batch": args.batch, "shape": shape,
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
            "method": "forward_median_cuda_events", "iters": args.iters,
            "device": f"{torch.cuda.get_device_name()} (sm_{props.major}{props.minor})",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit_of_package(), "ditops": ditops.__version__, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "compile_mode": args.compile_mode, "fullgraph": fullgraph,
            "compile_scope": args.compile_scope, "full_depth": args.full_depth,
            "torchao": torchao_version if torchao_quantize is not None else None,
            "fp8_config": {"skip": list(config.skip), "producers": config.producers} if fp8_wanted else None,
            "loop_steps": args.loop_steps if fp8_wanted else None,
            # the environment's ditops knobs of this run (DITOPS_PDL=0, DITOPS_GELU_TABLE=1, ...): a record
            # says which kernels it timed
            "ditops_env": {k: v for k, v in sorted(os.environ.items())
                           if k.startswith("DITOPS_") and k not in ("DITOPS_COMMIT", "DITOPS_CACHE_DIR")},
        }
        records = [dict(record_common, impl=variant, us=1000.0 * r["ms"], per_block_us=1000.0 * r["ms"] / args.blocks,
                        min_us=1000.0 * r["min_ms"], max_us=1000.0 * r["max_ms"], kernels_us=r["kernels_us"],
                        kernels_top=r["kernels_top"], kernel_gaps=r["kernel_gaps"],
                        output=next((c for c in checks if c["variant"] == variant), None),
                        outputs=[c for c in checks if c["variant"] == variant],
                        report=reports[variant].as_dict() if variant in reports else None,
                        graphs=capture_dicts.get(variant), graph_memory=memory.get(variant),
                        quality=quality.get(variant), memory=peaks.get(variant))
                   for variant, r in results.items()]
        with open(args.json, "w") as f:
            json.dump({"records": records, "speedups": speedups}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
