"""First use inside a CUDA-graph capture (docs/jit.md, "Graph capture"): a process whose very
first ditops calls are inside `torch.cuda.graph`, on a capture stream ditops has never seen, with
an empty cubin cache (so the NVRTC compile, the module load, the cuBLASLt handle, workspace and
plan all happen during the capture). The capture must stay valid, the replays must give what an
eager call gives after the inputs change, and the process's CUDA RNG must still work afterwards.
Each scenario runs in a fresh subprocess: nothing may be warm. Skipped without a GPU."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import cuda_or_skip

torch = cuda_or_skip()

PRELUDE = textwrap.dedent("""
    import torch
    import ditops.torch  # noqa: F401
    ops = torch.ops.ditops
    torch.manual_seed(0)
    dev = "cuda"
""")

# fp8_linear with the automatic choice at the default quality (cuBLASLt, bit-exact to
# torch._scaled_mm) and a bf16 x, so fp8_static_quant's kernel is compiled during the capture too;
# then a changed x_scale and x before the replay.
FP8_LINEAR = PRELUDE + textwrap.dedent("""
    M, N, K = 3, 8192, 5120
    x = torch.randn(M, K, device=dev).to(torch.bfloat16)
    w = (torch.randn(N, K, device=dev) * 32).to(torch.float8_e4m3fn)
    xs = torch.tensor([0.025], device=dev)
    ws = torch.tensor([0.02], device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.fp8_linear(x, xs, w, ws, None)
    ran = ditops.torch.last_dispatch().ran
    assert ran == "fp8_linear.cublaslt", ran
    xs.fill_(0.031)
    x.copy_(torch.randn(M, K, device=dev))
    g.replay()
    torch.cuda.synchronize()
    eager = ops.fp8_linear(x, xs, w, ws, None)
    from ditops.eager import fp8_linear_scaled_mm
    want = fp8_linear_scaled_mm(x, xs, w, ws)
    torch.randn(8, device=dev)  # the RNG state survived the capture
    assert torch.equal(out, eager), "replay differs from an eager call"
    assert torch.equal(out, want), "replay differs from torch._scaled_mm"
    print("CAPTURE_OK", ran)
""")

# A JIT kernel (residual_gate_add) compiled and loaded during the capture.
RESIDUAL = PRELUDE + textwrap.dedent("""
    r = torch.randn(2, 333, 3072, device=dev).to(torch.bfloat16)
    u = torch.randn(2, 333, 3072, device=dev).to(torch.bfloat16)
    gate = torch.randn(2, 1, 3072, device=dev).to(torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.residual_gate_add(r, u, gate)
    ran = ditops.torch.last_dispatch().ran
    assert ran.startswith("residual_gate_add.") and ran != "residual_gate_add.reference", ran
    u.copy_(torch.randn(2, 333, 3072, device=dev))
    g.replay()
    torch.cuda.synchronize()
    torch.randn(8, device=dev)
    assert torch.equal(out, r + u * gate), "replay differs from the eager chain"
    print("CAPTURE_OK", ran)
""")


@pytest.mark.parametrize("script", [FP8_LINEAR, RESIDUAL], ids=["fp8_linear_auto", "residual_gate_add_jit"])
def test_first_use_inside_a_capture_in_a_fresh_process(script, tmp_path):
    env = dict(os.environ, DITOPS_CACHE_DIR=str(tmp_path / "empty-cache"), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "CAPTURE_OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
