"""swiglu on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal against the eager chain F.silu(x[..., :N]) * x[..., N:]
   (ditops.eager.swiglu): FLUX.2-dev's feed-forward (image and text tokens, H = 18432) and single
   block (x the mlp columns of to_qkv_mlp_proj's output, out the columns [D, D + H) of the cat
   buffer, its attention columns left as they were), FLUX.2-klein widths, f16 and f32, odd widths
   (the scalar path), inputs off 16-byte alignment, and special values compared bytewise with NaN
   patterns taken as equal; then a CUDA graph replay on fresh inputs.
2. Benchmark at the FLUX.2 shapes: device copy of the same bytes, eager (silu + mul), torch.compile
   of it, ditops, each timed cold (ditops as a one-kernel CUDA graph), rotated (buffer sets over 3x
   the L2 in one CUDA graph) and cold alone in a CUDA graph, medians; byte model: x read once
   (2N values), out written once (N values): 3 * rows * N * itemsize bytes. bench/act_rows_bench.py
   runs them.
"""
import sys

import torch
from act_rows_bench import ActBench, graph_replay, run_bench, verify
from torch_bench_common import DitopsLib, load_eager, script_main

D, H = 6144, 18432  # FLUX.2-dev: inner dim, mlp width
SPEC = ActBench(
    op="swiglu", x_columns=2, eager=load_eager().swiglu,
    # (label, M, N, dtype, x row, x column, out row, out column, storage offset)
    cases=[("flux2 ff image", 4608, H, torch.bfloat16, None, 0, None, 0, 0),
           ("flux2 ff text", 512, H, torch.bfloat16, None, 0, None, 0, 0),
           ("flux2 single block", 5120, H, torch.bfloat16, 3 * D + 2 * H, 3 * D, D + H, D, 0),
           ("klein ff", 4608, 9216, torch.bfloat16, None, 0, None, 0, 0),
           ("klein single block", 4608, 9216, torch.bfloat16, 3 * 3072 + 2 * 9216, 3 * 3072, 3072 + 9216, 3072, 0),
           ("f16", 1024, H, torch.float16, None, 0, None, 0, 0),
           ("f32", 1024, 4608, torch.float32, None, 0, None, 0, 0),
           ("odd width", 33, 3071, torch.bfloat16, None, 0, None, 0, 0),
           ("odd width f16", 7, 17, torch.float16, None, 0, None, 0, 0),
           ("misaligned", 127, H, torch.bfloat16, None, 0, None, 0, 1),
           ("one row", 1, H, torch.bfloat16, None, 0, None, 0, 0)],
    bench=[("flux2 ff (4608) 2x18432", 4608, H, None, 0, None, 0),
           ("flux2 ff text (512) 2x18432", 512, H, None, 0, None, 0),
           ("flux2 single (5120) cat", 5120, H, 3 * D + 2 * H, 3 * D, D + H, D),
           ("flux2 ff (16384) 2x18432", 16384, H, None, 0, None, 0),
           ("klein ff (4608) 2x9216", 4608, 9216, None, 0, None, 0)],
    specials=[0.0, -0.0, float("inf"), -float("inf"), float("nan"), "max", "-max", "tiny", "tiny/4", -100.0, 100.0,
              88.0, -88.0, 1.0, -1.0],
    graph=(4608 + 512, H, 3 * D + 2 * H, 3 * D, D + H, D),
    prefix_cases=[("flux2 single (5120)", 5120, H, D), ("odd prefix", 33, H, 3)])


def main():
    return script_main(DitopsLib, [("VERIFY", lambda dt, rows, meta: verify(dt, SPEC, rows)),
                                   ("GRAPH", lambda dt, rows, meta: graph_replay(dt, SPEC, rows))],
                       lambda dt, rows, meta: run_bench(dt, SPEC, rows, meta))


if __name__ == "__main__":
    sys.exit(main())
