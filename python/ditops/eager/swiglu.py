"""swiglu's eager chain: FLUX.2's Flux2SwiGLU, F.silu(x[..., :N]) * x[..., N:] (also what
fp8_rowwise_quant's act="swiglu" quantizes)."""
from __future__ import annotations

import torch.nn.functional as F

from ._registry import eager


def swiglu(x):
    """FLUX.2's SwiGLU of x [..., 2N] as eager PyTorch computes it: F.silu of the first N columns
    (fp32 inside, rounded to x's dtype) times the last N (one more rounding)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@eager("swiglu")
def swiglu_eager(x, out=None):
    """The op's chain: swiglu(x), in out's shape where the call passes one ([M, N] beside a
    [..., 2N] x)."""
    y = swiglu(x)
    return y if out is None else y.reshape(out.shape)
