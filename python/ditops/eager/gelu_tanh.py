"""gelu_tanh's eager chain: F.gelu(x, approximate="tanh") (FLUX.1's and HunyuanVideo's
"gelu-approximate"; also what fp8_rowwise_quant's act="gelu_tanh" quantizes)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import eager


def gelu_tanh(x):
    """GELU(tanh) of x as eager PyTorch computes it: fp32 inside, rounded to x's dtype."""
    return F.gelu(x, approximate="tanh")


@eager("gelu_tanh")
def gelu_tanh_eager(x, out=None, prefix=None):
    """The op's chain: gelu_tanh(x), after the prefix's columns where the call passes one
    (torch.cat([prefix, gelu_tanh(x)], -1)), in out's shape where the call passes one ([M, ...]
    beside a [..., N] x)."""
    y = gelu_tanh(x)
    if prefix is not None:
        y = torch.cat([prefix.reshape(*y.shape[:-1], prefix.shape[-1]), y], dim=-1)
    return y if out is None else y.reshape(out.shape)
