"""FLUX.1 (diffusers FluxTransformer2DModel), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE in every FluxAttention: torch.nn.RMSNorm per head (F.rms_norm: one rounding),
    then diffusers' apply_rotary_emb with interleaved pairs and float32 cos/sin
    ((x.float() * cos + x_rot.float() * sin).to(dtype)). Single blocks: one qknorm_rope call.
    Double blocks normalize the image and the text stream with their own weights, concatenate
    q, k and v and rotate the concatenation: one joint_qknorm_rope call writes the joint q, k, v
    (the rotation is elementwise: each stream is rotated with its rows of cos/sin).
  * adaLN: AdaLayerNormZero / AdaLayerNormZeroSingle / AdaLayerNormContinuous and the double
    block's inline norm2 modulation, LayerNorm without affine then * (1 + scale) + shift:
    layernorm_modulate.
  * gated residuals: residual + gate * update (four per double block, one per single block):
    residual_gate_add.
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import (FluxAttnProcessor, FluxSingleTransformerBlock,
                                                            FluxTransformerBlock, _get_qkv_projections)

from ._joint_qk import joint_qk_site
from ._patching import Plan
from ._sites import GatedResidualSite, LayerNormModulateSite
from . import _common

MODEL_CLASS = "FluxTransformer2DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_flux"


class FluxAttnProcessorDitops(_common.ProcessorWrapper):
    """FluxAttnProcessor with the QK norm + RoPE through the site: a single block's through the qk
    site, a double block's (and the joint q, k, v) through the dual-stream site. Everything else is
    the processor's own sequence; attention backend and parallel config are the replaced
    processor's."""

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
        text_len = encoder_query.shape[1] if joint else 0

        rows = image_rotary_emb[0].shape[0] if image_rotary_emb is not None else -1
        if image_rotary_emb is not None and rows == text_len + query.shape[1] and joint:
            query, key, value = joint_qk(self.site, (encoder_query, encoder_key, encoder_value, query, key, value),
                                         (attn.norm_added_q, attn.norm_added_k, attn.norm_q, attn.norm_k),
                                         image_rotary_emb)
        elif image_rotary_emb is not None and rows == query.shape[1] and not joint:
            query, key = _common.qk(self.site, query, key, attn.norm_q, attn.norm_k, image_rotary_emb, 0)
        else:  # the model's order: norms, concatenation, RoPE of the whole
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
        if encoder_hidden_states is None:
            return hidden_states
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
        hidden_states = attn.to_out[0](hidden_states.contiguous())
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
        return hidden_states, encoder_hidden_states


def joint_qk(site, streams, norms, freqs):
    """The joint (q, k, v) of a double block: [text; image] rows, through the dual-stream site; the
    model's chain (norms, concatenation, RoPE of the whole) is its reference."""

    def reference():
        q1, k1, v1, q2, k2, v2 = streams
        query = torch.cat([norms[0](q1), norms[2](q2)], dim=1)
        key = torch.cat([norms[1](k1), norms[3](k2)], dim=1)
        value = torch.cat([v1, v2], dim=1)
        return (apply_rotary_emb(query, freqs, sequence_dim=1), apply_rotary_emb(key, freqs, sequence_dim=1), value)

    return site(streams, norms, freqs, reference)


def double_block_forward(adaln: LayerNormModulateSite, residual: GatedResidualSite):
    """FluxTransformerBlock.forward with the norm2 modulations and the four gated residuals
    through the sites (norm1 / norm1_context are patched modules of their own)."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                joint_attention_kwargs=None):
        norm_hidden, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_context, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb)
        outputs = self.attn(hidden_states=norm_hidden, encoder_hidden_states=norm_context,
                            image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
        attn_output, context_attn_output = outputs[0], outputs[1]

        hidden_states = _common.gated(residual, hidden_states, attn_output, gate_msa.unsqueeze(1))
        norm_hidden = _common.modulate(adaln, hidden_states, scale_mlp, shift_mlp, self.norm2)
        ff_output = self.ff(norm_hidden)
        hidden_states = _common.gated(residual, hidden_states, ff_output, gate_mlp.unsqueeze(1))
        if len(outputs) == 3:
            hidden_states = hidden_states + outputs[2]

        encoder_hidden_states = _common.gated(residual, encoder_hidden_states, context_attn_output,
                                              c_gate_msa.unsqueeze(1))
        norm_context = _common.modulate(adaln, encoder_hidden_states, c_scale_mlp, c_shift_mlp,
                                        self.norm2_context)
        context_ff_output = self.ff_context(norm_context)
        encoder_hidden_states = _common.gated(residual, encoder_hidden_states, context_ff_output,
                                              c_gate_mlp.unsqueeze(1))
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


def single_block_forward(residual: GatedResidualSite):
    """FluxSingleTransformerBlock.forward with its gated residual through the site."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                joint_attention_kwargs=None):
        text_len = encoder_hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        skip = hidden_states
        norm_hidden, gate = self.norm(hidden_states, emb=temb)
        mlp_hidden = self.act_mlp(self.proj_mlp(norm_hidden))
        attn_output = self.attn(hidden_states=norm_hidden, image_rotary_emb=image_rotary_emb,
                                **(joint_attention_kwargs or {}))
        update = self.proj_out(torch.cat([attn_output, mlp_hidden], dim=2))
        hidden_states = _common.gated(residual, skip, update, gate.unsqueeze(1))
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return hidden_states[:, :text_len], hidden_states[:, text_len:]

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    doubles = [(f"transformer_blocks.{i}", b) for i, b in enumerate(model.transformer_blocks)]
    singles = [(f"single_transformer_blocks.{i}", b) for i, b in enumerate(model.single_transformer_blocks)]
    qk = plan.add_site(_common.qk_site(
        "qk_norm_rope", [(f"{p}.attn", b.attn, [("norm_q", "norm_k")]) for p, b in singles],
        chain="per-head RMSNorm (the module decides: torch.nn.RMSNorm is F.rms_norm), then "
              "apply_rotary_emb: interleaved pairs, float32 cos/sin, "
              "(x.float() * cos + x_rot.float() * sin).to(dtype)"))
    dual = plan.add_site(joint_qk_site(
        "qk_norm_rope (dual-stream)", [(f"{p}.attn", b.attn) for p, b in doubles],
        chain="per-head RMSNorm of each stream (the module decides: torch.nn.RMSNorm is F.rms_norm), "
              "torch.cat([text, image], dim=1) of q, k and v, then apply_rotary_emb of the joint rows: "
              "interleaved pairs, float32 cos/sin, (x.float() * cos + x_rot.float() * sin).to(dtype)"))
    adaln = plan.add_site(_common.adaln_site())
    residual = plan.add_site(_common.gated_residual_site())

    for path, block in doubles:
        if type(block) is not FluxTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not FluxTransformerBlock")
            continue
        _common.patch_processor(plan, dual, f"{path}.attn", block.attn, FluxAttnProcessor,
                                FluxAttnProcessorDitops, ("text + image",))
        _common.patch_adaln_module(plan, adaln, f"{path}.norm1", block.norm1)
        _common.patch_adaln_module(plan, adaln, f"{path}.norm1_context", block.norm1_context)
        adaln.places += [plan.prefix + f"{path}.{n}" for n in ("norm2", "norm2_context")]
        residual.places += [plan.prefix + f"{path} ({n})" for n in ("attn", "ff", "context attn", "context ff")]
        plan.patch_forward(path, block, double_block_forward(adaln, residual))
    for path, block in singles:
        if type(block) is not FluxSingleTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not FluxSingleTransformerBlock")
            continue
        _common.patch_processor(plan, qk, f"{path}.attn", block.attn, FluxAttnProcessor,
                                FluxAttnProcessorDitops, ("joint",))
        _common.patch_adaln_module(plan, adaln, f"{path}.norm", block.norm)
        residual.places.append(plan.prefix + f"{path} (attn + mlp)")
        plan.patch_forward(path, block, single_block_forward(residual))
    _common.patch_adaln_module(plan, adaln, "norm_out", model.norm_out)
