"""Does writing a single block's GELU straight into proj_out's input pay (an experiment deciding
_common.cat_attention_and_gelu, not a kernel benchmark)? On CUDA, at FLUX.1's and HunyuanVideo's
single-block widths (attention 3072 columns, MLP 12288), times in one run, buffers rotated:

  chain:  gelu(mlp) (aten's vectorized kernel), then torch.cat([attn, gelu], dim=2)
  direct: aten.gelu.out into the buffer's strided MLP columns (the non-vectorized kernel), then
          the attention columns copied in
  copy:   a device copy of the buffer's bytes (the roof for either)

and checks that both give the same bytes on every buffer set. docs/tuning/single_block_cat.md has
the numbers (the direct form lost: the strided GELU takes twice the vectorized one's time).

    PYTHONPATH=BUILD/python python3 bench/experiments/gelu_into_cat.py [ROWS ...]     (default 4608 5120)
"""
import sys

import torch


def timed(fn):
    """Median us of fn() over 50 calls (the model bench's CUDA-event timing)."""
    from ditops.diffusers.bench import time_forward
    return time_forward(torch, fn, 50, 5)[0] * 1000.0


def main():
    rows_list = [int(a) for a in sys.argv[1:]] or [4608, 5120]
    D, M, sets = 3072, 12288, 4  # 4 rotating sets: 4 x 300+ MB, beyond the 50 MB L2
    print(torch.cuda.get_device_name(), torch.__version__)
    for rows in rows_list:
        attn = [torch.randn(1, rows, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        mlp = [torch.randn(1, rows, M, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(sets)]
        out = [torch.empty(1, rows, D + M, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        gelu = torch.nn.GELU(approximate="tanh")
        i = [0]

        def nxt():
            i[0] = (i[0] + 1) % sets
            return i[0]

        def chain_of(k):
            return torch.cat([attn[k], gelu(mlp[k])], dim=2)

        def direct_of(k):
            torch.ops.aten.gelu.out(mlp[k], approximate="tanh", out=out[k][..., D:])
            out[k][..., :D].copy_(attn[k])
            return out[k]

        def chain():
            return chain_of(nxt())

        def direct():
            return direct_of(nxt())

        def gelu_only():
            k = nxt()
            return gelu(mlp[k])

        def gelu_strided():
            k = nxt()
            return torch.ops.aten.gelu.out(mlp[k], approximate="tanh", out=out[k][..., D:])

        src = [torch.empty(rows * (D + M) * 2, device="cuda", dtype=torch.uint8) for _ in range(sets)]
        dst = [torch.empty_like(s) for s in src]

        def copy():
            k = nxt()
            dst[k].copy_(src[k])

        same = all(torch.equal(chain_of(k), direct_of(k)) for k in range(sets))
        moved = 2 * rows * (D + M) * 2  # read mlp + attn, write the buffer: one pass each way
        res = {n: timed(f) for n, f in (("chain", chain), ("direct", direct), ("gelu", gelu_only),
                                         ("gelu_strided", gelu_strided), ("copy", copy))}
        print(f"rows {rows}: torch.equal {same}; " + ", ".join(f"{n} {us:.1f} us" for n, us in res.items())
              + f"; direct {moved / res['direct'] / 1e3:.0f} GB/s, {res['copy'] / res['direct']:.2f} of a copy")


if __name__ == "__main__":
    main()
