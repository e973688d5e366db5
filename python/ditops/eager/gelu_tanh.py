"""gelu_tanh's eager chain: F.gelu(x, approximate="tanh") (FLUX.1's and HunyuanVideo's
"gelu-approximate"; also what fp8_rowwise_quant's act="gelu_tanh" quantizes)."""
from __future__ import annotations

import torch.nn.functional as F

from ._registry import eager


def gelu_tanh(x):
    """GELU(tanh) of x as eager PyTorch computes it: fp32 inside, rounded to x's dtype."""
    return F.gelu(x, approximate="tanh")


@eager("gelu_tanh")
def gelu_tanh_eager(x, out=None):
    """The op's chain: gelu_tanh(x), in out's shape where the call passes one ([M, N] beside a
    [..., N] x)."""
    y = gelu_tanh(x)
    return y if out is None else y.reshape(out.shape)
