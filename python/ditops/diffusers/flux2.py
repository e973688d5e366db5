"""FLUX.2 (diffusers Flux2Transformer2DModel: FLUX.2-dev, FLUX.2-klein), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * dual-stream QK (Flux2AttnProcessor, the double blocks): torch.nn.RMSNorm per head of each
    stream (F.rms_norm: one rounding), torch.cat([text, image]) of q, k and v, then diffusers'
    apply_rotary_emb of the joint rows: interleaved pairs (use_real_unbind_dim=-1), float32
    full-width cos/sin from Flux2PosEmbed (float64 frequencies, cos/sin cast to float32, each pair's
    value twice), (x.float() * cos + x_rot.float() * sin).to(dtype): one joint_qknorm_rope call
    (qknorm_rope's rounded mode, aten order, once, real product, full-width float32 cache).
  * single-stream QK (Flux2ParallelSelfAttnProcessor): the same norm and RoPE on q and k, chunks of
    the fused to_qkv_mlp_proj output (token-strided rows, read and written in place): qknorm_rope.
  * adaLN: the blocks' inline (1 + scale) * LayerNorm(x) + shift (norm1, norm1_context, the
    single block's norm) and LayerNorm(x) * (1 + scale) + shift (norm2, norm2_context), scale and
    shift [B, 1, D] chunks of the model-level modulation (Flux2Modulation.split); norm_out
    (AdaLayerNormContinuous): layernorm_modulate.
  * gated residuals: residual + gate * update, four per double block, one per single block:
    residual_gate_add. A double block's attention residual and its norm2 modulation of the new
    residual, each stream: one norm_scale_shift call (its residual form, eager numerics), the
    "adaln_modulate (residual + norm2)" site as FLUX.1's; the two sites above where it does not run.
  * SwiGLU (Flux2SwiGLU: F.silu(x[..., :N]) * x[..., N:], nn.SiLU then the product): the
    feed-forward's act between linear_in and linear_out, and the single block's mlp_act_fn, whose
    output the processor concatenates after the attention output (torch.cat([attn, act(mlp)], -1))
    for to_out: swiglu, there written straight into the columns [D, D + N) of the concatenation's
    buffer (the attention output copied into [0, D)), so neither the silu / mul intermediates nor
    the cat's second pass over the mlp columns remain.
  * RoPE tables: Flux2PosEmbed (model.pos_embed, called for the image ids and the text ids) builds
    the float32 cos/sin tables over its axes_dim with diffusers' get_1d_rotary_pos_embed per axis
    (float64 frequencies, about 13 small kernels per axis): one rope_tables call each
    (flux.rope_tables_mapping).
The KV-cache processors (Flux2KVAttnProcessor, Flux2KVParallelSelfAttnProcessor: Klein KV's
pipeline installs them) run the model's code; their blocks' adaLN and residual sites still serve
(a per-token modulation of the KV extract step falls back per call). Under FP8 (_fp8_models.flux2)
the SwiGLU + quantize producer writes linear_out's and to_out's e4m3 input instead of the SwiGLU
sites.
"""
from __future__ import annotations

import functools

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux2 import (Flux2AttnProcessor, Flux2FeedForward, Flux2Modulation,
                                                             Flux2ParallelSelfAttnProcessor, Flux2PosEmbed,
                                                             Flux2SingleTransformerBlock, Flux2SwiGLU,
                                                             Flux2TransformerBlock, _get_qkv_projections)

from ._joint_qk import joint_qk_site
from ._patching import Plan
from ._sites import MappedSite, Mapping, OpCall
from . import _common
from .flux import joint_qk, patch_pos_embed

MODEL_CLASS = "Flux2Transformer2DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_flux2"

QK_CHAIN = ("torch.nn.RMSNorm per head (the module decides: torch.nn.RMSNorm is F.rms_norm), then "
            "apply_rotary_emb: interleaved pairs, float32 cos/sin, (x.float() * cos + x_rot.float() * sin).to(dtype)")


class Flux2AttnProcessorDitops(_common.ProcessorWrapper):
    """Flux2AttnProcessor with the norms, the concatenation and RoPE through the dual-stream site.
    Everything else is the processor's own sequence; attention backend and parallel config are the
    replaced processor's."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states)
        query = query.unflatten(-1, (-1, attn.head_dim))
        key = key.unflatten(-1, (-1, attn.head_dim))
        value = value.unflatten(-1, (-1, attn.head_dim))
        joint = attn.added_kv_proj_dim is not None
        if joint:
            encoder_query = encoder_query.unflatten(-1, (-1, attn.head_dim))
            encoder_key = encoder_key.unflatten(-1, (-1, attn.head_dim))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
        rows = image_rotary_emb[0].shape[0] if image_rotary_emb is not None else -1
        if joint and rows == encoder_query.shape[1] + query.shape[1]:
            query, key, value = joint_qk(self.site, (encoder_query, encoder_key, encoder_value, query, key, value),
                                         (attn.norm_added_q, attn.norm_added_k, attn.norm_q, attn.norm_k),
                                         image_rotary_emb)
        else:  # the model's code
            query, key = attn.norm_q(query), attn.norm_k(key)
            if joint:
                query = torch.cat([attn.norm_added_q(encoder_query), query], dim=1)
                key = torch.cat([attn.norm_added_k(encoder_key), key], dim=1)
                value = torch.cat([encoder_value, value], dim=1)
            if image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                              backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states


class Flux2ParallelSelfAttnProcessorDitops(_common.ProcessorWrapper):
    """Flux2ParallelSelfAttnProcessor with the QK norm + RoPE through the qk site: q and k are
    chunks of to_qkv_mlp_proj's output (rows of 3 * inner + 2 * mlp elements), normalized and
    rotated in place. cat_quant (the FP8 path, to_out an Fp8Linear): to_out takes
    cat_quant(attention output, MLP columns), cat([attn, swiglu(mlp)]) as one Rowwise pair."""

    def __init__(self, original, site, cat_quant=None, cat_act=None):
        super().__init__(original, site)
        self.cat_quant = cat_quant
        self.cat_act = cat_act  # the bf16 path: the SwiGLU site writing into the cat's buffer

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp_hidden_states = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        query, key, value = qkv.chunk(3, dim=-1)
        query = query.unflatten(-1, (-1, attn.head_dim))
        key = key.unflatten(-1, (-1, attn.head_dim))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if image_rotary_emb is not None and image_rotary_emb[0].shape[0] == query.shape[1]:
            query, key = _common.qk(self.site, query, key, attn.norm_q, attn.norm_k, image_rotary_emb, 0)
        else:  # the model's code
            query, key = attn.norm_q(query), attn.norm_k(key)
            if image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                              backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if self.cat_quant is not None:
            return attn.to_out(self.cat_quant(hidden_states, mlp_hidden_states))
        if self.cat_act is not None:
            return attn.to_out(self.cat_act(lambda a, m: torch.cat([a, attn.mlp_act_fn(m)], dim=-1),
                                            hidden_states, mlp_hidden_states))
        mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
        hidden_states = torch.cat([hidden_states, mlp_hidden_states], dim=-1)
        return attn.to_out(hidden_states)


# ---------------------------------------------------------------- SwiGLU

SWIGLU_CHAIN = "Flux2SwiGLU: nn.SiLU of x[..., :N] (rounded to the dtype) times x[..., N:] (rounded)"


def _swiglu_call(x) -> OpCall:
    out = x.new_empty(*x.shape[:-1], x.shape[-1] // 2)
    return OpCall("swiglu", (x, out), {}, lambda _: out)


# The feed-forward's act: linear_in's output [B, S, 2N] -> [B, S, N] for linear_out.
SWIGLU_FF = Mapping(op="swiglu", fit=functools.partial(_common.act_fit, "swiglu"),
                    signature=lambda x: (str(x.device), x.dtype, x.shape[-1], x.stride(-1), x.is_contiguous()),
                    call=_swiglu_call)
# The single block's act into the cat: x the mlp columns of to_qkv_mlp_proj's output (a row stride
# of 3 inner + 2 mlp), out the cat buffer's mlp columns.
SWIGLU_CAT = _common.cat_act_mapping("swiglu")


def swiglu_ff_forward(site: MappedSite):
    """Flux2FeedForward.forward with its act through the site (linear_in and linear_out the model's)."""

    def forward(self, x):
        return self.linear_out(site(self.act_fn, self.linear_in(x)))

    return forward


def modulate(site: MappedSite, x, scale, shift, norm, scale_first: bool):
    """The blocks' inline modulation, written as the model writes it: (1 + scale) * norm(x) + shift
    (scale_first) or norm(x) * (1 + scale) + shift. scale, shift: [B, 1, D] chunks of the model-level
    modulation; the site takes their [B, D] rows (a per-token [B, S, D] modulation does not fit it)."""

    def chain(x, scale_rows, shift_rows, norm):  # the model's own [B, 1, D] scale and shift
        return (1 + scale) * norm(x) + shift if scale_first else norm(x) * (1 + scale) + shift

    return site(chain, x, _rows(scale), _rows(shift), norm)


def _rows(t):
    """A [B, 1, D] chunk of the model-level modulation as its [B, D] rows (other shapes as they are)."""
    return t[:, 0] if t.dim() == 3 and t.shape[1] == 1 else t


def residual_norm2(residual_norm, residual, adaln, x, update, gate, scale, shift, norm):
    """A double block stream's x + gate * update, then norm(x) * (1 + scale) + shift of the new x: one
    call of the fused site where it runs and the modulation is the model-level one ([B, 1, D] chunks,
    whose [B, D] rows are _common's chain); otherwise (the site off, or the KV extract step's per-token
    [B, S, D] modulation of the image stream) the gated residual's site and adaLN's, each per call."""
    if residual_norm is not None and residual_norm.active and scale.dim() == 3 and scale.shape[1] == 1:
        return _common.residual_modulate(residual_norm, x, update, gate, _rows(scale), _rows(shift), norm)
    x = _common.gated(residual, x, update, gate)
    return x, modulate(adaln, x, scale, shift, norm, False)


def double_block_forward(adaln: MappedSite, residual: MappedSite, ff_adaln=None, residual_norm=None):
    """Flux2TransformerBlock.forward with its four modulations and four gated residuals through the
    sites: adaln feeds the attention (norm1, norm1_context), ff_adaln (default: adaln) the
    feed-forwards (norm2, norm2_context); the FP8 path passes its per-token e4m3 site for either.
    residual_norm: each stream's attention residual and its norm2 in one call where that site runs
    (residual_norm2)."""
    ff_adaln = ff_adaln or adaln

    def forward(self, hidden_states, encoder_hidden_states, temb_mod_img, temb_mod_txt, image_rotary_emb=None,
                joint_attention_kwargs=None):
        joint_attention_kwargs = joint_attention_kwargs or {}
        (shift_msa, scale_msa, gate_msa), (shift_mlp, scale_mlp, gate_mlp) = Flux2Modulation.split(temb_mod_img, 2)
        (c_shift_msa, c_scale_msa, c_gate_msa), (c_shift_mlp, c_scale_mlp, c_gate_mlp) = Flux2Modulation.split(
            temb_mod_txt, 2)
        norm_hidden_states = modulate(adaln, hidden_states, scale_msa, shift_msa, self.norm1, True)
        norm_encoder_hidden_states = modulate(adaln, encoder_hidden_states, c_scale_msa, c_shift_msa,
                                              self.norm1_context, True)
        attn_output, context_attn_output = self.attn(hidden_states=norm_hidden_states,
                                                     encoder_hidden_states=norm_encoder_hidden_states,
                                                     image_rotary_emb=image_rotary_emb, **joint_attention_kwargs)

        hidden_states, norm_hidden_states = residual_norm2(residual_norm, residual, ff_adaln, hidden_states,
                                                           attn_output, gate_msa, scale_mlp, shift_mlp, self.norm2)
        hidden_states = _common.gated(residual, hidden_states, self.ff(norm_hidden_states), gate_mlp)

        encoder_hidden_states, norm_encoder_hidden_states = residual_norm2(
            residual_norm, residual, ff_adaln, encoder_hidden_states, context_attn_output, c_gate_msa, c_scale_mlp,
            c_shift_mlp, self.norm2_context)
        encoder_hidden_states = _common.gated(residual, encoder_hidden_states,
                                              self.ff_context(norm_encoder_hidden_states), c_gate_mlp)
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


def single_block_forward(adaln: MappedSite, residual: MappedSite):
    """Flux2SingleTransformerBlock.forward with its modulation and gated residual through the sites."""

    def forward(self, hidden_states, encoder_hidden_states, temb_mod, image_rotary_emb=None,
                joint_attention_kwargs=None, split_hidden_states=False, text_seq_len=None):
        if encoder_hidden_states is not None:
            text_seq_len = encoder_hidden_states.shape[1]
            hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        mod_shift, mod_scale, mod_gate = Flux2Modulation.split(temb_mod, 1)[0]
        norm_hidden_states = modulate(adaln, hidden_states, mod_scale, mod_shift, self.norm, True)
        attn_output = self.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb,
                                **(joint_attention_kwargs or {}))
        hidden_states = _common.gated(residual, hidden_states, attn_output, mod_gate)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        if split_hidden_states:
            return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]
        return hidden_states

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    doubles = [(f"transformer_blocks.{i}", b) for i, b in enumerate(model.transformer_blocks)]
    singles = [(f"single_transformer_blocks.{i}", b) for i, b in enumerate(model.single_transformer_blocks)]
    dual = plan.add_site(joint_qk_site(
        "qk_norm_rope (dual-stream)", [(f"{p}.attn", b.attn) for p, b in doubles],
        chain="per-head RMSNorm of each stream (torch.nn.RMSNorm: F.rms_norm), torch.cat([text, image], dim=1) "
              "of q, k and v, then apply_rotary_emb of the joint rows: interleaved pairs, float32 cos/sin, "
              "(x.float() * cos + x_rot.float() * sin).to(dtype)"))
    qk = plan.add_site(_common.qk_site(
        "qk_norm_rope", [(f"{p}.attn", b.attn, [("norm_q", "norm_k")]) for p, b in singles],
        chain=QK_CHAIN + "; q and k: chunks of to_qkv_mlp_proj's output, read and written in place"))
    adaln = plan.add_site(_common.adaln_site())
    residual = plan.add_site(_common.gated_residual_site())
    residual_norm = plan.add_site(_common.residual_adaln_site())
    swiglu = plan.add_site(MappedSite("swiglu (ff)", mapping=SWIGLU_FF,
                                      chain="Flux2FeedForward: linear_in, act_fn (" + SWIGLU_CHAIN + "), linear_out"))
    cat = plan.add_site(MappedSite(
        "swiglu (single block cat)", mapping=SWIGLU_CAT,
        chain="Flux2ParallelSelfAttnProcessor: torch.cat([attention output, mlp_act_fn(mlp)], -1) before to_out, "
              "mlp the column slice of to_qkv_mlp_proj's output, mlp_act_fn " + SWIGLU_CHAIN))

    for path, block in doubles:
        if type(block) is not Flux2TransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not Flux2TransformerBlock")
            continue
        _common.patch_processor(plan, dual, f"{path}.attn", block.attn, Flux2AttnProcessor,
                                Flux2AttnProcessorDitops, ("text + image",))
        at = plan.prefix + path
        adaln.places += [f"{at}.{n}" for n in ("norm1", "norm1_context")]
        for norm2, attn in (("norm2", "attn"), ("norm2_context", "context attn")):
            residual_norm.fuse(f"{at}.{norm2} (+ {attn} residual)", [(residual, f"{at} ({attn})"),
                                                                      (adaln, f"{at}.{norm2}")])
        residual.places += [f"{at} ({n})" for n in ("ff", "context ff")]
        plan.patch_forward(path, block, double_block_forward(adaln, residual, residual_norm=residual_norm))
        for name in ("ff", "ff_context"):
            ff = getattr(block, name)
            if type(ff) is not Flux2FeedForward or type(ff.act_fn) is not Flux2SwiGLU:
                swiglu.skipped.append((plan.prefix + f"{path}.{name}", f"{type(ff).__name__} with "
                                       f"{type(getattr(ff, 'act_fn', None)).__name__}, not Flux2FeedForward with Flux2SwiGLU"))
                continue
            swiglu.places.append(plan.prefix + f"{path}.{name}.act_fn")
            if swiglu.op is not None:
                plan.patch_forward(f"{path}.{name}", ff, swiglu_ff_forward(swiglu))
    for path, block in singles:
        if type(block) is not Flux2SingleTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not Flux2SingleTransformerBlock")
            continue
        # the cat site rides on ditops's processor (installed where the qk site's op is mapped and the
        # attention runs the model's processor)
        swiglu_act = type(block.attn.mlp_act_fn) is Flux2SwiGLU
        processor = functools.partial(Flux2ParallelSelfAttnProcessorDitops, cat_act=cat if swiglu_act else None)
        _common.patch_processor(plan, qk, f"{path}.attn", block.attn, Flux2ParallelSelfAttnProcessor,
                                processor, ("joint",))
        if not swiglu_act:
            cat.skipped.append((plan.prefix + f"{path}.attn", f"mlp_act_fn is {type(block.attn.mlp_act_fn).__name__}, "
                                                              "not Flux2SwiGLU"))
        elif qk.op is None or type(block.attn.processor) is not Flux2ParallelSelfAttnProcessor:
            cat.skipped.append((plan.prefix + f"{path}.attn", "ditops's processor is not installed there "
                                                              "(the qk_norm_rope site's)"))
        else:
            cat.places.append(plan.prefix + f"{path}.attn (cat attn + swiglu mlp)")
        adaln.places.append(plan.prefix + f"{path}.norm")
        residual.places.append(plan.prefix + f"{path} (attn + mlp)")
        plan.patch_forward(path, block, single_block_forward(adaln, residual))
    _common.patch_adaln_module(plan, adaln, "norm_out", model.norm_out)
    patch_pos_embed(plan, model, Flux2PosEmbed, ["img_ids", "txt_ids"], axes_from_ids=False)
