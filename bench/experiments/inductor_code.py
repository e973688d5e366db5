"""Prints the Triton source torch.compile (Inductor) generates for `residual + update * gate` at
the residual_gate_add benchmark shapes whose timings sit closest to ours (an experiment: what
block size, grid and eviction hints the peer picks), then the launch configuration its autotuner
kept for each kernel (block sizes, warps, registers). Run on the GPU machine:
    python bench/experiments/inductor_code.py > inductor_code.txt
"""
import gc

import torch
from torch._inductor.utils import run_and_get_code


def chain(residual, update, gate):
    return residual + update * gate


CASES = [("flux_image", (1, 4096, 3072), (1, 1, 3072), False), ("qwen_cfg", (2, 6912, 3072), (2, 1, 3072), False),
         ("sana_transposed", (1, 32760, 2240), (1, 1, 2240), True),
         ("transposed_medium", (2, 513, 256), (1, 1, 256), True),
         ("sana_odd_tokens", (1, 32761, 2240), (1, 1, 2240), True)]


_printed = set()


def print_kept_configs():
    """The configuration each new Inductor kernel launched with after autotuning."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    for obj in gc.get_objects():
        try:  # gc also lists weak proxies whose referent is gone
            autotuner = isinstance(obj, CachingAutotuner) and bool(getattr(obj, "launchers", None))
        except ReferenceError:
            continue
        if autotuner and id(obj) not in _printed:
            _printed.add(id(obj))
            for launcher in obj.launchers:
                cfg = launcher.config
                print(f"  kept: {obj.fn.__name__} {cfg.kwargs} num_warps={cfg.num_warps} num_stages={cfg.num_stages} "
                      f"regs={getattr(launcher, 'n_regs', '?')} spills={getattr(launcher, 'n_spills', '?')} "
                      f"shared={getattr(launcher, 'shared', '?')}")

for name, shape, gshape, transposed in CASES:
    torch._dynamo.reset()
    if transposed:
        B, T, H = shape
        r = torch.randn(B, H, T, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    else:
        r = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(gshape, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(chain, dynamic=False)
    _, sources = run_and_get_code(compiled, r, u, g)
    print(f"==== {name} {shape} gate {gshape}{' transposed' if transposed else ''}")
    for src in sources:
        keep = False
        for line in src.splitlines():
            # the kernel definitions and their launch lines, not the module boilerplate
            if line.startswith("@triton") or "triton_heuristics" in line or "def triton_" in line:
                keep = True
            if keep:
                print(line)
            if keep and line.strip() == "''', device_str='cuda')":
                keep = False
            if ".run(" in line or "grid=" in line:
                print(line)
    compiled(r, u, g)
    torch.cuda.synchronize()
    print_kept_configs()
