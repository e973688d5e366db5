# Does the layout of q/k/v change the time of the SDPA kernel the models call? (GPU; PyTorch only)
#   python3 bench/experiments/attention_layout.py [--json OUT.json]
# FLUX.2's single blocks: eager gives SDPA fresh contiguous q and k ([B, S, H, D], the norms' outputs)
# and v as a chunk of to_qkv_mlp_proj's output (token stride 3 * 6144 + 2 * 18432); ditops normalizes q
# and k in place, so all three are chunks of that output. FLUX.1 / Qwen-Image / Wan give all three
# contiguous [B, S, H, D] (permuted to [B, H, S, D] views). Each variant is timed alone (CUDA events
# around 20 back-to-back calls, median of 15 rounds, variants interleaved per round) and its kernel
# named from one profiled call.
import argparse, json, statistics
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

ap = argparse.ArgumentParser()
ap.add_argument("--json")
args = ap.parse_args()
dev, bf = "cuda", torch.bfloat16
torch.manual_seed(0)


def packed(S, H, D, row):
    """q, k, v [B, S, H, D] as chunks of one [1, S, row] projection output (row >= 3 * H * D)."""
    buf = torch.randn(1, S, row, device=dev, dtype=bf)
    n = H * D
    return [buf[..., i * n:(i + 1) * n].unflatten(-1, (H, D)) for i in range(3)]


def fresh(S, H, D):
    return [torch.randn(1, S, H, D, device=dev, dtype=bf) for _ in range(3)]


def variants():
    S, H, D = 4608, 48, 128  # FLUX.2-dev: 512 text + 4096 image tokens, 48 heads of 128
    row = 3 * 6144 + 2 * 18432
    pq, pk, pv = packed(S, H, D, row)
    fq, fk, fv = fresh(S, H, D)
    yield "flux2 single: q,k fresh, v chunk (eager)", (fq, fk, pv)
    yield "flux2 single: q,k,v chunks (ditops in place)", (pq, pk, pv)
    yield "flux2 single: q,k,v fresh", (fq, fk, fv)
    yield "flux2 single: q,k,v [B,H,S,D] contiguous", tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (fq, fk, fv))
    S, H = 4608, 24  # FLUX.1-dev / Qwen-Image
    q1, k1, v1 = fresh(S, H, D)
    yield "flux1 joint: q,k,v fresh [B,S,H,D]", (q1, k1, v1)
    yield "flux1 joint: q,k,v chunks of a 3*3072 row", tuple(packed(S, H, D, 3 * H * D))


def sdpa(q, k, v):
    # diffusers' native backend: [B, S, H, D] permuted to [B, H, S, D] views
    return F.scaled_dot_product_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3))


cases = list(variants())
times = {name: [] for name, _ in cases}
for name, t in cases:  # warm-up
    for _ in range(3):
        sdpa(*t)
torch.cuda.synchronize()
for _ in range(15):
    for name, t in cases:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            sdpa(*t)
        b.record()
        b.synchronize()
        times[name].append(a.elapsed_time(b) * 1000 / 20)
rows = []
for name, t in cases:
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        sdpa(*t)
        torch.cuda.synchronize()
    kern = [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    us = statistics.median(times[name])
    rows.append(dict(case=name, us=round(us, 2), min_us=round(min(times[name]), 2),
                     strides=[list(x.stride()) for x in t], kernels=[n[:90] for n in kern]))
    print(f"{name:48s} {us:9.2f} us (min {min(times[name]):8.2f})  {[n[:60] for n in kern]}")
print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
if args.json:
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), open(args.json, "w"), indent=1)
