"""HunyuanVideo (diffusers HunyuanVideoTransformer3DModel), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE of the latent stream in the double blocks: diffusers' RMSNorm per head (two
    roundings), then apply_rotary_emb with interleaved pairs and float32 cos/sin (FLUX's RoPE):
    qknorm_rope with norm_weight_rounding=twice, where the op has that option. The single blocks
    normalize the latent and text tokens in one call and rotate only the latent ones: one
    qknorm_rope call over all the rows, the text rows on an identity row appended to the cache
    (cos 1, sin 0), the first sight comparing it with the model's norm of all rows (whose
    torch.mean reduction covers the same rows). The double blocks' text QK norm (no RoPE): the
    same, every row on the identity row.
  * adaLN: AdaLayerNormZero (norm1, norm1_context), the inline norm2 / norm2_context
    modulation, AdaLayerNormZeroSingle, norm_out: layernorm_modulate.
  * gated residuals: four per double block, one per single block: residual_gate_add. A double
    block's attention residual and its norm2 modulation of the new residual, each stream: one
    norm_scale_shift call (its residual form, eager numerics; "adaln_modulate (residual + norm2)"),
    the two sites above where it does not run.
  * The double blocks' QK of both streams in one joint_qknorm_rope call where the op fits the
    norms (the dual-stream site): each stream's norm, the latent rows' RoPE (the text rows on the
    cache's identity row) and the joint [latent; text] q, k, v written at once, without the three
    torch.cat calls; else the two sites above.
  * The single blocks' torch.cat([attn, act_mlp(mlp)], dim=2): gelu_tanh into the cat buffer
    (flux.gelu_cat). Their three token cats of two adjacent halves of one buffer (the streams from
    the previous single block, the norm output's halves in the attention, the attention output's
    halves after it) are that buffer (_common.joint_rows: no copy).
The token-replace (I2V) block classes and the text token refiner are left to the model's code.
"""
from __future__ import annotations

import functools

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_hunyuan_video import (
    HunyuanVideoAttnProcessor2_0, HunyuanVideoPatchEmbed, HunyuanVideoSingleTransformerBlock,
    HunyuanVideoTransformerBlock)

from diffusers.models.embeddings import apply_rotary_emb

from ._joint_qk import joint_qk_site
from ._patching import Plan
from ._sites import LayoutSite, MappedSite, patch_embedding_site, patch_tokens
from . import _common, flux

MODEL_CLASS = "HunyuanVideoTransformer3DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_hunyuan_video"


def _attend(processor, attn, query, key, value, attention_mask, text_len):
    """Steps 5 and 6 of HunyuanVideoAttnProcessor2_0: attention over the joint [latent; text] rows,
    split back into the streams, their output projections."""
    hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                          is_causal=False, backend=processor._attention_backend,
                                          parallel_config=processor._parallel_config)
    hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
    hidden_states, encoder_hidden_states = hidden_states[:, :-text_len], hidden_states[:, -text_len:]
    if getattr(attn, "to_out", None) is not None:
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    if getattr(attn, "to_add_out", None) is not None:
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


class HunyuanVideoAttnProcessorDitops(_common.ProcessorWrapper):
    """HunyuanVideoAttnProcessor2_0 of a double block (separate text projections) with the latent
    stream's QK norm + RoPE through the qk site and the text stream's QK norm through the text
    site (qknorm_rope with every row on the identity rotation)."""

    def __init__(self, original, site, text_site=None):
        super().__init__(original, site)
        self.text_site = text_site

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if (attn.add_q_proj is None or encoder_hidden_states is None or attn.norm_q is None
                or attn.norm_k is None or image_rotary_emb is None
                or image_rotary_emb[0].shape[0] != hidden_states.shape[1]):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        query, key = _common.qk(self.site, query, key, attn.norm_q, attn.norm_k, image_rotary_emb, 0)

        encoder_query = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        encoder_key = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        encoder_value = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        if self.text_site is not None and attn.norm_added_q is not None and attn.norm_added_k is not None:
            encoder_query, encoder_key = _common.qk_with_unrotated_tail(
                self.text_site, encoder_query, encoder_key, attn.norm_added_q, attn.norm_added_k, None,
                encoder_query.shape[1])
        else:
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
        query = torch.cat([query, encoder_query], dim=1)
        key = torch.cat([key, encoder_key], dim=1)
        value = torch.cat([value, encoder_value], dim=1)

        return _attend(self, attn, query, key, value, attention_mask, encoder_hidden_states.shape[1])


class HunyuanVideoDualAttnProcessorDitops(_common.ProcessorWrapper):
    """HunyuanVideoAttnProcessor2_0 of a double block with the QK norms of both streams, the RoPE of
    the latent rows and the joint [latent; text] q, k, v in one joint_qknorm_rope call (the text
    rows on the cache's identity row): the model's three torch.cat calls disappear."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if (attn.add_q_proj is None or encoder_hidden_states is None or image_rotary_emb is None
                or any(getattr(attn, n) is None for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"))
                or image_rotary_emb[0].shape[0] != hidden_states.shape[1]):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        streams = tuple(proj(x).unflatten(2, (attn.heads, -1)) for proj, x in (
            (attn.to_q, hidden_states), (attn.to_k, hidden_states), (attn.to_v, hidden_states),
            (attn.add_q_proj, encoder_hidden_states), (attn.add_k_proj, encoder_hidden_states),
            (attn.add_v_proj, encoder_hidden_states)))
        norms = (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)

        def chain(q, k, v, eq, ek, ev, norms, freqs, rotate_stream2):  # steps 2 to 4 of the model's processor
            q = apply_rotary_emb(norms[0](q), freqs, sequence_dim=1)
            k = apply_rotary_emb(norms[1](k), freqs, sequence_dim=1)
            return (torch.cat([q, norms[2](eq)], dim=1), torch.cat([k, norms[3](ek)], dim=1),
                    torch.cat([v, ev], dim=1))

        query, key, value = self.site(chain, *streams, norms, image_rotary_emb, False)
        return _attend(self, attn, query, key, value, attention_mask, encoder_hidden_states.shape[1])


class HunyuanVideoSingleAttnProcessorDitops(_common.ProcessorWrapper):
    """HunyuanVideoAttnProcessor2_0 of a single block (one projection over latent and text tokens)
    with the QK norm of all tokens and the RoPE of the latent ones in one qknorm_rope call (the text
    tokens on the cache's identity row)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if (attn.add_q_proj is not None or encoder_hidden_states is None or attn.norm_q is None
                or attn.norm_k is None or image_rotary_emb is None
                or image_rotary_emb[0].shape[0] != hidden_states.shape[1] or encoder_hidden_states.shape[1] == 0):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        text_len = encoder_hidden_states.shape[1]
        hidden_states = _common.joint_rows(hidden_states, encoder_hidden_states)  # the block's norm output again
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        query, key = _common.qk_with_unrotated_tail(self.site, query, key, attn.norm_q, attn.norm_k, image_rotary_emb,
                                              text_len)
        return _attend(self, attn, query, key, value, attention_mask, text_len)


def patch_embed_forward(site: LayoutSite):
    """HunyuanVideoPatchEmbed.forward with its token rows through the layout site."""

    def forward(self, hidden_states):
        return patch_tokens(site, self.proj, hidden_states)

    return forward


def double_block_forward(adaln: MappedSite, residual: MappedSite, residual_norm: MappedSite | None = None):
    """HunyuanVideoTransformerBlock.forward with the norm2 modulations and the four gated
    residuals through the sites; residual_norm: each stream's attention residual and its norm2 in
    one call where that site runs (active)."""

    def forward(self, hidden_states, encoder_hidden_states, temb, attention_mask=None, freqs_cis=None,
                *args, **kwargs):
        # The model's patch embedding leaves the latent stream [B, T, D] stored as [B, D, T] (the
        # layout site's channels-last one does not), and the model's elementwise ops keep that layout,
        # so each norm (aten's and the site alike) would copy it to rows. One copy in the first block
        # serves every later norm and residual (their values do not depend on the layout); the single
        # blocks' cat makes the stream contiguous in the model too.
        hidden_states = hidden_states.contiguous()
        norm_hidden, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_context, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb)
        attn_output, context_attn_output = self.attn(
            hidden_states=norm_hidden, encoder_hidden_states=norm_context, attention_mask=attention_mask,
            image_rotary_emb=freqs_cis)
        if residual_norm is not None and residual_norm.active:
            hidden_states, norm_hidden = _common.residual_modulate(
                residual_norm, hidden_states, attn_output, gate_msa.unsqueeze(1), scale_mlp, shift_mlp, self.norm2)
            encoder_hidden_states, norm_context = _common.residual_modulate(
                residual_norm, encoder_hidden_states, context_attn_output, c_gate_msa.unsqueeze(1), c_scale_mlp,
                c_shift_mlp, self.norm2_context)
        else:
            hidden_states = _common.gated(residual, hidden_states, attn_output, gate_msa.unsqueeze(1))
            encoder_hidden_states = _common.gated(residual, encoder_hidden_states, context_attn_output,
                                                  c_gate_msa.unsqueeze(1))
            norm_hidden = _common.modulate(adaln, hidden_states, scale_mlp, shift_mlp, self.norm2)
            norm_context = _common.modulate(adaln, encoder_hidden_states, c_scale_mlp, c_shift_mlp,
                                            self.norm2_context)
        ff_output = self.ff(norm_hidden)
        context_ff_output = self.ff_context(norm_context)
        hidden_states = _common.gated(residual, hidden_states, ff_output, gate_mlp.unsqueeze(1))
        encoder_hidden_states = _common.gated(residual, encoder_hidden_states, context_ff_output,
                                              c_gate_mlp.unsqueeze(1))
        return hidden_states, encoder_hidden_states

    return forward


def single_block_forward(residual: MappedSite, cat):
    """HunyuanVideoSingleTransformerBlock.forward with its gated residual through the site and
    proj_out's input from cat(block, attention output, proj_mlp output) (flux.gelu_cat, or the FP8
    path's producer). The activation runs after the attention: elementwise, the same values. The
    streams' cat is _common.joint_rows (no copy of a previous single block's split output)."""

    def forward(self, hidden_states, encoder_hidden_states, temb, attention_mask=None, image_rotary_emb=None,
                *args, **kwargs):
        text_len = encoder_hidden_states.shape[1]
        hidden_states = _common.joint_rows(hidden_states, encoder_hidden_states)
        skip = hidden_states
        norm_hidden, gate = self.norm(hidden_states, emb=temb)
        mlp_up = self.proj_mlp(norm_hidden)
        attn_output, context_attn_output = self.attn(
            hidden_states=norm_hidden[:, :-text_len, :], encoder_hidden_states=norm_hidden[:, -text_len:, :],
            attention_mask=attention_mask, image_rotary_emb=image_rotary_emb)
        attn_output = _common.joint_rows(attn_output, context_attn_output)  # the attention's output again
        update = self.proj_out(cat(self, attn_output, mlp_up))
        hidden_states = _common.gated(residual, skip, update, gate.unsqueeze(1))
        return hidden_states[:, :-text_len, :], hidden_states[:, -text_len:, :]

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    doubles = [(f"transformer_blocks.{i}", b) for i, b in enumerate(model.transformer_blocks)]
    singles = [(f"single_transformer_blocks.{i}", b) for i, b in enumerate(model.single_transformer_blocks)]
    rope_chain = ("apply_rotary_emb: interleaved pairs, float32 cos/sin, "
                  "(x.float() * cos + x_rot.float() * sin).to(dtype)")
    qk = plan.add_site(_common.qk_site(
        "qk_norm_rope", [(f"{p}.attn", b.attn, [("norm_q", "norm_k")]) for p, b in doubles
                         if type(b) is HunyuanVideoTransformerBlock],
        chain="diffusers RMSNorm per head ((x * rsqrt(mean(x^2) + eps)).to(dtype) * weight: two roundings), "
              "then " + rope_chain))
    qk_text = plan.add_site(_common.qk_site(
        "qk_norm_rope (text stream)", [(f"{p}.attn", b.attn, [("norm_added_q", "norm_added_k")]) for p, b in doubles
                                  if type(b) is HunyuanVideoTransformerBlock],
        chain="diffusers RMSNorm per head of the text q and k (two roundings), no RoPE",
        note="qknorm_rope with every text row on the cache's identity row (cos 1, sin 0)"))
    qk_single = plan.add_site(_common.qk_site(
        "qk_norm_rope (single blocks)", [(f"{p}.attn", b.attn, [("norm_q", "norm_k")]) for p, b in singles
                                         if type(b) is HunyuanVideoSingleTransformerBlock],
        chain="diffusers RMSNorm per head over latent and text tokens in one call, then " + rope_chain +
              " of the latent tokens only",
        note="one qknorm_rope call over the latent and text rows, the text rows on the cache's identity row "
             "(the first sight compares it with the model's norm of all rows)"))
    dual = plan.add_site(joint_qk_site(
        "qk_norm_rope (dual-stream)", [(f"{p}.attn", b.attn) for p, b in doubles
                                       if type(b) is HunyuanVideoTransformerBlock],
        chain="diffusers RMSNorm per head of each stream (two roundings), " + rope_chain + " of the latent "
              "q and k, then torch.cat([latent, text], dim=1) of q, k and v"))
    adaln = plan.add_site(_common.adaln_site())
    residual = plan.add_site(_common.gated_residual_site())
    residual_norm = plan.add_site(_common.residual_adaln_site())
    gelu = plan.add_site(flux.gelu_cat_site())

    for path, block in doubles:
        if type(block) is not HunyuanVideoTransformerBlock:
            plan.skip(path, f"{type(block).__name__} (token replace) is left to the model's code")
            continue
        if dual.op is not None:  # both streams' QK and the joint q, k, v in one call
            _common.patch_processor(plan, dual, f"{path}.attn", block.attn, HunyuanVideoAttnProcessor2_0,
                                    HunyuanVideoDualAttnProcessorDitops, ("latent + text",))
        else:  # the two streams' sites, where the dual-stream op does not fit the norms
            text_site = qk_text if qk_text.op is not None else None
            qk_text.places.append(plan.prefix + f"{path}.attn (text)")
            _common.patch_processor(plan, qk, f"{path}.attn", block.attn, HunyuanVideoAttnProcessor2_0,
                                    functools.partial(HunyuanVideoAttnProcessorDitops, text_site=text_site),
                                    ("latent",))
        _common.double_block_places(plan, path, block, adaln, residual, residual_norm)
        plan.patch_forward(path, block, double_block_forward(adaln, residual, residual_norm))
    for path, block in singles:
        if type(block) is not HunyuanVideoSingleTransformerBlock:
            plan.skip(path, f"{type(block).__name__} (token replace) is left to the model's code")
            continue
        _common.patch_processor(plan, qk_single, f"{path}.attn", block.attn, HunyuanVideoAttnProcessor2_0,
                                HunyuanVideoSingleAttnProcessorDitops, ("latent + text",))
        _common.patch_adaln_module(plan, adaln, f"{path}.norm", block.norm)
        residual.places.append(plan.prefix + f"{path} (attn + mlp)")
        plan.patch_forward(path, block, single_block_forward(residual, flux.single_block_cat(plan, gelu, path, block)))
    _common.patch_adaln_module(plan, adaln, "norm_out", model.norm_out)
    patch = plan.add_site(patch_embedding_site())
    if type(model.x_embedder) is HunyuanVideoPatchEmbed:
        patch.places.append(plan.prefix + "x_embedder")
        plan.patch_forward("x_embedder", model.x_embedder, patch_embed_forward(patch))
    else:
        patch.skipped.append((plan.prefix + "x_embedder", f"{type(model.x_embedder).__name__} is not "
                              "HunyuanVideoPatchEmbed"))
