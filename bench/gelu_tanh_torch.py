"""gelu_tanh on the GPU beside PyTorch (ctypes over the C ABI; needs only libditops).

1. Verification, torch.equal against the eager chain F.gelu(x, approximate="tanh")
   (ditops.eager.gelu_tanh): FLUX.1-dev's and HunyuanVideo's feed-forward (image and text tokens,
   N = 12288) and single block (out the columns [D, D + N) of the cat buffer before proj_out, its
   attention columns left as they were; x also the mlp columns of a fused projection), f16 and f32,
   odd widths (the scalar path), inputs off 16-byte alignment, and special values (GELU's edges,
   tanh's cancellation near -5) compared bytewise with NaN patterns taken as equal; then a CUDA
   graph replay on fresh inputs.
2. Benchmark at the FLUX.1 / HunyuanVideo shapes: device copy of the same bytes, eager (one GELU
   kernel), torch.compile of it, ditops, each timed cold (ditops as a one-kernel CUDA graph), rotated
   (buffer sets over 3x the L2 in one CUDA graph) and cold alone in a CUDA graph, medians; byte
   model: x read once, out written once: 2 * rows * N * itemsize bytes. The single block's case
   writes into the cat buffer's columns (eager and compile write a contiguous output: the cat's
   second pass over those columns is what the model saves). bench/act_rows_bench.py runs them.
"""
import sys

import torch
from act_rows_bench import ActBench, graph_replay, run_bench, verify
from torch_bench_common import DitopsLib, load_eager, script_main

D, N = 3072, 12288  # FLUX.1-dev / HunyuanVideo: inner dim, mlp width
SPEC = ActBench(
    op="gelu_tanh", x_columns=1, eager=load_eager().gelu_tanh,
    # (label, M, N, dtype, x row, x column, out row, out column, storage offset)
    cases=[("flux ff image", 4608, N, torch.bfloat16, None, 0, None, 0, 0),
           ("flux ff text", 512, N, torch.bfloat16, None, 0, None, 0, 0),
           ("flux single block", 4608, N, torch.bfloat16, None, 0, D + N, D, 0),
           ("fused projection", 5120, N, torch.bfloat16, 3 * D + N, 3 * D, D + N, D, 0),
           ("f16", 1024, N, torch.float16, None, 0, None, 0, 0),
           ("f32", 1024, 4608, torch.float32, None, 0, None, 0, 0),
           ("odd width", 33, 3071, torch.bfloat16, None, 0, None, 0, 0),
           ("odd width f16", 7, 17, torch.float16, None, 0, None, 0, 0),
           ("odd width f32", 5, 33, torch.float32, None, 0, None, 0, 0),
           ("misaligned", 127, N, torch.bfloat16, None, 0, None, 0, 1),
           ("one row", 1, N, torch.bfloat16, None, 0, None, 0, 0)],
    bench=[("flux ff (4608) 12288", 4608, N, None, 0, None, 0),
           ("flux ff text (512) 12288", 512, N, None, 0, None, 0),
           ("flux single (5120) cat", 5120, N, None, 0, D + N, D),
           ("hunyuan single (32760) cat", 32760, N, None, 0, D + N, D)],
    specials=[0.0, -0.0, float("inf"), -float("inf"), float("nan"), "max", "-max", "tiny", "tiny/4", -100.0, 100.0,
              -5.0, -4.0, -6.5, -10.0, 1.0, -1.0],
    graph=(4608 + 512, N, None, 0, D + N, D),
    prefix_cases=[("flux single (5120)", 5120, N, D), ("hunyuan single (32760)", 32760, N, D),
                  ("odd prefix", 33, N, 3)])


def main():
    return script_main(DitopsLib, [("VERIFY", lambda dt, rows, meta: verify(dt, SPEC, rows)),
                                   ("GRAPH", lambda dt, rows, meta: graph_replay(dt, SPEC, rows))],
                       lambda dt, rows, meta: run_bench(dt, SPEC, rows, meta))


if __name__ == "__main__":
    sys.exit(main())
