"""qknorm_rope's eager chains: a per-head RMSNorm (F.rms_norm, diffusers' RMSNorm or MochiRMSNorm),
then eager RoPE."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import fallback, oracle


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


def rope_complex_eager(x, cos, sin, rope_dim):
    """Qwen-Image's apply_rotary_emb_qwen(use_real=False) on the first rope_dim channels of x
    [T, H, D]: x.float() as complex64 pairs times complex64 frequencies cos + i sin (cos/sin
    [T, rope_dim] with one value per channel, the pair's value twice), one cast at the end."""
    R = rope_dim
    xc = torch.view_as_complex(x[..., :R].float().unflatten(-1, (R // 2, 2)).contiguous())
    freqs = torch.complex(cos[:, None, 0::2].contiguous(), sin[:, None, 0::2].contiguous())
    o = torch.view_as_real(xc * freqs).flatten(-2).to(x.dtype)
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


def rms_norm_mean_eager(x, weight, eps, round_twice):
    """RMSNorm per head as diffusers writes it: the variance by x.float().pow(2).mean(-1) (aten's
    generic reduction on CUDA, not F.rms_norm's fused kernel), then x * rsqrt(variance + eps) in
    fp32. round_twice: cast to the weight's dtype, then the weight multiply in that dtype
    (diffusers.models.normalization.RMSNorm with a 16-bit weight); else the weight multiply in
    fp32 and one cast to x's dtype (MochiRMSNorm)."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(variance + eps)
    if round_twice:
        return y.to(weight.dtype) * weight
    return (y * weight).to(x.dtype)


def rms_norm_eager(x, weight, eps, norm_order="aten", norm_weight_rounding="once"):
    """The per-head RMSNorm chain the fused op's norm options name: norm_order="aten_mean" is
    rms_norm_mean_eager (diffusers' RMSNorm with twice, MochiRMSNorm with once); any other order
    is F.rms_norm (the warp order has no chain of its own), followed by the weight multiply in
    the activation dtype when twice."""
    twice = norm_weight_rounding == "twice"
    if norm_order == "aten_mean":
        return rms_norm_mean_eager(x, weight, eps, twice)
    D = x.shape[-1]
    if twice:
        return F.rms_norm(x, (D,), None, eps) * weight
    return F.rms_norm(x, (D,), weight, eps)


def qknorm_rope_eager(q, k, q_weight, k_weight, cos_sin_cache, positions, rope_dim, is_neox, eps,
                      cache_full_width=False, k_eps=None, norm_order="aten",
                      norm_weight_rounding="once", rope_product="real"):
    """RMSNorm per head (rms_norm_eager: F.rms_norm by default), then eager RoPE: returns new
    (q, k) of q's and k's shapes [T, H, D]. k_eps: k's own eps when it differs from q's (the fused
    op takes one)."""
    cos, sin = full_cos_sin(cos_sin_cache, positions, rope_dim, is_neox, cache_full_width)
    native = cos_sin_cache.dtype != torch.float32

    def norm(x, w, e):
        return rms_norm_eager(x, w, e, norm_order, norm_weight_rounding)

    if rope_product == "complex":  # interleaved pairs, fp32 cache (the op's rule)
        return (rope_complex_eager(norm(q, q_weight, eps), cos, sin, rope_dim),
                rope_complex_eager(norm(k, k_weight, eps if k_eps is None else k_eps), cos, sin, rope_dim))
    qo = rope_eager(norm(q, q_weight, eps), cos, sin, rope_dim, is_neox, native)
    ko = rope_eager(norm(k, k_weight, eps if k_eps is None else k_eps), cos, sin, rope_dim, is_neox,
                    native)
    return qo, ko


# The name bench/qknorm_rope_torch.py has always used.
def eager_chain(q, k, wq, wk, cache, pos, R, neox, eps, full_width=False):
    return qknorm_rope_eager(q, k, wq, wk, cache, pos, R, neox, eps, full_width)


@oracle("qknorm_rope")
def _oracle(x, o):
    # The chains whose order the options follow: F.rms_norm (aten, once), diffusers' RMSNorm
    # (aten_mean, twice) and MochiRMSNorm (aten_mean, once).
    order, weight_rounding = o["norm_order"], o["norm_weight_rounding"]
    if o["rounding"] != "rounded" or order not in ("aten", "aten_mean") or \
            (order == "aten" and weight_rounding != "once"):
        return None
    full_width = o["cache_full_width"] == "true"
    rope_dim = int(o["rope_dim"])
    if rope_dim == 0:  # from the cache width, as the op reads it
        rope_dim = x["cos_sin_cache"].shape[1] // (2 if full_width else 1)
    q, k = qknorm_rope_eager(x["q"], x["k"], x["q_weight"], x["k_weight"], x["cos_sin_cache"],
                             x["positions"], rope_dim, o["is_neox"] == "true", float(o["eps"]), full_width,
                             norm_order=order, norm_weight_rounding=weight_rounding,
                             rope_product=o.get("rope_product", "real"))
    return {"q": q, "k": k}


@fallback("qknorm_rope")
def _fallback(x, o):
    # rounding=fp32 is `close` to the aten chain: that chain stands in for it.
    if o["rounding"] == "fp32" and o["norm_order"] == "aten":
        return _oracle(x, dict(o, rounding="rounded"))
    return _oracle(x, o)
