"""Wan (diffusers WanTransformer3DModel, 2.1 and 2.2), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE of the self-attention (attn1): torch.nn.RMSNorm over all heads (heads *
    head_dim, before the heads split), then RoPE with interleaved pairs from float32 tables
    (x1*cos - x2*sin, x1*sin + x2*cos, one rounding): cross_head_qknorm_rope, in place on the
    projections (chunks of to_qkv's output with fused projections), reading the tables through
    the views WanAttnProcessor reads (freqs_cos[..., 0::2], freqs_sin[..., 1::2]).
  * QK norm of the text cross-attention (attn2): the same norm over the video queries and the
    text keys (another token count), no RoPE: cross_head_qknorm_rope(rope="none"). I2V's image
    keys (norm_added_k) stay the model's code: a norm of k alone, with no query to pair it with
    in the op's call, over 257 image tokens (a negligible kernel beside the video's).
  * The float32 chains: adaLN (norm1, norm3: (FP32LayerNorm(x.float()) * (1 + scale) +
    shift).type_as(x)), norm2 (norm2(x.float()).type_as(x), an affine FP32LayerNorm) and the two
    gated residuals ((x.float() + update * gate).type_as(x)). Each is one MappedSite whose op is
    one Mapping below, the op call beside the model's chain. Where this build's op table declares
    the float32-chain ops (norm_scale_shift numerics="float32", residual_gate_add with a float32
    gate), the sites run them on 16-bit x directly; otherwise adaLN runs
    norm_scale_shift on the float32 copy up to D = 4096 (its float32 rows stop there), and norm2
    and the residuals run the model's code. mappings() picks; the first-sight check guards each.
  * A gated residual and the norm after it in one pass (norm_scale_shift's residual form, float32
    numerics: the new residual and the norm of its rounded value, both outputs): attn1's gated
    residual then norm2 (affine), and attn2's plain residual add then norm3 with the modulation.
    The model rounds the new residual with .type_as and the norm reads that rounded value
    (.float() of it), which is what the op's residual_out and statistics are: one rounding each.
  * norm_out's modulation, written inline in WanTransformer3DModel.forward (once per forward: about
    0.3 ms at 4608 tokens of Wan 14B's width on an H100, 3 % of the 2-block bench): the model's
    forward through ditops's hook (model_forward, the same steps in the same order), with norm_out
    a place of the adaLN site (the blocks' chain with the model-level table's chunks). Gradient
    checkpointing runs the model's own forward.
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.utils import apply_lora_scale
from diffusers.models.transformers.transformer_wan import (WanAttnProcessor, WanTransformerBlock,
                                                           _get_added_kv_projections, _get_qkv_projections)

import ditops

from ._patching import Plan
from ._sites import (LayoutSite, MappedSite, Mapping, OpCall, op_options, op_tensor_dtypes, patch_embedding_site,
                     patch_tokens)
from . import _common

MODEL_CLASS = "WanTransformer3DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_wan"

QK_NORM = "torch.nn.RMSNorm over heads * head_dim (across heads: F.rms_norm), then the heads split"
QK_SELF_CHAIN = (QK_NORM + ", then RoPE with interleaved pairs from float32 cos/sin (x1 * cos - x2 * sin, "
                 "x1 * sin + x2 * cos in float32, one rounding)")
QK_CROSS_CHAIN = QK_NORM + " (video queries and text keys), no RoPE"
FP32_ADALN_CHAIN = ("FP32LayerNorm(x.float()) (no affine) * (1 + scale) + shift, all float32, then "
                    ".type_as(x)")
NORM2_CHAIN = "norm2(x.float()).type_as(x): FP32LayerNorm with weight and bias in float32, one rounding"
RESIDUAL_CHAIN = "(x.float() + update * gate).type_as(x): 16-bit update times a float32 gate, float32 sum"
RESIDUAL_NORM2_CHAIN = ("h = (h.float() + attn1_output * gate).type_as(h), then norm2(h.float()).type_as(h): the "
                        "gated residual (float32 gate, one rounding) and the affine FP32LayerNorm of its rounded "
                        "value; both outputs")
ADD_NORM3_CHAIN = ("h = h + attn2_output (16-bit add), then (norm3(h.float()) * (1 + scale) + shift).type_as(h): "
                   "the residual and the float32 adaLN chain of its value; both outputs")


# ---------------------------------------------------------------- the float32 chains and their op mappings


def adaln_chain(x, norm, scale, shift):
    """norm1 / norm3 with the modulation, as WanTransformerBlock.forward writes it."""
    return (norm(x.float()) * (1 + scale) + shift).type_as(x)


def _adaln_fit(x, norm, scale, shift) -> str:
    if x.dim() != 3 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"x is {x.dtype} of rank {x.dim()}"
    B, S, D = x.shape
    if not 16 <= D <= 4096 or D % 4:
        return f"dim {D} (norm_scale_shift's float32 rows: 16 <= D <= 4096, D % 4 == 0)"
    for name, t in (("scale", scale), ("shift", shift)):
        if t.dtype != torch.float32 or t.dim() != 3 or t.shape[0] != B or t.shape[1] not in (1, S) \
                or t.shape[2] != D or t.stride(-1) != 1 or t.device != x.device:
            return f"{name} is not float32 [batch, 1 or tokens, dim] on x's device"
    if x.stride(-1) != 1:
        return "x's last stride is not 1"
    if type(norm).__name__ != "FP32LayerNorm" or norm.weight is not None or norm.bias is not None:
        return "the norm is not an affine-free FP32LayerNorm"
    if tuple(norm.normalized_shape) != (D,):
        return "the norm's shape is not x's last dim"
    return ""


# norm_scale_shift (eager numerics, LayerNorm, no affine) on the float32 copy, then the model's one
# rounding: float32 rounding is the identity in norm_scale_shift.md §2.
ADALN_ON_FLOAT32_COPY = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "eager", "x": "x.float()"},
    fit=_adaln_fit,
    signature=lambda x, norm, scale, shift: (str(x.device), x.dtype, x.shape[-1], scale.shape[1] == 1,
                                             float(norm.eps)),
    call=lambda x, norm, scale, shift: OpCall("norm_scale_shift", (x.float(), scale, shift),
                                              dict(norm="layer", eps=float(norm.eps)),
                                              lambda out: out[0].type_as(x)))


def _float32_rows_fit(x, norm, operands) -> str:
    """'' when norm_scale_shift(numerics="float32") takes x (16-bit, or float32: eager's own fp32
    chain), the affine-free or affine FP32LayerNorm `norm` over its last dim and the float32
    operands (scale/shift chunks [B, 1 or S, D] of the modulation table: any row stride)."""
    if x.dim() != 3 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"x is {x.dtype} of rank {x.dim()}"
    B, S, D = x.shape
    top = 4096 if x.dtype == torch.float32 else 8192
    if not 16 <= D <= top or D % 4:
        return f"dim {D} (norm_scale_shift's rows: 16 <= D <= {top}, D % 4 == 0)"
    if not x.is_contiguous():
        return "x is not contiguous"
    if type(norm).__name__ != "FP32LayerNorm" or tuple(norm.normalized_shape) != (D,):
        return "the norm is not an FP32LayerNorm over x's last dim"
    for name, t in operands:
        if t.dtype != torch.float32 or t.dim() != 3 or t.shape[0] != B or t.shape[1] not in (1, S) \
                or t.shape[2] != D or t.stride(-1) != 1 or t.device != x.device:
            return f"{name} is not float32 [batch, 1 or tokens, dim] on x's device"
        if any(t.stride(i) % 4 for i in (0, 1) if t.shape[i] > 1):
            return f"{name}'s rows are not 16-byte aligned"
    for name in ("weight", "bias"):
        t = getattr(norm, name)
        if t is not None and (t.dtype != torch.float32 or not t.is_contiguous() or t.device != x.device):
            return f"the norm's {name} is not a contiguous float32 vector on x's device"
    return ""


# norm_scale_shift with numerics="float32" (Wan's FP32LayerNorm chain, norm_scale_shift.md §2a) on x
# itself: float32 statistics and modulation, one rounding; no float32 copy of x.
ADALN_FLOAT32 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "float32"},
    fit=lambda x, norm, scale, shift: (_float32_rows_fit(x, norm, (("scale", scale), ("shift", shift)))
                                       or ("the norm has an affine weight" if norm.weight is not None else "")),
    signature=lambda x, norm, scale, shift: (str(x.device), x.dtype, x.shape[-1], scale.shape[1] == 1,
                                             float(norm.eps)),
    call=lambda x, norm, scale, shift: OpCall("norm_scale_shift", (x, scale, shift),
                                              dict(norm="layer", eps=float(norm.eps), numerics="float32"),
                                              lambda out: out[0]))


def _fp8_adaln_call(x, norm, scale, shift):
    outputs = _common.NSS_OUTPUTS  # a module constant: a traced forward reads no op table
    q, s = outputs["fp8_rowwise"], outputs["fp8_scale"]
    return OpCall("norm_scale_shift", (x, scale, shift),
                  dict(norm="layer", eps=float(norm.eps), numerics="float32", rowwise_fp8=True),
                  lambda out: (out[q], out[s]))


# The adaLN site into FP8 linears (issue 43, ditops.diffusers.fp8): norm_scale_shift(numerics="float32",
# rowwise_fp8=True) gives the per-token e4m3 of the chain's bf16 y and its scales in one pass, y never
# written; the same fit and signature as ADALN_FLOAT32.
ADALN_FLOAT32_FP8 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "float32", "rowwise_fp8": True},
    fit=ADALN_FLOAT32.fit, signature=ADALN_FLOAT32.signature, call=_fp8_adaln_call)


def fp8_adaln_mapping() -> Mapping:
    """ADALN_FLOAT32_FP8 where this build's norm_scale_shift has the float32 chain and the fp8_rowwise
    output, else why not (the chain runs: the same numbers)."""
    if _float32_numerics() and op_tensor_dtypes("norm_scale_shift", "fp8_rowwise"):
        return ADALN_FLOAT32_FP8
    return Mapping(why="this build's norm_scale_shift has no fp8_rowwise output with numerics=float32 (the chain "
                       "runs: the same numbers)")


def norm2_chain(x, norm):
    """The cross-attention's pre-norm (nn.Identity without cross_attn_norm)."""
    return norm(x.float()).type_as(x)


NORM2_MODEL_CODE = Mapping(why="the affine float32 LayerNorm of x.float() with one rounding back is not a chain "
                               "of an op in this build (it needs norm_scale_shift's numerics=\"float32\")")

# The affine LayerNorm alone: norm_scale_shift(numerics="float32") without scale or shift.
NORM2_FLOAT32 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "float32", "affine": "float32"},
    fit=lambda x, norm: _float32_rows_fit(x, norm, ()),
    signature=lambda x, norm: (str(x.device), x.dtype, x.shape[-1], float(norm.eps), norm.weight is not None,
                               norm.bias is not None),
    call=lambda x, norm: OpCall("norm_scale_shift", (x, None, None),
                                dict(weight=norm.weight, bias=norm.bias, norm="layer", eps=float(norm.eps),
                                     numerics="float32"),
                                lambda out: out[0]))


def residual_attn_chain(x, update, gate):
    """The self-attention's gated residual."""
    return (x.float() + update * gate).type_as(x)


def residual_ff_chain(x, update, gate):
    """The feed-forward's gated residual (update.float() * gate: the same products)."""
    return (x.float() + update.float() * gate).type_as(x)


RESIDUAL_MODEL_CODE = Mapping(why="mixed dtypes (residual_gate_add takes one dtype; float32 copies of x and the "
                                  "update would cost more than the fusion saves)")


def _residual_fit(x, update, gate) -> str:
    if x.dtype not in (torch.float16, torch.bfloat16) or update.dtype != x.dtype or x.dim() != 3:
        return f"x / update are {x.dtype} / {update.dtype} of rank {x.dim()} (16-bit [batch, tokens, dim])"
    if update.shape != x.shape or not (x.is_contiguous() and update.is_contiguous()):
        return "x and update are not contiguous tensors of one shape"
    B, S, D = x.shape
    if gate.dtype != torch.float32 or gate.dim() != 3 or gate.shape[0] != B or gate.shape[1] not in (1, S) \
            or gate.shape[2] != D or gate.stride(-1) != 1 or gate.device != x.device:
        return "gate is not float32 [batch, 1 or tokens, dim] on x's device"
    if B > 1 and gate.shape[1] > 1 and gate.stride(0) != gate.stride(1) * S:
        return "gate's rows are not one stride apart"  # the op's strided gate mode
    return ""


# residual_gate_add with a float32 gate beside 16-bit data (residual_gate_add.md, the promoted
# chain): rne(float(x) + float(update) * gate), one rounding; the gate chunk read in place.
RESIDUAL_FLOAT32_GATE = Mapping(
    op="residual_gate_add", options={"gate": "float32"},
    fit=_residual_fit,
    signature=lambda x, update, gate: (str(x.device), x.dtype, gate.shape[1] == 1, gate.is_contiguous()),
    call=lambda x, update, gate: OpCall("residual_gate_add", (x, update, gate), {}, lambda out: out))


# The mapping each site runs: the float32-chain ops where this build's op table declares them
# (norm_scale_shift's numerics="float32", residual_gate_add's float32 gate), else the mappings
# above. Each is guarded by the first-sight check like any site.
def _float32_numerics() -> bool:
    return "float32" in op_options("norm_scale_shift").get("numerics", [])


# ---------------------------------------------------------------- a gated residual and the next norm in one pass


def residual_norm2_chain(x, update, gate, norm):
    """attn1's gated residual, then norm2 of the new residual: (new residual, norm2's output)."""
    x = residual_attn_chain(x, update, gate)
    return x, norm2_chain(x, norm)


def add_norm3_chain(x, update, norm, scale, shift):
    """attn2's residual add, then norm3 with the modulation: (new residual, the modulated norm)."""
    x = x + update
    return x, adaln_chain(x, norm, scale, shift)


def _residual_rows_fit(x, update) -> str:
    """'' when norm_scale_shift's residual form takes x (the residual) and update (its x) as the
    model's residual chain: 16-bit [B, S, D] tensors of one shape and dtype, contiguous."""
    if x.dtype not in (torch.float16, torch.bfloat16) or update.dtype != x.dtype or x.dim() != 3:
        return f"x / update are {x.dtype} / {update.dtype} of rank {x.dim()} (16-bit [batch, tokens, dim])"
    if update.shape != x.shape or not update.is_contiguous() or update.device != x.device:
        return "update is not a contiguous tensor of x's shape on x's device"
    return ""


# The gated residual after attn1 and norm2 in one pass: norm_scale_shift(numerics="float32") with the
# residual form (x = attn1's output, residual = h, the float32 gate chunk in place, norm2's float32
# weight and bias): residual_out = rne(float(h) + float(update) * gate), y = rne(LayerNorm(residual_out)
# * weight + bias), norm_scale_shift.md §2a steps 1-3, 5 (no modulation).
RESIDUAL_NORM2_FLOAT32 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "float32", "affine": "float32",
                                    "residual": "gated"},
    fit=lambda x, update, gate, norm: (_residual_rows_fit(x, update)
                                       or _float32_rows_fit(x, norm, (("gate", gate),))),
    signature=lambda x, update, gate, norm: (str(x.device), x.dtype, x.shape[-1], gate.shape[1] == 1, float(norm.eps),
                                             norm.weight is not None, norm.bias is not None),
    call=lambda x, update, gate, norm: OpCall("norm_scale_shift", (update, None, None),
                                              dict(residual=x, gate=gate, weight=norm.weight, bias=norm.bias,
                                                   norm="layer", eps=float(norm.eps), numerics="float32"),
                                              _common.residual_out_and_y))

# The residual add after attn2 and norm3 with its modulation in one pass: the residual form without a
# gate (rne(float(h) + float(update)): the 16-bit add), then ADALN_FLOAT32's chain of that value.
ADD_NORM3_FLOAT32 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "numerics": "float32", "residual": "add"},
    fit=lambda x, update, norm, scale, shift: (_residual_rows_fit(x, update)
                                               or ADALN_FLOAT32.fit(x, norm, scale, shift)),
    signature=lambda x, update, norm, scale, shift: (str(x.device), x.dtype, x.shape[-1], scale.shape[1] == 1,
                                                     float(norm.eps)),
    call=lambda x, update, norm, scale, shift: OpCall("norm_scale_shift", (update, scale, shift),
                                                      dict(residual=x, norm="layer", eps=float(norm.eps),
                                                           numerics="float32"),
                                                      _common.residual_out_and_y))


def _residual_form() -> bool:
    """norm_scale_shift takes a residual with numerics="float32" (its residual and residual_out)."""
    names = {t["name"] for e in ditops.op_table() if e["name"] == "norm_scale_shift" for t in e["tensors"]}
    return _float32_numerics() and {"residual", "gate", "residual_out"} <= names


FUSED_MODEL_CODE = Mapping(why="this build's norm_scale_shift has no residual form with numerics=\"float32\" "
                               "(the residual and the norm run as separate sites)")


def mappings() -> dict:
    f32_gate = "f32" in op_tensor_dtypes("residual_gate_add", "gate").split("|")
    fused = _residual_form()
    return {"adaln": ADALN_FLOAT32 if _float32_numerics() else ADALN_ON_FLOAT32_COPY,
            "norm2": NORM2_FLOAT32 if _float32_numerics() else NORM2_MODEL_CODE,
            "residual": RESIDUAL_FLOAT32_GATE if f32_gate else RESIDUAL_MODEL_CODE,
            "residual_norm2": RESIDUAL_NORM2_FLOAT32 if fused else FUSED_MODEL_CODE,
            "add_norm3": ADD_NORM3_FLOAT32 if fused else FUSED_MODEL_CODE}


# ---------------------------------------------------------------- QK norm + RoPE


def wan_rope(x, freqs_cos, freqs_sin):
    """WanAttnProcessor's apply_rotary_emb: x [B, S, H, D], tables [1, S, 1, D] float32."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def qk(site: MappedSite, attn, query, key, rotary_emb):
    """(query, key) [B, S, N] after the norms and, with rotary_emb, RoPE per head: the model's
    order, or cross_head_qknorm_rope in place on the projections."""
    heads = attn.heads

    def chain(query, key, norm_q, norm_k, rope, head_dim, tables, unmapped):
        q, k = norm_q(query), norm_k(key)
        if rotary_emb is None:
            return q, k
        return (wan_rope(q.unflatten(2, (heads, -1)), *rotary_emb).flatten(2),
                wan_rope(k.unflatten(2, (heads, -1)), *rotary_emb).flatten(2))

    head_dim = query.shape[-1] // heads
    if rotary_emb is None:
        return site(chain, query, key, attn.norm_q, attn.norm_k, "none", head_dim, (None,) * 4, "")
    freqs_cos, freqs_sin = rotary_emb
    # k takes q's tables (self-attention: the same tokens)
    tables = (freqs_cos[..., 0::2], freqs_sin[..., 1::2], None, None)
    return site(chain, query, key, attn.norm_q, attn.norm_k, "interleaved", head_dim, tables, "")


class WanAttnProcessorDitops(_common.ProcessorWrapper):
    """WanAttnProcessor with the QK norm (and RoPE) through the cross-head qk site; everything
    else is the processor's own sequence."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            # 512 is the context length of the text encoder, hardcoded by the model
            image_context_length = encoder_hidden_states.shape[1] - 512
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query, key = qk(self.site, attn, query, key, rotary_emb)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))

        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = _get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img)
            key_img = key_img.unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = dispatch_attention_fn(query, key_img, value_img, attn_mask=None, dropout_p=0.0,
                                                      is_causal=False, backend=self._attention_backend,
                                                      parallel_config=None)
            hidden_states_img = hidden_states_img.flatten(2, 3)
            hidden_states_img = hidden_states_img.type_as(query)

        hidden_states = dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend,
            parallel_config=(self._parallel_config if encoder_hidden_states is None else None))
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


# ---------------------------------------------------------------- the block


def block_forward(adaln: MappedSite, norm2: MappedSite, residual: MappedSite, residual_norm2: MappedSite | None = None,
                  add_norm3: MappedSite | None = None):
    """WanTransformerBlock.forward with the float32 chains through their sites (the attentions'
    QK sites are in their processors). residual_norm2 / add_norm3: the residual and the norm after
    it in one call where that site runs (active), else the two sites above."""

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        if temb.ndim == 4:  # Wan 2.2 TI2V: [batch, tokens, 6, dim]
            chunks = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
            chunks = [c.squeeze(2) for c in chunks]
        else:
            chunks = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = chunks

        norm_hidden = adaln(adaln_chain, hidden_states, self.norm1, scale_msa, shift_msa)
        attn_output = self.attn1(norm_hidden, None, None, rotary_emb)
        affine_norm2 = type(self.norm2).__name__ == "FP32LayerNorm"
        if affine_norm2 and residual_norm2 is not None and residual_norm2.active:
            hidden_states, norm_hidden = residual_norm2(residual_norm2_chain, hidden_states, attn_output, gate_msa,
                                                        self.norm2)
        else:
            hidden_states = residual(residual_attn_chain, hidden_states, attn_output, gate_msa)
            if affine_norm2:
                norm_hidden = norm2(norm2_chain, hidden_states, self.norm2)
            else:  # nn.Identity (cross_attn_norm=False): not a place
                norm_hidden = norm2_chain(hidden_states, self.norm2)
        attn_output = self.attn2(norm_hidden, encoder_hidden_states, None, None)

        if add_norm3 is not None and add_norm3.active:
            hidden_states, norm_hidden = add_norm3(add_norm3_chain, hidden_states, attn_output, self.norm3,
                                                   c_scale_msa, c_shift_msa)
        else:
            hidden_states = hidden_states + attn_output
            norm_hidden = adaln(adaln_chain, hidden_states, self.norm3, c_scale_msa, c_shift_msa)
        ff_output = self.ffn(norm_hidden)
        return residual(residual_ff_chain, hidden_states, ff_output, c_gate_msa)

    return forward


# ---------------------------------------------------------------- the model


def model_forward(adaln: MappedSite, patch: LayoutSite):
    """WanTransformer3DModel.forward (diffusers 0.42.1) with the patch embedding's token rows
    through the layout site and norm_out's modulation through the adaLN site: the condition
    embedder and the blocks as the model calls them, then norm_out and proj_out and the
    unpatchify."""

    @apply_lora_scale("attention_kwargs")
    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image=None,
                return_dict=True, attention_kwargs=None):
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            return type(self).forward.__wrapped__(self, hidden_states, timestep, encoder_hidden_states,
                                                  encoder_hidden_states_image, return_dict, attention_kwargs)
        batch, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config.patch_size
        grid = (frames // p_t, height // p_h, width // p_w)
        rotary_emb = self.rope(hidden_states)
        hidden_states = patch_tokens(patch, self.patch_embedding, hidden_states).contiguous()
        per_token = timestep.ndim == 2  # Wan 2.2 TI2V: a timestep per token
        temb, timestep_proj, encoder_hidden_states, encoder_hidden_states_image = self.condition_embedder(
            timestep.flatten() if per_token else timestep, encoder_hidden_states, encoder_hidden_states_image,
            timestep_seq_len=timestep.shape[1] if per_token else None)
        timestep_proj = timestep_proj.unflatten(2 if per_token else 1, (6, -1))
        if encoder_hidden_states_image is not None:
            encoder_hidden_states = torch.concat([encoder_hidden_states_image, encoder_hidden_states], dim=1)
        for block in self.blocks:
            hidden_states = block(hidden_states, encoder_hidden_states, timestep_proj, rotary_emb)

        if temb.ndim == 3:
            shift, scale = (self.scale_shift_table.unsqueeze(0).to(temb.device) + temb.unsqueeze(2)).chunk(2, dim=2)
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:
            shift, scale = (self.scale_shift_table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1)
        shift, scale = shift.to(hidden_states.device), scale.to(hidden_states.device)
        hidden_states = self.proj_out(adaln(adaln_chain, hidden_states, self.norm_out, scale, shift))
        hidden_states = hidden_states.reshape(batch, *grid, p_t, p_h, p_w, -1)
        output = hidden_states.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return Transformer2DModelOutput(sample=output) if return_dict else (output,)

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    qk_self = plan.add_site(_common.cross_head_qk_site("qk_norm_rope (self-attn)", "interleaved",
                                                       QK_SELF_CHAIN))
    qk_cross = plan.add_site(_common.cross_head_qk_site("qk_norm_rope (text cross-attn)", "none",
                                                        QK_CROSS_CHAIN))
    mapped = mappings()
    adaln = plan.add_site(MappedSite("adaln_modulate", mapping=mapped["adaln"], chain=FP32_ADALN_CHAIN))
    norm2 = plan.add_site(MappedSite("adaln_modulate (norm2)", mapping=mapped["norm2"], chain=NORM2_CHAIN))
    residual = plan.add_site(MappedSite("gated_residual", mapping=mapped["residual"], chain=RESIDUAL_CHAIN))
    residual_norm2 = plan.add_site(MappedSite(
        "adaln_modulate (residual + norm2)", mapping=mapped["residual_norm2"], chain=RESIDUAL_NORM2_CHAIN,
        classes=("adaln_modulate", "gated_residual"), outputs=2))
    add_norm3 = plan.add_site(MappedSite("adaln_modulate (residual + norm3)", mapping=mapped["add_norm3"],
                                         chain=ADD_NORM3_CHAIN, outputs=2))
    processors = {WanAttnProcessor: WanAttnProcessorDitops}
    for i, block in enumerate(model.blocks):
        path = f"blocks.{i}"
        if type(block) is not WanTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not WanTransformerBlock")
            continue
        at = plan.prefix + path
        a1, a2 = block.attn1, block.attn2
        _common.patch_cross_head_processor(plan, qk_self, f"{path}.attn1", a1, processors, "video",
                                           (a1.inner_dim, a1.kv_inner_dim))
        _common.patch_cross_head_processor(plan, qk_cross, f"{path}.attn2", a2, processors,
                                           "video q, text k", (a2.inner_dim, a2.kv_inner_dim))
        adaln.places.append(f"{at}.norm1")
        add_norm3.fuse(f"{at}.norm3 (+ attn2 residual)", [(adaln, f"{at}.norm3")])
        if type(block.norm2).__name__ == "FP32LayerNorm":
            residual_norm2.fuse(f"{at}.norm2 (+ attn1 residual)",
                                [(residual, f"{at} (attn1)"), (norm2, f"{at}.norm2")])
        else:
            residual.places.append(f"{at} (attn1)")
        residual.places.append(f"{at} (ffn)")
        plan.patch_forward(path, block, block_forward(adaln, norm2, residual, residual_norm2, add_norm3))
    patch = plan.add_site(patch_embedding_site())
    if type(model.norm_out).__name__ == "FP32LayerNorm":
        adaln.places.append(plan.prefix + "norm_out")
        patch.places.append(plan.prefix + "patch_embedding")
        plan.patch_forward("", model, model_forward(adaln, patch))
    else:
        patch.skipped.append((plan.prefix + "patch_embedding", f"norm_out is {type(model.norm_out).__name__}, "
                              "not FP32LayerNorm: the model's forward is not patched"))
