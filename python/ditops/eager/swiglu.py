"""swiglu's eager chain: FLUX.2's Flux2SwiGLU, F.silu(x[..., :N]) * x[..., N:] (also what
fp8_rowwise_quant's act="swiglu" quantizes)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import eager


def swiglu(x):
    """FLUX.2's SwiGLU of x [..., 2N] as eager PyTorch computes it: F.silu of the first N columns
    (fp32 inside, rounded to x's dtype) times the last N (one more rounding)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@eager("swiglu")
def swiglu_eager(x, out=None, prefix=None):
    """The op's chain: swiglu(x), after the prefix's columns where the call passes one
    (torch.cat([prefix, swiglu(x)], -1)), in out's shape where the call passes one ([M, ...] beside
    a [..., 2N] x)."""
    y = swiglu(x)
    if prefix is not None:
        y = torch.cat([prefix.reshape(*y.shape[:-1], prefix.shape[-1]), y], dim=-1)
    return y if out is None else y.reshape(out.shape)
