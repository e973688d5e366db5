"""norm_scale_shift's eager chains: the adaLN pre-norm (an optional gated residual, LayerNorm or
RMSNorm, the modulation) and Wan's float32 chain, each optionally followed by the rowwise dynamic
FP8 recipe (fp8_rowwise_eager: the fp8_rowwise output)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import oracle
from .fp8_rowwise import fp8_rowwise_eager


def nss_broadcast(op, B, S, D):
    """A norm_scale_shift broadcast operand as a tensor that broadcasts against [B, S, D] in eager
    ops ([B, D] -> [B, 1, D]; per-frame [B, F, 1, D] -> every frame's row over its tokens)."""
    if op is None or op.dim() in (0, 1) or op.dim() == 3:
        return op
    if op.dim() == 2:
        return op[:, None, :]
    F_ = op.shape[1]
    return op.expand(op.shape[0], F_, S // F_, D).reshape(op.shape[0], S, D)


def rms_norm_mean_eager(x, eps):
    """diffusers' RMSNorm without a weight (LTX-2's block norms): the variance by
    x.float().pow(2).mean(-1), then (x * rsqrt(variance + eps)).to(x.dtype)."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype)


def norm_scale_shift_eager(x, scale, shift=None, *, norm="layer", eps=1e-6, weight=None, bias=None,
                           residual=None, gate=None, norm_order="aten"):
    """v = residual + x * gate (or residual + x; or x), y = norm(v) * (1 + scale) (+ shift).
    norm_order="aten_mean" (norm="rms", no weight): diffusers' RMSNorm. Returns (y, v)."""
    B, S, D = x.shape
    if residual is not None:
        v = residual + x * nss_broadcast(gate, B, S, D) if gate is not None else residual + x
    else:
        v = x
    if norm == "rms" and norm_order == "aten_mean":
        n = rms_norm_mean_eager(v, eps)
    else:
        n = F.layer_norm(v, (D,), weight, bias, eps) if norm == "layer" else F.rms_norm(v, (D,), weight, eps)
    y = n * (1 + nss_broadcast(scale, B, S, D)) if scale is not None else n
    if shift is not None:
        y = y + nss_broadcast(shift, B, S, D)
    return y, v


def norm_scale_shift_float32_eager(x, scale=None, shift=None, *, eps=1e-6, weight=None, bias=None, residual=None,
                                   gate=None):
    """norm_scale_shift's numerics="float32": diffusers' Wan block with f32 modulation and norms
    (FP32LayerNorm). v = (residual.float() + x * gate).type_as(residual) (the gated residual; no
    gate: the 16-bit residual + x), y = (F.layer_norm(v.float(), (D,), weight, bias, eps)
    * (1 + scale) + shift).type_as(x), each of scale / shift optional (norm2: neither).
    Returns (y, v)."""
    B, S, D = x.shape
    if residual is not None:
        v = (residual.float() + x * nss_broadcast(gate, B, S, D)).type_as(residual) if gate is not None \
            else residual + x
    else:
        v = x
    y = F.layer_norm(v.float(), (D,), weight, bias, eps)
    if scale is not None:
        y = y * (1 + nss_broadcast(scale, B, S, D))
    if shift is not None:
        y = y + nss_broadcast(shift, B, S, D)
    return y.type_as(x), v


def norm_scale_shift_fp8_rowwise_eager(x, scale=None, shift=None, *, numerics="eager", **kwargs):
    """The fp8_rowwise output's chain: y of norm_scale_shift_eager (numerics "eager") or of
    norm_scale_shift_float32_eager ("float32": y in x's dtype), then fp8_rowwise_eager. Returns
    (q [B, S, D] e4m3, s [B, S, 1] float32, y, v)."""
    chain = norm_scale_shift_float32_eager if numerics == "float32" else norm_scale_shift_eager
    y, v = chain(x, scale, shift, **kwargs)
    q, s = fp8_rowwise_eager(y)
    return q, s, y, v


@oracle("norm_scale_shift")
def _oracle(x, o):
    numerics = o["numerics"]
    if numerics not in ("eager", "float32") or "input_scale" in x or "global_scale" in x:
        return None
    rowwise = "fp8_rowwise" in x
    eps = float(o["eps"])
    if numerics == "float32":
        y, v = norm_scale_shift_float32_eager(x["x"], x.get("scale"), x.get("shift"), eps=eps,
                                              weight=x.get("weight"), bias=x.get("bias"),
                                              residual=x.get("residual"), gate=x.get("gate"))
    else:
        y, v = norm_scale_shift_eager(x["x"], x.get("scale"), x.get("shift"), norm=o["norm"],
                                      eps=eps, weight=x.get("weight"), bias=x.get("bias"),
                                      residual=x.get("residual"), gate=x.get("gate"),
                                      norm_order=o.get("norm_order", "aten"))
    out = {"residual_out": v} if "residual" in x else {}
    if rowwise:
        out["fp8_rowwise"], out["fp8_scale"] = fp8_rowwise_eager(y)
    if "y" in x or not rowwise:
        out["y"] = y
    return out
