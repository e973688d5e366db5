# Which calls of a FLUX.1 block put a Memset on the stream (GPU): torch.profiler over single calls of F.linear,
# torch._scaled_mm (rowwise), cuDNN SDPA and torch.empty, eager and in a CUDA graph. Needs PyTorch on CUDA only.
#   python3 bench/experiments/memset_probe.py
import torch, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
dev = "cuda"; torch.manual_seed(0)
bf = torch.bfloat16
x = torch.randn(4608, 3072, device=dev, dtype=bf); w = torch.randn(9216, 3072, device=dev, dtype=bf) * 0.02; b = torch.randn(9216, device=dev, dtype=bf)
xq = x.to(torch.float8_e4m3fn); wq = w.to(torch.float8_e4m3fn); sa = torch.ones(4608, 1, device=dev); sb = torch.ones(1, 9216, device=dev)
q = torch.randn(1, 24, 4608, 128, device=dev, dtype=bf)
cases = {
  "linear bf16 bias": lambda: F.linear(x, w, b),
  "linear bf16": lambda: F.linear(x, w),
  "scaled_mm rowwise bias fast": lambda: torch._scaled_mm(xq, wq.t(), sa, sb, bias=b, out_dtype=bf, use_fast_accum=True),
  "scaled_mm rowwise": lambda: torch._scaled_mm(xq, wq.t(), sa, sb, out_dtype=bf),
  "sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
  "empty": lambda: torch.empty(4608, 3072, device=dev, dtype=bf),
}
try:
    import ditops.torch  # noqa: F401
    sh = torch.randn(1, 3072, device=dev, dtype=bf); sc = torch.randn(1, 3072, device=dev, dtype=bf)
    ops = [n for n in dir(torch.ops.ditops) if not n.startswith("_")]
    print("ditops ops:", ops)
except Exception as e:
    print("ditops import:", e)
for name, fn in cases.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ms = [e for e in ev if "Memset" in e.name or "memset" in e.name]
    print(f"{name:32s} events {len(ev)/5:.1f}/call, memsets {len(ms)/5:.1f}/call", sorted({e.name[:60] for e in ev})[:4])
# inside a graph
g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(2): torch._scaled_mm(xq, wq.t(), sa, sb, bias=b, out_dtype=bf, use_fast_accum=True)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        y = torch._scaled_mm(xq, wq.t(), sa, sb, bias=b, out_dtype=bf, use_fast_accum=True)
        z = F.linear(x, w, b)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    g.replay(); torch.cuda.synchronize()
print("graph replay events:", [e.name[:50] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA])
