"""token_cat_fp8's eager chain: FLUX.2's single-block concatenation, then static e4m3."""
from __future__ import annotations

import torch

from ._registry import eager
from .fp8_static_quant import static_quant_fp8_eager


@eager("token_cat_fp8", fp8_reciprocal="ieee")
def token_cat_fp8_eager(attn, mlp, input_scale):
    """FLUX.2 single block: the attention output and the MLP activation concatenated along the
    channels, then static e4m3 with eager's IEEE reciprocal (token_cat_fp8's fp8_reciprocal="ieee")."""
    return static_quant_fp8_eager(torch.cat([attn, mlp], -1), input_scale)

