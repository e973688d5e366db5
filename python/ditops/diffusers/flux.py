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
    residual_gate_add. A double block's attention residual and its norm2 modulation of the new
    residual, each stream: one norm_scale_shift call (its residual form, eager numerics), the
    "adaln_modulate (residual + norm2)" site; the two sites above where it does not run.
  * RoPE tables: FluxPosEmbed (model.pos_embed) builds the float32 cos/sin tables of the joint ids
    [txt; img] with diffusers' get_1d_rotary_pos_embed per column of ids (float64 frequencies,
    about 13 small kernels per axis): one rope_tables call (rope_tables_mapping, shared with FLUX.2).
  * The single blocks' torch.cat([attn, act_mlp(mlp)], dim=2) before proj_out, act_mlp GELU(tanh):
    gelu_tanh writes the mlp columns of the cat buffer, the attention output is copied into the
    rest (gelu_cat; HunyuanVideo's single blocks too). Between single blocks the two streams stay one
    buffer (_common.joint_rows: the next block's torch.cat of the previous one's split is that buffer).
"""
from __future__ import annotations

import functools

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import (FluxAttnProcessor, FluxPosEmbed,
                                                            FluxSingleTransformerBlock, FluxTransformerBlock,
                                                            _get_qkv_projections)

from ._joint_qk import joint_qk_site
from ._patching import Plan
from ._sites import MappedSite, Mapping, OpCall, op_options
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

    def chain(q1, k1, v1, q2, k2, v2, norms, freqs, rotate_stream2):
        query = torch.cat([norms[0](q1), norms[2](q2)], dim=1)
        key = torch.cat([norms[1](k1), norms[3](k2)], dim=1)
        value = torch.cat([v1, v2], dim=1)
        return (apply_rotary_emb(query, freqs, sequence_dim=1), apply_rotary_emb(key, freqs, sequence_dim=1), value)

    return site(chain, *streams, norms, freqs, True)


def double_block_forward(adaln: MappedSite, residual: MappedSite, residual_norm: MappedSite | None = None):
    """FluxTransformerBlock.forward with the norm2 modulations and the four gated residuals
    through the sites (norm1 / norm1_context are patched modules of their own); residual_norm: each
    stream's attention residual and its norm2 in one call where that site runs (active)."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                joint_attention_kwargs=None):
        norm_hidden, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        norm_context, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, emb=temb)
        outputs = self.attn(hidden_states=norm_hidden, encoder_hidden_states=norm_context,
                            image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
        attn_output, context_attn_output = outputs[0], outputs[1]
        fused = residual_norm is not None and residual_norm.active

        if fused:
            hidden_states, norm_hidden = _common.residual_modulate(
                residual_norm, hidden_states, attn_output, gate_msa.unsqueeze(1), scale_mlp, shift_mlp, self.norm2)
        else:
            hidden_states = _common.gated(residual, hidden_states, attn_output, gate_msa.unsqueeze(1))
            norm_hidden = _common.modulate(adaln, hidden_states, scale_mlp, shift_mlp, self.norm2)
        ff_output = self.ff(norm_hidden)
        hidden_states = _common.gated(residual, hidden_states, ff_output, gate_mlp.unsqueeze(1))
        if len(outputs) == 3:
            hidden_states = hidden_states + outputs[2]

        if fused:
            encoder_hidden_states, norm_context = _common.residual_modulate(
                residual_norm, encoder_hidden_states, context_attn_output, c_gate_msa.unsqueeze(1), c_scale_mlp,
                c_shift_mlp, self.norm2_context)
        else:
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


def model_cat(block, attn_output, mlp_up):
    """The single block's own torch.cat([attn, act_mlp(mlp)], dim=2) before proj_out."""
    return torch.cat([attn_output, block.act_mlp(mlp_up)], dim=2)


def gelu_cat(site: MappedSite):
    """model_cat through the gelu_tanh site (act_mlp nn.GELU(approximate='tanh'))."""
    return lambda block, attn_output, mlp_up: site(functools.partial(model_cat, block), attn_output, mlp_up)


def single_block_cat(plan: Plan, site: MappedSite, path: str, block):
    """The single block's cat: through the site where act_mlp is GELU(tanh), else the model's."""
    if type(block.act_mlp) is torch.nn.GELU and block.act_mlp.approximate == "tanh":
        site.places.append(plan.prefix + f"{path} (cat attn + gelu mlp)")
        return gelu_cat(site)
    site.skipped.append((plan.prefix + f"{path}.act_mlp", f"{block.act_mlp!r} is not nn.GELU(approximate='tanh')"))
    return model_cat


def single_block_forward(residual: MappedSite, cat):
    """FluxSingleTransformerBlock.forward with its gated residual through the site and proj_out's
    input from cat(block, attention output, proj_mlp output) (gelu_cat, or the FP8 path's producer).
    The activation runs after the attention instead of before it: elementwise, the same values. The
    streams' cat is _common.joint_rows: no copy where the previous single block's output is split."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                joint_attention_kwargs=None):
        text_len = encoder_hidden_states.shape[1]
        hidden_states = _common.joint_rows(encoder_hidden_states, hidden_states)
        skip = hidden_states
        norm_hidden, gate = self.norm(hidden_states, emb=temb)
        mlp_up = self.proj_mlp(norm_hidden)
        attn_output = self.attn(hidden_states=norm_hidden, image_rotary_emb=image_rotary_emb,
                                **(joint_attention_kwargs or {}))
        update = self.proj_out(cat(self, attn_output, mlp_up))
        hidden_states = _common.gated(residual, skip, update, gate.unsqueeze(1))
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return hidden_states[:, :text_len], hidden_states[:, text_len:]

    return forward


GELU_CAT_CHAIN = ("torch.cat([attention output, act_mlp(proj_mlp output)], dim=2) before proj_out, act_mlp "
                  "nn.GELU(approximate='tanh') (F.gelu in fp32, rounded to the dtype)")


def gelu_cat_site():
    return MappedSite("gelu_tanh (single block cat)", mapping=_common.cat_act_mapping("gelu_tanh"),
                      chain=GELU_CAT_CHAIN)


# ---------------------------------------------------------------- RoPE tables (FLUX.1 and FLUX.2)

ROPE_MAX_AXES = 4  # rope_tables' axes_dim0..axes_dim3


def rope_chain(cls_name: str, axes: str) -> str:
    return (f"{cls_name}.forward: for each axis a of {axes}, diffusers' get_1d_rotary_pos_embed(axes_dim[a], "
            "ids.float()[:, a], theta, use_real, repeat_interleave_real, float64 frequencies): "
            "1.0 / theta ** (arange(0, d, 2, float64) / d), torch.outer with the positions, cos and sin in float64, "
            "each value twice, .float(); torch.cat over the axes")


def _rope_widths(axes_dim) -> str:
    """'' when every width is what rope_tables takes (even, positive, at most four of them)."""
    if not 1 <= len(axes_dim) <= ROPE_MAX_AXES:
        return f"{len(axes_dim)} axes (rope_tables takes 1 to {ROPE_MAX_AXES})"
    bad = [d for d in axes_dim if int(d) != d or d <= 0 or d % 2]
    return f"axes_dim {list(axes_dim)}: {bad} not even positive widths" if bad else ""


def rope_tables_mapping(module, axes_from_ids: bool) -> Mapping:
    """The pos_embed module's forward(ids) as one rope_tables call: its axes the module's axes_dim (FLUX.2)
    or the first ids.shape[-1] of them (FLUX.1, whose forward loops over ids' columns), its theta the
    module's, read at each call; ids.float() (a no-op for float32 ids) as the model converts them,
    cos and sin allocated here and written by the op."""
    if not op_options("rope_tables"):
        return Mapping(why="this build of ditops has no rope_tables op")

    def widths_of(ids):
        return list(module.axes_dim[:ids.shape[-1]] if axes_from_ids else module.axes_dim)

    def axes(ids):  # after fit: even positive integers
        return [int(d) for d in widths_of(ids)]

    def fit(ids):
        if ids.dim() != 2:
            return f"ids has {ids.dim()} dims, not [S, A]"
        if ids.device.type not in ("cpu", "cuda"):
            return f"ids on {ids.device.type}: the model's frequencies are float32 there"
        if axes_from_ids and ids.shape[-1] > len(module.axes_dim):
            return f"ids has {ids.shape[-1]} columns, axes_dim {len(module.axes_dim)} widths"
        widths = widths_of(ids)
        if ids.shape[-1] < len(widths):
            return f"ids has {ids.shape[-1]} columns for {len(widths)} axes"
        return _rope_widths(widths)

    def call(ids):
        pos = ids.float()
        widths = axes(ids)
        cos = torch.empty(pos.shape[0], sum(widths), dtype=torch.float32, device=pos.device)
        sin = torch.empty_like(cos)
        options = {f"axes_dim{a}": (widths[a] if a < len(widths) else 0) for a in range(ROPE_MAX_AXES)}
        options["theta"] = float(module.theta)
        return OpCall("rope_tables", (pos, cos, sin), options, lambda _: (cos, sin))

    def signature(ids):  # the module's widths and theta too: attributes a caller may change
        return str(ids.device), ids.dtype, tuple(ids.shape), tuple(widths_of(ids)), float(module.theta)

    return Mapping(op="rope_tables", fit=fit, signature=signature, call=call)


def rope_tables_forward(site: MappedSite, cls):
    """cls.forward(ids) (FluxPosEmbed / Flux2PosEmbed) through the site: (cos, sin)."""

    def forward(self, ids):
        return site(lambda i: cls.forward(self, i), ids)

    return forward


def patch_pos_embed(plan: Plan, model, cls, places, axes_from_ids: bool) -> None:
    """The rope_tables site at model.pos_embed (its places: the forward's calls of it), patched where
    the module is cls itself."""
    module = getattr(model, "pos_embed", None)
    if type(module) is cls:
        why = "" if axes_from_ids else _rope_widths(module.axes_dim)
        mapping = Mapping(why=why) if why else rope_tables_mapping(module, axes_from_ids)
    else:
        mapping = Mapping(why=f"pos_embed is {type(module).__name__}, not {cls.__name__}")
    site = plan.add_site(MappedSite("rope_tables (pos_embed)", mapping=mapping, outputs=2,
                                    chain=rope_chain(cls.__name__, "ids' columns" if axes_from_ids else "axes_dim")))
    site.places += [plan.prefix + f"pos_embed ({p})" for p in places]
    if site.op is not None:
        plan.patch_forward("pos_embed", module, rope_tables_forward(site, cls))


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
    residual_norm = plan.add_site(_common.residual_adaln_site())
    gelu = plan.add_site(gelu_cat_site())

    for path, block in doubles:
        if type(block) is not FluxTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not FluxTransformerBlock")
            continue
        _common.patch_processor(plan, dual, f"{path}.attn", block.attn, FluxAttnProcessor,
                                FluxAttnProcessorDitops, ("text + image",))
        _common.double_block_places(plan, path, block, adaln, residual, residual_norm)
        plan.patch_forward(path, block, double_block_forward(adaln, residual, residual_norm))
    for path, block in singles:
        if type(block) is not FluxSingleTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not FluxSingleTransformerBlock")
            continue
        _common.patch_processor(plan, qk, f"{path}.attn", block.attn, FluxAttnProcessor,
                                FluxAttnProcessorDitops, ("joint",))
        _common.patch_adaln_module(plan, adaln, f"{path}.norm", block.norm)
        residual.places.append(plan.prefix + f"{path} (attn + mlp)")
        plan.patch_forward(path, block, single_block_forward(residual, single_block_cat(plan, gelu, path, block)))
    _common.patch_adaln_module(plan, adaln, "norm_out", model.norm_out)
    patch_pos_embed(plan, model, FluxPosEmbed, ["txt_ids + img_ids"], axes_from_ids=True)
