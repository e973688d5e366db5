"""Qwen-Image (diffusers QwenImageTransformer2DModel), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE (image and text stream of every block): diffusers' RMSNorm per head, which
    rounds twice (the normalized value cast to the weight's dtype, then times the weight), then
    apply_rotary_emb_qwen(use_real=False): x.float() viewed as complex64 pairs times complex64
    frequencies, one rounding at the end. qknorm_rope with norm_order=aten_mean,
    norm_weight_rounding=twice and rope_product=complex (c10::complex's a*c - b*d, a*d + b*c as
    nvcc contracts them in aten's mul kernel: fma(a, c, -(b*d)), fma(a, d, b*c)).
  * adaLN: img_norm1/txt_norm1/img_norm2/txt_norm2 (LayerNorm without affine) then
    _modulate's x * (1 + scale) + shift with [B, 1, D] rows: layernorm_modulate; norm_out
    (AdaLayerNormContinuous) likewise. With zero_cond_t (modulate_index) the image stream's
    rows are chosen per token: that call runs the model's code.
  * gated residuals: residual + gate * update, four per block: residual_gate_add. Each stream's
    attention residual and its norm2 modulation of the new residual: one norm_scale_shift call (its
    residual form, eager numerics; "adaln_modulate (residual + norm2)"), the two sites above where it
    does not run (and for the image stream's per-token rows of zero_cond_t).
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_qwenimage import (QwenDoubleStreamAttnProcessor2_0,
                                                                 QwenImageTransformerBlock)

from ._patching import Plan
from ._sites import MappedSite, op_options
from . import _common

MODEL_CLASS = "QwenImageTransformer2DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_qwenimage"

COMPLEX_ROPE = ("Qwen-Image's RoPE is a complex64 multiply (a*c - b*d, a*d + b*c in c10::complex, contracted "
                "into FMAs); this build's qknorm_rope has no rope_product=complex")


def complex_rope_reason() -> str:
    """'' where qknorm_rope computes the complex product as aten does (rope_product=complex)."""
    return "" if "complex" in op_options("qknorm_rope").get("rope_product", []) else COMPLEX_ROPE


class QwenDoubleStreamAttnProcessorDitops(_common.ProcessorWrapper):
    """QwenDoubleStreamAttnProcessor2_0 with each stream's QK norm + RoPE through the qk site."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                 attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None or attention_mask is not None or any(
                getattr(attn, n) is None for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")):
            # the processor's own refusals and optional norms: its own code
            return self.original(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                                 attention_mask, image_rotary_emb)
        if encoder_hidden_states_mask is not None:
            image_mask = torch.ones((hidden_states.shape[0], hidden_states.shape[1]), dtype=torch.bool,
                                    device=hidden_states.device)
            attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)[:, None, None, :]
        text_len = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads

        img_query = attn.to_q(hidden_states).unflatten(-1, (-1, head_dim))
        img_key = attn.to_k(hidden_states).unflatten(-1, (-1, head_dim))
        img_value = attn.to_v(hidden_states).unflatten(-1, (-1, head_dim))
        txt_query = attn.add_q_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        txt_key = attn.add_k_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        txt_value = attn.add_v_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))

        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_query, img_key = _common.qk(self.site, img_query, img_key, attn.norm_q, attn.norm_k,
                                            img_freqs, 0, layout="complex")
            txt_query, txt_key = _common.qk(self.site, txt_query, txt_key, attn.norm_added_q,
                                            attn.norm_added_k, txt_freqs, 0, layout="complex")
        else:
            img_query, img_key = attn.norm_q(img_query), attn.norm_k(img_key)
            txt_query, txt_key = attn.norm_added_q(txt_query), attn.norm_added_k(txt_key)

        joint_query = torch.cat([txt_query, img_query], dim=1)
        joint_key = torch.cat([txt_key, img_key], dim=1)
        joint_value = torch.cat([txt_value, img_value], dim=1)
        joint = dispatch_attention_fn(joint_query, joint_key, joint_value, attn_mask=attention_mask,
                                      dropout_p=0.0, is_causal=False, backend=self._attention_backend,
                                      parallel_config=self._parallel_config)
        joint = joint.flatten(2, 3).to(joint_query.dtype)
        img_attn_output = attn.to_out[0](joint[:, text_len:, :].contiguous())
        if len(attn.to_out) > 1:
            img_attn_output = attn.to_out[1](img_attn_output)
        txt_attn_output = attn.to_add_out(joint[:, :text_len, :].contiguous())
        return img_attn_output, txt_attn_output


def block_forward(adaln: MappedSite, residual: MappedSite, residual_norm: MappedSite | None = None):
    """QwenImageTransformerBlock.forward with the four modulations and the four gated residuals
    through the sites; residual_norm: each stream's attention residual and its norm2 modulation in
    one call where that site runs (active) and the modulation is per batch (no modulate_index)."""

    def modulated(self, x, norm, mod_params, index):
        shift, scale, gate = mod_params.chunk(3, dim=-1)
        if index is not None:  # per-token rows (zero_cond_t): the block's own selection
            return self._modulate(norm(x), mod_params, index)
        return _common.modulate(adaln, x, scale, shift, norm), gate.unsqueeze(1)

    def forward(self, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb,
                image_rotary_emb=None, joint_attention_kwargs=None, modulate_index=None):
        img_mod_params = self.img_mod(temb)
        if self.zero_cond_t:
            temb = torch.chunk(temb, 2, dim=0)[0]
        txt_mod_params = self.txt_mod(temb)
        img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)
        txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)

        img_modulated, img_gate1 = modulated(self, hidden_states, self.img_norm1, img_mod1, modulate_index)
        txt_modulated, txt_gate1 = modulated(self, encoder_hidden_states, self.txt_norm1, txt_mod1, None)
        img_attn_output, txt_attn_output = self.attn(
            hidden_states=img_modulated, encoder_hidden_states=txt_modulated,
            encoder_hidden_states_mask=encoder_hidden_states_mask, image_rotary_emb=image_rotary_emb,
            **(joint_attention_kwargs or {}))
        fused = residual_norm is not None and residual_norm.active

        def residual_modulated(x, update, gate1, norm, mod_params, index, may_fuse):
            """(x + update * gate1, the modulated norm2 of it, norm2's gate)."""
            if fused and may_fuse and index is None:
                shift, scale, gate = mod_params.chunk(3, dim=-1)
                x, modulated_x = _common.residual_modulate(residual_norm, x, update, gate1, scale, shift, norm)
                return x, modulated_x, gate.unsqueeze(1)
            x = _common.gated(residual, x, update, gate1)
            return (x, *modulated(self, x, norm, mod_params, index))

        hidden_states, img_modulated2, img_gate2 = residual_modulated(
            hidden_states, img_attn_output, img_gate1, self.img_norm2, img_mod2, modulate_index,
            not getattr(self, "zero_cond_t", False))  # as plan() counts the places
        encoder_hidden_states, txt_modulated2, txt_gate2 = residual_modulated(
            encoder_hidden_states, txt_attn_output, txt_gate1, self.txt_norm2, txt_mod2, None, True)
        hidden_states = _common.gated(residual, hidden_states, self.img_mlp(img_modulated2), img_gate2)
        encoder_hidden_states = _common.gated(residual, encoder_hidden_states, self.txt_mlp(txt_modulated2),
                                              txt_gate2)
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    blocks = [(f"transformer_blocks.{i}", b) for i, b in enumerate(model.transformer_blocks)]
    qk = plan.add_site(_common.qk_site(
        "qk_norm_rope",
        [(f"{p}.attn", b.attn, [("norm_q", "norm_k"), ("norm_added_q", "norm_added_k")]) for p, b in blocks],
        chain="diffusers RMSNorm per head ((x * rsqrt(mean(x^2) + eps)).to(dtype) * weight: two roundings), "
              "then apply_rotary_emb_qwen(use_real=False): complex64 x * freqs, one rounding",
        probe=probe, probe_reason=complex_rope_reason()))
    adaln = plan.add_site(_common.adaln_site())
    residual = plan.add_site(_common.gated_residual_site())
    residual_norm = plan.add_site(_common.residual_adaln_site())
    for path, block in blocks:
        if type(block) is not QwenImageTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not QwenImageTransformerBlock")
            continue
        _common.patch_processor(plan, qk, f"{path}.attn", block.attn, QwenDoubleStreamAttnProcessor2_0,
                                QwenDoubleStreamAttnProcessorDitops, ("image", "text"))
        at = plan.prefix + path
        adaln.places += [f"{at}.{n}" for n in ("img_norm1", "txt_norm1")]
        residual.places += [f"{at} ({n})" for n in ("img mlp", "txt mlp")]
        for stream in ("img", "txt"):
            if stream == "img" and getattr(block, "zero_cond_t", False):  # per-token modulation rows: not fused
                adaln.places.append(f"{at}.img_norm2")
                residual.places.append(f"{at} (img attn)")
                continue
            residual_norm.fuse(f"{at}.{stream}_norm2 (+ {stream} attn residual)",
                               [(residual, f"{at} ({stream} attn)"), (adaln, f"{at}.{stream}_norm2")])
        plan.patch_forward(path, block, block_forward(adaln, residual, residual_norm))
    _common.patch_adaln_module(plan, adaln, "norm_out", model.norm_out)
