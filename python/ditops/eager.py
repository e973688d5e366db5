"""The unfused PyTorch chains the fused ops replace: the oracle of their bit_exact contracts (on
CUDA), the fallback of the model-layer helpers in ditops.torch, and the reference of the
self-check. One copy: bench/qknorm_rope_torch.py loads this file too.

Needs only torch (no compiled ditops module), so benchmarks can load it by path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rope_eager(x, cos, sin, rope_dim, is_neox, native):
    """RoPE on the first rope_dim channels of x [T, H, D] (already normalized, activation dtype);
    cos/sin [T, rope_dim], one value per rotated channel.

    native=False: fp32 math (x.float() * cos ...) and one cast at the end, as diffusers writes it
    for an fp32 cache; native=True: every op in the activation dtype (16-bit cache)."""
    R = rope_dim
    xr = x[..., :R] if native else x[..., :R].float()
    c, s = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = xr[..., : R // 2], xr[..., R // 2:]
        rot = torch.cat([-x2, x1], -1)
    else:
        pairs = xr.unflatten(-1, (R // 2, 2))
        rot = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    o = (xr * c + rot * s).to(x.dtype)
    return torch.cat([o, x[..., R:]], -1) if R < x.shape[-1] else o


def full_cos_sin(cos_sin_cache, positions, rope_dim, is_neox, cache_full_width):
    """Per-token cos and sin [T, rope_dim] for every rotated channel, from a compact cache
    (rope_dim/2 cos then rope_dim/2 sin per row) or a full-width one (rope_dim cos, rope_dim sin)."""
    R = rope_dim
    rows = cos_sin_cache[positions]
    if cache_full_width:
        return rows[:, :R], rows[:, R:]
    cos, sin = rows[:, : R // 2], rows[:, R // 2:]
    if is_neox:
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def qknorm_rope_eager(q, k, q_weight, k_weight, cos_sin_cache, positions, rope_dim, is_neox, eps,
                      cache_full_width=False, k_eps=None):
    """F.rms_norm per head, then eager RoPE: returns new (q, k) of q's and k's shapes [T, H, D].
    k_eps: k's own eps when it differs from q's (the fused op takes one)."""
    D = q.shape[-1]
    cos, sin = full_cos_sin(cos_sin_cache, positions, rope_dim, is_neox, cache_full_width)
    native = cos_sin_cache.dtype != torch.float32
    qo = rope_eager(F.rms_norm(q, (D,), q_weight, eps), cos, sin, rope_dim, is_neox, native)
    ko = rope_eager(F.rms_norm(k, (D,), k_weight, eps if k_eps is None else k_eps), cos, sin,
                    rope_dim, is_neox, native)
    return qo, ko


# The name bench/qknorm_rope_torch.py has always used.
def eager_chain(q, k, wq, wk, cache, pos, R, neox, eps, full_width=False):
    return qknorm_rope_eager(q, k, wq, wk, cache, pos, R, neox, eps, full_width)
