"""cross_head_qknorm_rope's eager chain: torch.nn.RMSNorm over the whole row, then Wan's or LTX-2's
RoPE per head."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import eager


def cross_head_rope_eager(x, cos, sin, head_dim, rope):
    """RoPE per head of x [B, S, N] (the normalized projection, activation dtype) as Wan and
    LTX-2 write it: cos/sin [1|B, S, 1|H, head_dim/2] fp32. Interleaved (channels 2j, 2j+1 of a
    head; Wan, LTX-2's interleaved form): first = a*cos - c*sin, second = c*cos + a*sin in fp32, each
    product and sum its own kernel. Split (j and j + head_dim/2; LTX-2): a*cos and c*cos, then
    addcmul_(-sin, c) / addcmul_(sin, a), which CUDA computes as one FMA each. Stored into a tensor
    of x's dtype (one rounding)."""
    heads = x.unflatten(-1, (x.shape[-1] // head_dim, head_dim))
    if rope == "interleaved":
        a, c = heads.unflatten(-1, (-1, 2)).unbind(-1)
        first = a * cos - c * sin
        second = c * cos + a * sin
    else:  # LTX-2's apply_split_rotary_emb: x * cos, then addcmul_ (one FMA: the product exact)
        a, c = heads[..., : head_dim // 2].float(), heads[..., head_dim // 2:].float()
        first = (a * cos).addcmul_(-sin, c)
        second = (c * cos).addcmul_(sin, a)
    out = torch.empty_like(heads)
    if rope == "interleaved":
        out[..., 0::2] = first
        out[..., 1::2] = second
    else:
        out[..., : head_dim // 2] = first
        out[..., head_dim // 2:] = second
    return out.flatten(-2)


@eager("cross_head_qknorm_rope", rounding="rounded")
def cross_head_qknorm_rope_eager(q, k, q_weight, k_weight, q_cos=None, q_sin=None, k_cos=None, k_sin=None, *,
                                 head_dim=128, eps=1e-6, rope="interleaved"):
    """torch.nn.RMSNorm over the whole row (F.rms_norm), then the model's RoPE per head
    (cross_head_rope_eager; none: the norm alone). k takes q's tables when it has none. Returns new
    (q, k)."""
    qn = F.rms_norm(q, (q.shape[-1],), q_weight, eps)
    kn = F.rms_norm(k, (k.shape[-1],), k_weight, eps)
    if rope == "none":
        return qn, kn
    if k_cos is None:
        k_cos, k_sin = q_cos, q_sin
    return (cross_head_rope_eager(qn, q_cos, q_sin, head_dim, rope),
            cross_head_rope_eager(kn, k_cos, k_sin, head_dim, rope))

