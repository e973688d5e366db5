"""joint_qknorm_rope's eager chain: the dual-stream attention's QK prep as FLUX.1 and FLUX.2 write it
(FluxAttnProcessor, Flux2AttnProcessor): each stream's per-head norm, torch.cat of q, k and v along
the tokens, then RoPE of the joint rows."""
from __future__ import annotations

import torch

from ._registry import fallback, oracle
from .qknorm_rope import full_cos_sin, rms_norm_eager, rope_complex_eager, rope_eager


def joint_qknorm_rope_eager(q1, k1, v1, q2, k2, v2, q1_weight, k1_weight, q2_weight, k2_weight, cos_sin_cache,
                            positions, rope_dim, is_neox, eps, cache_full_width=False, norm_order="aten",
                            norm_weight_rounding="once", rope_product="real"):
    """q1/k1/v1 [B, S1, H, D], q2/k2/v2 [B, S2, H, D] -> new (q, k, v) [B, S1 + S2, H, D]: the norms
    (rms_norm_eager: F.rms_norm by default), torch.cat([stream 1, stream 2], dim=1), then eager RoPE
    with the cache rows of `positions` [S1 + S2] (one table for the batch)."""
    def norm(x, w):
        return rms_norm_eager(x, w, eps, norm_order, norm_weight_rounding)

    q = torch.cat([norm(q1, q1_weight), norm(q2, q2_weight)], dim=1)
    k = torch.cat([norm(k1, k1_weight), norm(k2, k2_weight)], dim=1)
    v = torch.cat([v1, v2], dim=1)
    cos, sin = full_cos_sin(cos_sin_cache, positions, rope_dim, is_neox, cache_full_width)  # [J, R]: broadcast
    if rope_product == "complex":  # interleaved pairs, fp32 cache (the op's rule)
        return rope_complex_eager(q, cos, sin, rope_dim), rope_complex_eager(k, cos, sin, rope_dim), v
    native = cos_sin_cache.dtype != torch.float32
    return rope_eager(q, cos, sin, rope_dim, is_neox, native), rope_eager(k, cos, sin, rope_dim, is_neox, native), v


@oracle("joint_qknorm_rope")
def _oracle(x, o):
    # qknorm_rope's: the chains whose order the options follow (F.rms_norm: aten, once; diffusers'
    # RMSNorm: aten_mean, twice; MochiRMSNorm: aten_mean, once).
    order, weight_rounding = o["norm_order"], o["norm_weight_rounding"]
    if o["rounding"] != "rounded" or order not in ("aten", "aten_mean") or \
            (order == "aten" and weight_rounding != "once"):
        return None
    full_width = o["cache_full_width"] == "true"
    rope_dim = int(o["rope_dim"])
    if rope_dim == 0:  # from the cache width, as the op reads it
        rope_dim = x["cos_sin_cache"].shape[1] // (2 if full_width else 1)
    q, k, v = joint_qknorm_rope_eager(
        x["q1"], x["k1"], x["v1"], x["q2"], x["k2"], x["v2"], x["q1_weight"], x["k1_weight"], x["q2_weight"],
        x["k2_weight"], x["cos_sin_cache"], x["positions"], rope_dim, o["is_neox"] == "true", float(o["eps"]),
        full_width, norm_order=order, norm_weight_rounding=weight_rounding, rope_product=o["rope_product"])
    return {"q": q, "k": k, "v": v}


@fallback("joint_qknorm_rope")
def _fallback(x, o):
    # rounding=fp32 is `close` to the aten chain: that chain stands in for it.
    if o["rounding"] == "fp32" and o["norm_order"] == "aten":
        return _oracle(x, dict(o, rounding="rounded"))
    return _oracle(x, o)
