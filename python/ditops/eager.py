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
                      norm_weight_rounding="once"):
    """RMSNorm per head (rms_norm_eager: F.rms_norm by default), then eager RoPE: returns new
    (q, k) of q's and k's shapes [T, H, D]. k_eps: k's own eps when it differs from q's (the fused
    op takes one)."""
    cos, sin = full_cos_sin(cos_sin_cache, positions, rope_dim, is_neox, cache_full_width)
    native = cos_sin_cache.dtype != torch.float32

    def norm(x, w, e):
        return rms_norm_eager(x, w, e, norm_order, norm_weight_rounding)

    qo = rope_eager(norm(q, q_weight, eps), cos, sin, rope_dim, is_neox, native)
    ko = rope_eager(norm(k, k_weight, eps if k_eps is None else k_eps), cos, sin, rope_dim, is_neox,
                    native)
    return qo, ko


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


# The name bench/qknorm_rope_torch.py has always used.
def eager_chain(q, k, wq, wk, cache, pos, R, neox, eps, full_width=False):
    return qknorm_rope_eager(q, k, wq, wk, cache, pos, R, neox, eps, full_width)


# ---------------------------------------------------------------- adaLN family
# One copy each: bench/residual_gate_add_torch.py, bench/layernorm_modulate_torch.py and
# bench/norm_scale_shift_torch.py load this file by path, tests/python/test_torch_gpu.py imports it.


def residual_gate_add_eager(residual, update, gate):
    """The gated residual as models write it: the product rounded to the dtype, then the sum."""
    return residual + update * gate


def residual_gate_add_float32_eager(residual, update, gate):
    """Wan's gated residuals (diffusers WanTransformerBlock): an f32 gate beside bf16/f16 residual
    and update, `(x.float() + attn_output * gate).type_as(x)` (the FFN's `ff_output.float() * gate`
    is the same product): product and sum in fp32, one rounding."""
    return (residual.float() + update * gate).type_as(residual)


def layernorm_modulate_eager(x, scale, shift, eps):
    """F.layer_norm (no affine) * (1 + scale[:, None]) (+ shift[:, None]); x [B, S, D],
    scale/shift [B, D] (shift None: no add)."""
    y = F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale[:, None])
    return y + shift[:, None] if shift is not None else y


def static_quant_fp8_eager(y, input_scale):
    """Static e4m3 quantization with eager's IEEE reciprocal (layernorm_modulate_fp8's
    fp8_reciprocal="ieee")."""
    return (y.float() * (1.0 / input_scale)).clamp(-448, 448).to(torch.float8_e4m3fn)


def token_cat_fp8_eager(attn, mlp, input_scale):
    """FLUX.2 single block: the attention output and the MLP activation concatenated along the
    channels, then static e4m3 with eager's IEEE reciprocal (token_cat_fp8's fp8_reciprocal="ieee")."""
    return static_quant_fp8_eager(torch.cat([attn, mlp], -1), input_scale)


def fp8_static_quant_eager(x, scale):
    """fp8_static_quant with fp8_reciprocal="ieee": eager's static e4m3 quantization of x [M, K]."""
    return static_quant_fp8_eager(x, scale)


def fp8_linear_eager(x, x_scale, w, w_scale, bias=None):
    """fp8_linear as an eager chain: x quantized as fp8_static_quant does (when 16-bit), the
    dequantized product in fp32, the bias, one rounding to bf16. Not the oracle of any contract
    (fp8_linear's are `close` to the fp64 product; torch's fp32 matmul order is its own): the
    benchmarks' reference value and a fallback."""
    xq = x if x.dtype == torch.float8_e4m3fn else static_quant_fp8_eager(x, x_scale)
    y = (xq.float() @ w.float().t()) * (x_scale.float() * w_scale.float()).reshape(())
    if bias is not None:
        y = y + bias.float()
    return y.to(torch.bfloat16)


def fp8_linear_scaled_mm(x, x_scale, w, w_scale, bias=None):
    """fp8_linear as PyTorch's own FP8 linear runs it on CUDA: x quantized as fp8_static_quant does
    (when 16-bit, IEEE reciprocal), then torch._scaled_mm (cuBLASLt). fp8_linear.cublaslt's
    contract: byte-equal to this on the same device and cuBLASLt library."""
    xq = x if x.dtype == torch.float8_e4m3fn else static_quant_fp8_eager(x, x_scale)
    return torch._scaled_mm(xq, w.t(), scale_a=x_scale.reshape(1).float(), scale_b=w_scale.reshape(1).float(),
                            bias=bias, out_dtype=torch.bfloat16)


def qk_head_layernorm_eager(q, k, eps):
    """F.layer_norm over the head dim of q and k (no affine)."""
    return F.layer_norm(q, (q.shape[-1],), eps=eps), F.layer_norm(k, (k.shape[-1],), eps=eps)


def nss_broadcast(op, B, S, D):
    """A norm_scale_shift broadcast operand as a tensor that broadcasts against [B, S, D] in eager
    ops ([B, D] -> [B, 1, D]; per-frame [B, F, 1, D] -> every frame's row over its tokens)."""
    if op is None or op.dim() in (0, 1) or op.dim() == 3:
        return op
    if op.dim() == 2:
        return op[:, None, :]
    F_ = op.shape[1]
    return op.expand(op.shape[0], F_, S // F_, D).reshape(op.shape[0], S, D)


def norm_scale_shift_eager(x, scale, shift=None, *, norm="layer", eps=1e-6, weight=None, bias=None,
                           residual=None, gate=None):
    """v = residual + x * gate (or residual + x; or x), y = norm(v) * (1 + scale) (+ shift).
    Returns (y, v)."""
    B, S, D = x.shape
    if residual is not None:
        v = residual + x * nss_broadcast(gate, B, S, D) if gate is not None else residual + x
    else:
        v = x
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


# ---------------------------------------------------------------- copy family


def causal_conv3d_cat_pad_eager(x, cache=None, padding=(0, 0, 0, 0, 0, 0)):
    """The input of a video VAE's causal Conv3D: the cached past frames prepended along time, then
    zero padding, F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr)). padding is
    F.pad's tuple (wl, wr, ht, hb, dl, dr) with dl the conv's whole left time padding, of which the
    cache supplies ct = cache.shape[2] frames (the op's pad_w_left ... pad_t_right options)."""
    wl, wr, ht, hb, dl, dr = padding
    if cache is not None:
        x = torch.cat([cache, x], 2)
        dl = dl - cache.shape[2]
    return F.pad(x, (wl, wr, ht, hb, dl, dr))


def oracle_outputs(op, x, o):
    """The tensors the eager chain writes for a call of `op` (x: tensors by slot name, o: options
    as the op table's text), or None where no eager chain is that call's oracle. Each op adds its
    branch here beside its chain; tests/python/test_ops_eager.py checks every case against it."""
    eps = float(o.get("eps", "1e-6"))
    if op == "qknorm_rope":
        # The chains whose order the options follow: F.rms_norm (aten, once), diffusers' RMSNorm
        # (aten_mean, twice) and MochiRMSNorm (aten_mean, once).
        order, weight_rounding = o.get("norm_order", "aten"), o.get("norm_weight_rounding", "once")
        if o.get("rounding", "rounded") != "rounded" or order not in ("aten", "aten_mean") or \
                (order == "aten" and weight_rounding != "once"):
            return None
        full_width = o.get("cache_full_width") == "true"
        rope_dim = int(o.get("rope_dim", "0"))
        if rope_dim == 0:  # from the cache width, as the op reads it
            rope_dim = x["cos_sin_cache"].shape[1] // (2 if full_width else 1)
        q, k = qknorm_rope_eager(x["q"], x["k"], x["q_weight"], x["k_weight"], x["cos_sin_cache"],
                                 x["positions"], rope_dim, o.get("is_neox") == "true", eps, full_width,
                                 norm_order=order, norm_weight_rounding=weight_rounding)
        return {"q": q, "k": k}
    if op == "residual_gate_add":
        promoted = x["gate"].dtype == torch.float32 and x["residual"].dtype != torch.float32
        chain = residual_gate_add_float32_eager if promoted else residual_gate_add_eager
        return {"out": chain(x["residual"], x["update"], x["gate"])}
    if op in ("layernorm_modulate", "layernorm_modulate_fp8"):
        y = layernorm_modulate_eager(x["x"], x["scale"], x.get("shift"), eps)
        if op == "layernorm_modulate_fp8":
            if o.get("fp8_reciprocal", "ieee") != "ieee":
                return None
            y = static_quant_fp8_eager(y, x["input_scale"])
        return {"out": y}
    if op == "qk_head_layernorm":
        q, k = qk_head_layernorm_eager(x["q"], x["k"], eps)
        return {"q_out": q, "k_out": k}
    if op == "token_cat_fp8":
        if o.get("fp8_reciprocal", "ieee") != "ieee":
            return None
        return {"out": token_cat_fp8_eager(x["attn"], x["mlp"], x["input_scale"])}
    if op == "fp8_static_quant":
        if o.get("fp8_reciprocal", "ieee") != "ieee":
            return None
        return {"out": fp8_static_quant_eager(x["x"], x["scale"])}
    if op == "cross_head_qknorm_rope":
        if o.get("rounding", "rounded") != "rounded":
            return None
        q, k = cross_head_qknorm_rope_eager(
            x["q"], x["k"], x.get("q_weight"), x.get("k_weight"), x.get("q_cos"), x.get("q_sin"), x.get("k_cos"),
            x.get("k_sin"), head_dim=int(o.get("head_dim", "128")), eps=eps, rope=o.get("rope", "interleaved"))
        return {"q": q, "k": k}
    if op == "fp8_linear":
        # torch._scaled_mm is the chain fp8_linear.cublaslt is byte-equal to, on CUDA only; on the
        # CPU every implementation is `close` to the fp64 product and no chain is an oracle.
        if not x["x"].is_cuda or o.get("fp8_reciprocal", "ieee") != "ieee" or x["w"].shape[0] % 16 != 0:
            return None  # torch._scaled_mm takes N % 16 == 0 only (as cuBLASLt's FP8 layouts)
        return {"out": fp8_linear_scaled_mm(x["x"], x["x_scale"], x["w"], x["w_scale"], x.get("bias"))}
    if op == "causal_conv3d_cat_pad":
        pads = [int(o.get(n, "0")) for n in ("pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom",
                                                "pad_t_left", "pad_t_right")]
        return {"out": causal_conv3d_cat_pad_eager(x["x"], x.get("cache"), pads)}
    if op == "norm_scale_shift":
        numerics = o.get("numerics", "eager")
        if numerics not in ("eager", "float32") or "input_scale" in x or "global_scale" in x:
            return None
        if numerics == "float32":
            y, v = norm_scale_shift_float32_eager(x["x"], x.get("scale"), x.get("shift"), eps=eps,
                                                  weight=x.get("weight"), bias=x.get("bias"),
                                                  residual=x.get("residual"), gate=x.get("gate"))
        else:
            y, v = norm_scale_shift_eager(x["x"], x.get("scale"), x.get("shift"), norm=o.get("norm", "layer"),
                                          eps=eps, weight=x.get("weight"), bias=x.get("bias"),
                                          residual=x.get("residual"), gate=x.get("gate"))
        return {"y": y, "residual_out": v} if "residual" in x else {"y": y}
    return None


def fallback_outputs(op, x, o):
    """What the torch ops write when they fall back (ditops.torch): the call's oracle outputs,
    and for a `close` mode whose contract is stated against an eager chain, that chain (the
    oracle itself is within any bound stated against it). None where no eager chain may stand in
    for the call: the caller raises then."""
    if op == "qknorm_rope" and o.get("rounding") == "fp32" and o.get("norm_order", "aten") == "aten":
        return oracle_outputs(op, x, dict(o, rounding="rounded"))
    return oracle_outputs(op, x, o)
