"""token_cat_fp8's eager chain: FLUX.2's single-block concatenation, then static e4m3."""
from __future__ import annotations

import torch

from ._registry import oracle
from .fp8_static_quant import static_quant_fp8_eager


def token_cat_fp8_eager(attn, mlp, input_scale):
    """FLUX.2 single block: the attention output and the MLP activation concatenated along the
    channels, then static e4m3 with eager's IEEE reciprocal (token_cat_fp8's fp8_reciprocal="ieee")."""
    return static_quant_fp8_eager(torch.cat([attn, mlp], -1), input_scale)


@oracle("token_cat_fp8")
def _oracle(x, o):
    if o["fp8_reciprocal"] != "ieee":
        return None
    return {"out": token_cat_fp8_eager(x["attn"], x["mlp"], x["input_scale"])}
