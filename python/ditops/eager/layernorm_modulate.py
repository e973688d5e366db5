"""The eager chains of layernorm_modulate, layernorm_modulate_fp8, layernorm_modulate_fp8_rowwise and
qk_head_layernorm: F.layer_norm without affine, the adaLN modulation, static e4m3 or the rowwise
dynamic recipe (fp8_rowwise_eager)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import eager
from .fp8_rowwise import fp8_rowwise_eager
from .fp8_static_quant import static_quant_fp8_eager


@eager("layernorm_modulate")
def layernorm_modulate_eager(x, scale, shift, eps):
    """F.layer_norm (no affine) * (1 + scale[:, None]) (+ shift[:, None]); x [B, S, D],
    scale/shift [B, D] (shift None: no add)."""
    y = F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale[:, None])
    return y + shift[:, None] if shift is not None else y


@eager("layernorm_modulate_fp8", fp8_reciprocal="ieee")
def layernorm_modulate_fp8_eager(x, scale, shift, input_scale, eps):
    """layernorm_modulate's chain, then static e4m3 with eager's IEEE reciprocal."""
    return static_quant_fp8_eager(layernorm_modulate_eager(x, scale, shift, eps), input_scale)


@eager("layernorm_modulate_fp8_rowwise")
def layernorm_modulate_fp8_rowwise_eager(x, scale, shift, eps):
    """layernorm_modulate_eager, then the rowwise dynamic e4m3: (out [B, S, D] e4m3, out_scale
    [B, S, 1] fp32)."""
    return fp8_rowwise_eager(layernorm_modulate_eager(x, scale, shift, eps))


@eager("qk_head_layernorm")
def qk_head_layernorm_eager(q, k, eps):
    """F.layer_norm over the head dim of q and k (no affine)."""
    return F.layer_norm(q, (q.shape[-1],), eps=eps), F.layer_norm(k, (k.shape[-1],), eps=eps)

