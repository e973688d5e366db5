"""LTX-2 (diffusers LTX2VideoTransformer3DModel), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE of every LTX2Attention: torch.nn.RMSNorm over the whole projected row
    (rms_norm_across_heads; the attentions build it with a weight, the model's
    norm_elementwise_affine configures the blocks' own norms, not these), then the model's RoPE
    on the [B, T, N] row: split halves from per-head tables [B, H, T, D/2] (apply_split_rotary_emb:
    x * cos, then addcmul_ of -sin and sin, one rounding), or interleaved pairs from full-width
    tables [B, T, N] (apply_interleaved_rotary_emb), per the model's rope_type. One in-place
    cross_head_qknorm_rope call per attention: split tables as .transpose(1, 2); interleaved ones
    as cos[..., 0::2].unflatten(-1, (H, D/2)) (the same values only because the model repeats
    each frequency twice: the first-sight check decides). Video and audio self-attention, the
    audio-video cross attentions (q and k of different modalities and token counts, each with
    its own table; k takes q's where the model passes none), and the text cross attentions
    (query_rotary_emb None: no RoPE). Gated attention (to_gate_logits) and the perturbed
    processor (spatio-temporal guidance) keep their own steps around the QK part.
  * gated residuals: residual + update * gate in the activation dtype (the attentions', the
    a2v / v2a ones, the feed-forwards', and the text cross-attentions' with cross_attn_mod):
    residual_gate_add.
  * adaLN: the blocks' norms are diffusers' RMSNorm without a weight (x * rsqrt(x.float().pow(2)
    .mean(-1) + eps), cast back), then * (1 + scale) + shift in the activation dtype with scale /
    shift chunks of the block's modulation table ([B, 1 or T, D] views): norm_scale_shift with
    norm="rms", norm_order="aten_mean" (the mean's own reduction order), one call per modulation
    (norm1, audio_norm1, norm2 / audio_norm2 with cross_attn_adaln, the a2v and v2a modulations of
    audio_to_video_norm / video_to_audio_norm: one call each, the norm computed per call, and norm3
    / audio_norm3).
  * The output layers (norm_out and audio_norm_out: an affine-free LayerNorm, then * (1 + scale) +
    shift with scale / shift of scale_shift_table + the time embedding's second output, written
    inline in the model's forward before proj_out / audio_proj_out): layernorm_modulate, by three
    patched modules per stream (patch_output_layers): the time embedding keeps its second output
    for the call, norm_out returns the site's result through proj_out (the model's own modulation
    then works on a 0-dim stand-in: [B, 1, D] instead of [B, S, D]).
  * A residual and the norm after it in one pass (norm_scale_shift's residual form, the same mean
    order: the new residual and the norm of its rounded value, both outputs): attn1's gated
    residual with norm2, the text cross-attention's residual (a plain add without cross_attn_mod)
    with the first a2v modulation, the a2v / v2a residual with norm3, per stream. The feed-forward's
    residual ends the block: its own site. Where the fused sites do not run, their places go back to
    the residual and norm sites above.
  * RoPE tables: the four LTX2AudioVideoRotaryPosEmbed modules (rope, audio_rope, cross_attn_rope,
    cross_attn_audio_rope) build float32 cos/sin tables of fractional positions in about 20
    kernels each: one fractional_rope_tables call, their float64 frequencies computed once per
    module, count and device by the module's own operations.

CUDA-graph capture (graph_constants, graph_refusal; _graphs.py calls them): called without
video_coords / audio_coords (as the bench does), the forward builds them each call in
rope.prepare_video_coords with torch.tensor(<host list>, device=...), a host-to-device copy a
capture cannot hold; they depend only on the batch, the grid, fps and the device, so they are
built once per signature before its capture and passed in. Spatio-temporal guidance as the
pipeline calls it (spatio_temporal_guidance_blocks, perturbation_mask None) is captured: the
forward's default mask and its all-perturbed test are CPU tensors, read on the host at capture
time and the same at every call of the signature. A perturbation_mask on the GPU is read on the
host in each guided block (if all_perturbed:), a sync no graph holds: refused.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import weakref

from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_ltx2 import (LTX2AudioVideoAttnProcessor, LTX2PerturbedAttnProcessor,
                                                            LTX2VideoTransformerBlock, apply_interleaved_rotary_emb,
                                                            apply_split_rotary_emb)
import torch

from ._patching import Plan
from ._sites import MappedSite, Mapping, OpCall, affine_free_layer_norm, op_options
from . import _common

MODEL_CLASS = "LTX2VideoTransformer3DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_ltx2"

QK_NORM = "torch.nn.RMSNorm over the projected row (all heads: F.rms_norm)"
ROPE_CHAINS = {
    "split": "apply_split_rotary_emb: halves j, j + D/2 of each head from [B, H, T, D/2] float32 tables, "
             "x.float() * cos, then addcmul_(-sin, second) and addcmul_(sin, first), one rounding",
    "interleaved": "apply_interleaved_rotary_emb: pairs 2j, 2j+1 from full-width [B, T, N] float32 tables, "
                   "(x.float() * cos + x_rotated.float() * sin).to(dtype)",
}
ADALN_CHAIN = ("diffusers RMSNorm (x * rsqrt(x.float().pow(2).mean(-1) + eps), cast back; no weight by default), "
               "then * (1 + scale) + shift in the activation dtype")
ADALN_WHY = ("diffusers' RMSNorm (norm1/2/3, the audio and a2v / v2a norms) sums squares with torch.mean "
             "(x.float().pow(2).mean(-1)); this build's norm_scale_shift has no norm_order=aten_mean")


def adaln_chain(x, norm, scale, shift):
    """A block's pre-norm and modulation as the model writes it."""
    return norm(x) * (1 + scale) + shift


def _norm_fit(x, norm) -> str:
    """'' when norm_scale_shift(norm="rms", norm_order="aten_mean") takes x: diffusers' RMSNorm
    without a weight over x's last dim (128 <= D < 8192)."""
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
    if type(norm) is not DiffusersRMSNorm or norm.weight is not None:
        weighted = " with a weight" if getattr(norm, "weight", None) is not None else ""
        return f"the norm is {type(norm).__name__}{weighted}"
    if x.dim() != 3 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"x is {x.dtype} of rank {x.dim()}"
    D = x.shape[-1]
    if tuple(norm.dim) != (D,):
        return "the norm's shape is not x's last dim"
    if not 128 <= D < 8192 or D % 4:
        return f"dim {D} (the mean order: 128 <= D < 8192, D % 4 == 0)"
    if x.stride(-1) != 1:
        return "x's last stride is not 1"
    return ""


def _operand_fit(x, name, t) -> str:
    """'' when t is a modulation operand of x: x's dtype, [B, 1 or T, D], unit last stride, x's device."""
    B, S, D = x.shape
    if not isinstance(t, torch.Tensor) or t.dtype != x.dtype or t.dim() != 3 or t.shape[0] != B \
            or t.shape[1] not in (1, S) or t.shape[2] != D or t.stride(-1) != 1 or t.device != x.device:
        return f"{name} is not {x.dtype} [batch, 1 or tokens, dim] on x's device"
    return ""


def _adaln_fit(x, norm, scale, shift) -> str:
    """_norm_fit, and scale / shift of x's dtype [B, 1 or T, D]."""
    return _norm_fit(x, norm) or _operand_fit(x, "scale", scale) or _operand_fit(x, "shift", shift)


# norm_scale_shift with diffusers' RMSNorm order (norm_order="aten_mean"): the norm and the
# modulation in one call, eager's roundings (the norm cast back, 1 + scale, the product, the sum).
ADALN_RMS_MEAN = Mapping(
    op="norm_scale_shift", options={"norm": "rms", "norm_order": "aten_mean"},
    fit=_adaln_fit,
    signature=lambda x, norm, scale, shift: (str(x.device), x.dtype, x.shape[-1], scale.shape[1] == 1,
                                             shift.shape[1] == 1, float(norm.eps)),
    call=lambda x, norm, scale, shift: OpCall("norm_scale_shift", (x, scale, shift),
                                              dict(norm="rms", eps=float(norm.eps), norm_order="aten_mean"),
                                              lambda out: out[0]))


def adaln_mapping() -> Mapping:
    if "aten_mean" in op_options("norm_scale_shift").get("norm_order", []):
        return ADALN_RMS_MEAN
    return Mapping(why=ADALN_WHY)


NORM_CHAIN = "diffusers RMSNorm without a weight (x * rsqrt(x.float().pow(2).mean(-1) + eps), cast back), no modulation"


def norm_chain(x, norm):
    return norm(x)


# The text cross-attention's pre-norm where its query has no modulation (norm2 / audio_norm2
# without cross_attn_mod): norm_scale_shift without scale and shift, the same mean order.
NORM_RMS_MEAN = Mapping(
    op="norm_scale_shift", options={"norm": "rms", "norm_order": "aten_mean"},
    fit=_norm_fit,
    signature=lambda x, norm: (str(x.device), x.dtype, x.shape[-1], float(norm.eps)),
    call=lambda x, norm: OpCall("norm_scale_shift", (x, None, None),
                                dict(norm="rms", eps=float(norm.eps), norm_order="aten_mean"),
                                lambda out: out[0]))


def norm_mapping() -> Mapping:
    return NORM_RMS_MEAN if adaln_mapping() is ADALN_RMS_MEAN else Mapping(why=ADALN_WHY)


# ---------------------------------------------------------------- a residual and the next norm in one pass

RESIDUAL_NORM_CHAIN = ("x + update * gate in the activation dtype (the product rounded, then the sum), then the next "
                       "norm as above (modulated or not): (the new residual, the norm's output)")
ADD_NORM_CHAIN = ("x + update in the activation dtype (the text cross-attention's residual without cross_attn_mod), "
                  "then the next modulated norm as above: (the new residual, the norm's output)")


def residual_norm_chain(x, update, gate, norm, scale, shift):
    """A residual (gated, or a plain add where gate is None), then the next norm of the new value,
    modulated where scale is given: (new residual, the norm's output)."""
    x = x + update if gate is None else x + update * gate
    return x, (norm_chain(x, norm) if scale is None else adaln_chain(x, norm, scale, shift))


def _residual_norm_fit(x, update, gate, norm, scale, shift) -> str:
    """_norm_fit / _adaln_fit of the residual x, update of x's shape, dtype and device with unit last
    stride, and gate (where given) a [B, 1 or T, D] operand as scale is."""
    why = _norm_fit(x, norm) if scale is None else _adaln_fit(x, norm, scale, shift)
    if why:
        return why
    if not isinstance(update, torch.Tensor) or update.shape != x.shape or update.dtype != x.dtype \
            or update.device != x.device or update.stride(-1) != 1:
        return "update is not x's shape and dtype on x's device with a unit last stride"
    return "" if gate is None else _operand_fit(x, "gate", gate)


# norm_scale_shift's residual form with the mean order: residual_out = rne(x + rne(update * gate))
# (or rne(x + update)), y = the norm of residual_out (modulated or not), eager's roundings.
RESIDUAL_NORM_RMS_MEAN = Mapping(
    op="norm_scale_shift", options={"norm": "rms", "norm_order": "aten_mean", "residual": "gated"},
    fit=_residual_norm_fit,
    signature=lambda x, update, gate, norm, scale, shift: (
        str(x.device), x.dtype, x.shape[-1], None if gate is None else gate.shape[1] == 1,
        None if scale is None else (scale.shape[1] == 1, shift.shape[1] == 1), float(norm.eps)),
    call=lambda x, update, gate, norm, scale, shift: OpCall(
        "norm_scale_shift", (update, scale, shift),
        dict(residual=x, gate=gate, norm="rms", eps=float(norm.eps), norm_order="aten_mean"),
        _common.residual_out_and_y))


# The same call with gate None: residual_out = rne(x + update), the text cross-attention's plain add.
ADD_NORM_RMS_MEAN = dataclasses.replace(RESIDUAL_NORM_RMS_MEAN, options={**RESIDUAL_NORM_RMS_MEAN.options,
                                                                         "residual": "add"})


def residual_norm_mapping(gated: bool = True) -> Mapping:
    if adaln_mapping() is ADALN_RMS_MEAN:
        return RESIDUAL_NORM_RMS_MEAN if gated else ADD_NORM_RMS_MEAN
    return Mapping(why=ADALN_WHY)


# ---------------------------------------------------------------- CUDA-graph capture


def _bound(model, args, kwargs):
    return inspect.signature(type(model).forward).bind(model, *args, **kwargs)


def graph_refusal(model, args, kwargs) -> str:
    """Why the forward of this call cannot be captured, or '': a perturbation_mask on the GPU with
    spatio-temporal guidance at a block that reads it (perturbed_attn)."""
    try:
        bound = _bound(model, args, kwargs).arguments
    except TypeError:
        return ""  # the forward raises the caller's error itself
    mask, blocks = bound.get("perturbation_mask"), bound.get("spatio_temporal_guidance_blocks") or []
    if not isinstance(mask, torch.Tensor) or mask.device.type == "cpu":
        return ""
    read = [i for i in blocks if type(i) is int and 0 <= i < len(model.transformer_blocks)
            and getattr(model.transformer_blocks[i], "perturbed_attn", False)]
    if not read:
        return ""
    return (f"perturbation_mask is on {mask.device} with spatio-temporal guidance at block(s) {read}: the "
            "forward reads torch.all(perturbation_mask == 0) on the host in each of them (a sync a graph "
            "cannot hold); pass perturbation_mask=None (the pipeline's form: every element perturbed)")


def graph_constants(model, args, kwargs):
    """(args, kwargs, built): the call with video_coords / audio_coords the forward would build
    from host values (None passed) built here, as the forward builds them, outside any capture;
    built: those tensors (the graph reads them; the caller keeps them alive)."""
    bound = _bound(model, args, kwargs)
    given = bound.arguments
    built = {}
    hidden, audio = given.get("hidden_states"), given.get("audio_hidden_states")
    if given.get("video_coords") is None and isinstance(hidden, torch.Tensor) and all(
            given.get(n) is not None for n in ("num_frames", "height", "width")):
        built["video_coords"] = model.rope.prepare_video_coords(
            hidden.size(0), given["num_frames"], given["height"], given["width"], hidden.device,
            fps=given.get("fps", 24.0))
    if given.get("audio_coords") is None and isinstance(hidden, torch.Tensor) and isinstance(audio, torch.Tensor) \
            and given.get("audio_num_frames") is not None:
        built["audio_coords"] = model.audio_rope.prepare_audio_coords(hidden.size(0), given["audio_num_frames"],
                                                                      audio.device)
    if not built:
        return args, kwargs, None
    given.update(built)
    return bound.args[1:], bound.kwargs, built


# ---------------------------------------------------------------- QK norm + RoPE


def _tables(attn, query, key, query_rotary_emb, key_rotary_emb):
    """(rope, head_dim, (q_cos, q_sin, k_cos, k_sin), why): the model's tables as the op reads them,
    or why this call is not one the op can take as the model runs it."""
    none = (None,) * 4
    if query_rotary_emb is None:
        return "none", attn.head_dim, none, ""
    rope = attn.rope_type
    Nq, Nk = query.shape[-1], key.shape[-1]
    if rope == "interleaved":
        D = attn.head_dim
        views = []
        for name, freqs, N in (("q", query_rotary_emb, Nq), ("k", key_rotary_emb, Nk)):
            if freqs is None:  # k takes q's table
                views += [None, None]
                continue
            cos, sin = freqs
            if cos.dim() != 3 or cos.shape[-1] != N or sin.shape != cos.shape or N % D:
                return rope, D, none, f"{name}'s interleaved tables are {tuple(cos.shape)}, not [batch, tokens, {N}]"
            views += [t[..., 0::2].unflatten(-1, (N // D, D // 2)) for t in (cos, sin)]
        return rope, D, tuple(views), ""
    if rope == "split":
        cos = query_rotary_emb[0]
        if cos.dim() != 4:
            return (rope, attn.head_dim, none,
                    f"q's split tables are {tuple(cos.shape)}, not [batch, heads, tokens, D/2]")
        D = 2 * cos.shape[-1]  # the model splits each of the table's heads in halves
        views = []
        for name, freqs, x in (("q", query_rotary_emb, query), ("k", key_rotary_emb, key)):
            if freqs is None:
                views += [None, None]
                continue
            cos, sin = freqs
            B, H = x.shape[0], x.shape[-1] // D
            # the model reshapes x to the table's (batch, heads): both must be x's own
            if cos.dim() != 4 or sin.shape != cos.shape or cos.shape[0] != B or cos.shape[1] * D != x.shape[-1] \
                    or cos.shape[-1] * 2 != D:
                return rope, D, none, (f"{name}'s split tables are {tuple(cos.shape)}, not [{B}, {H}, tokens, "
                                       f"{D // 2}]")
            views += [cos.transpose(1, 2), sin.transpose(1, 2)]
        return rope, D, tuple(views), ""
    return "none", attn.head_dim, none, f"rope_type {rope!r} (the model rotates nothing then; not mapped)"


def qk(site: MappedSite, attn, query, key, query_rotary_emb, key_rotary_emb):
    """(query, key) [B, T, N] after the norms and the model's RoPE, or cross_head_qknorm_rope in
    place on the projections."""

    def chain(query, key, norm_q, norm_k, rope, head_dim, tables, unmapped):
        q, k = norm_q(query), norm_k(key)
        if query_rotary_emb is not None:
            key_emb = key_rotary_emb if key_rotary_emb is not None else query_rotary_emb
            if attn.rope_type == "interleaved":
                q = apply_interleaved_rotary_emb(q, query_rotary_emb)
                k = apply_interleaved_rotary_emb(k, key_emb)
            elif attn.rope_type == "split":
                q = apply_split_rotary_emb(q, query_rotary_emb)
                k = apply_split_rotary_emb(k, key_emb)
        return q, k

    rope, head_dim, tables, why = _tables(attn, query, key, query_rotary_emb, key_rotary_emb)
    return site(chain, query, key, attn.norm_q, attn.norm_k, rope, head_dim, tables, why)


def _attention(self, attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
               key_rotary_emb, perturbation_mask=None, all_perturbed=None, perturbed=False):
    """LTX2AudioVideoAttnProcessor (perturbed: LTX2PerturbedAttnProcessor) with the QK part
    through the site; the same steps in the same order otherwise."""
    batch_size, sequence_length, _ = (hidden_states.shape if encoder_hidden_states is None
                                      else encoder_hidden_states.shape)
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    if attn.to_gate_logits is not None:
        gate_logits = attn.to_gate_logits(hidden_states)

    if perturbed:
        value = attn.to_v(encoder_hidden_states)
        if all_perturbed is None:
            all_perturbed = torch.all(perturbation_mask == 0) if perturbation_mask is not None else False
    if perturbed and all_perturbed:
        hidden_states = value  # the guidance pass skips attention
    else:
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        if not perturbed:
            value = attn.to_v(encoder_hidden_states)
        query, key = qk(self.site, attn, query, key, query_rotary_emb, key_rotary_emb)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                              is_causal=False, backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        if perturbed and perturbation_mask is not None:
            value = value.flatten(2, 3)
            hidden_states = torch.lerp(value, hidden_states, perturbation_mask)

    if attn.to_gate_logits is not None:
        hidden_states = hidden_states.unflatten(2, (attn.heads, -1))  # [B, T, H, D]
        gates = 2.0 * torch.sigmoid(gate_logits)  # [B, T, H]
        hidden_states = hidden_states * gates.unsqueeze(-1)
        hidden_states = hidden_states.flatten(2, 3)
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states


class LTX2AttnProcessorDitops(_common.ProcessorWrapper):
    """LTX2AudioVideoAttnProcessor with the QK norm + RoPE through the cross-head qk site. The
    signature is the replaced processor's: LTX2Attention.forward passes only the keywords its
    processor's __call__ names."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        return _attention(self, attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                          key_rotary_emb)


class LTX2PerturbedAttnProcessorDitops(_common.ProcessorWrapper):
    """LTX2PerturbedAttnProcessor (perturbed_attn=True: spatio-temporal guidance) with the QK norm
    + RoPE through the cross-head qk site; an all-perturbed call skips attention as the model does."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None, perturbation_mask=None, all_perturbed=None):
        return _attention(self, attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                          key_rotary_emb, perturbation_mask, all_perturbed, perturbed=True)


PROCESSORS = {LTX2AudioVideoAttnProcessor: LTX2AttnProcessorDitops,
              LTX2PerturbedAttnProcessor: LTX2PerturbedAttnProcessorDitops}


# ---------------------------------------------------------------- the block


# One stream's modules and tables (the video stream's names, the audio stream's with audio_).
VIDEO = dict(table="scale_shift_table", norm1="norm1", attn1="attn1", norm2="norm2", attn2="attn2", norm3="norm3",
             ff="ff", prompt_table="prompt_scale_shift_table", text_q_adaln="video_cross_attn_adaln")
AUDIO = {k: ("audio_" + v if k != "text_q_adaln" else "audio_cross_attn_adaln") for k, v in VIDEO.items()}


class _BlockSites:
    """The block's sites as the sub-blocks call them. A stream between sub-blocks is a state (x,
    update, gate): x plus a residual not yet added (update None: settled), so the next norm can
    add it in the same call (residual_norm / add_norm, where those sites run)."""

    def __init__(self, residual, adaln, norm, residual_norm, add_norm):
        self.residual, self.adaln, self.norm = residual, adaln, norm
        self.residual_norm, self.add_norm = residual_norm, add_norm

    def gated(self, x, update, gate):
        return _common.gated(self.residual, x, update, gate)

    def modulated(self, x, norm, scale, shift):
        return self.adaln(adaln_chain, x, norm, scale, shift)

    def settle(self, stream):
        """The stream's value with its residual added (the gated residual site, or the model's add)."""
        x, update, gate = stream
        if update is None:
            return x
        return x + update if gate is None else self.gated(x, update, gate)

    def normed(self, stream, norm, scale, shift):
        """(the stream's settled value, its norm, modulated where scale is given): one call of the
        residual + norm site where a residual is pending and that site runs, else settle, then the
        norm's site."""
        x, update, gate = stream
        fused = self.residual_norm if gate is not None else self.add_norm
        if update is not None and fused.active:
            return fused(residual_norm_chain, x, update, gate, norm, scale, shift)
        x = self.settle(stream)
        return x, (self.norm(norm_chain, x, norm) if scale is None else self.modulated(x, norm, scale, shift))


def _self_attention(block, sites, names, x, temb, batch_size, rotary, mask, perturbation_mask, all_perturbed):
    """Sub-block 1 of one stream: its modulation rows, the modulated norm1 and attn1. Returns (the
    stream with attn1's gated residual pending, the feed-forward's (shift, scale, gate), the text
    query's (shift, scale, gate) or None)."""
    params = block.get_mod_params(getattr(block, names["table"]), temb, batch_size)
    shift_msa, scale_msa, gate_msa = params[:3]
    text_q = params[6:9] if getattr(block, names["text_q_adaln"]) else None
    args = {"hidden_states": sites.modulated(x, getattr(block, names["norm1"]), scale_msa, shift_msa),
            "encoder_hidden_states": None, "query_rotary_emb": rotary, "attention_mask": mask}
    if block.perturbed_attn:
        args["perturbation_mask"] = perturbation_mask
        args["all_perturbed"] = all_perturbed
    return (x, getattr(block, names["attn1"])(**args), gate_msa), params[3:6], text_q


def _text_kv(block, names, temb_prompt, like, batch_size):
    """The text keys' (shift, scale) of one stream: from its prompt timestep, else the table's rows."""
    table = getattr(block, names["prompt_table"])
    if temb_prompt is not None:
        return block.get_mod_params(table, temb_prompt, batch_size)
    return table[None, None].to(device=like.device, dtype=like.dtype).unbind(dim=2)


def _text_cross_attention(block, sites, names, stream, text_q, context, text_kv, mask):
    """Sub-block 2 of one stream: attn1's residual and norm2 (modulated where the query has its own
    adaLN), the text keys modulated where cross_attn_adaln, attn2. Returns the stream with attn2's
    residual pending (gated where modulated, else a plain add)."""
    norm = getattr(block, names["norm2"])
    scale, shift = (None, None) if text_q is None else (text_q[1], text_q[0])
    x, normed = sites.normed(stream, norm, scale, shift)
    if block.cross_attn_adaln:
        context = context * (1 + text_kv[1]) + text_kv[0]
    out = getattr(block, names["attn2"])(normed, encoder_hidden_states=context, query_rotary_emb=None,
                                         attention_mask=mask)
    return x, out, None if text_q is None else text_q[2]


def _av_cross_attention(block, sites, fused, video, audio, batch_size, temb_ca_scale_shift, temb_ca_audio_scale_shift,
                        temb_ca_gate, temb_ca_audio_gate, ca_video_rotary_emb, ca_audio_rotary_emb, a2v_mask, v2a_mask,
                        use_a2v, use_v2a):
    """Sub-block 3: audio-to-video and video-to-audio cross-attention, on the streams as states.
    With the adaLN site mapped (fused) each modulation is one call (the norm computed per call, of
    the states before the a2v residual, as the model's norms are), the first one of each stream
    adding its pending residual; otherwise the streams settle and the norms run once. Returns the
    streams with the a2v / v2a residuals pending."""
    video_in, audio_in = video, audio
    normed_video = normed_audio = None
    if not fused:
        video_in = video = (sites.settle(video), None, None)
        audio_in = audio = (sites.settle(audio), None, None)
        normed_video = block.audio_to_video_norm(video[0])
        normed_audio = block.video_to_audio_norm(audio[0])

    def modulated_ca(stream, norm, normed, scale, shift):
        if fused:
            return sites.normed(stream, norm, scale.squeeze(2), shift.squeeze(2))
        return stream[0], normed * (1 + scale.squeeze(2)) + shift.squeeze(2)

    def rows(table, temb_scale_shift, temb_gate):
        scale_shift = block.get_mod_params(table[:4, :], temb_scale_shift, batch_size)
        gate = block.get_mod_params(table[4:, :], temb_gate, batch_size)
        return scale_shift, gate[0].squeeze(2)

    (video_a2v_scale, video_a2v_shift, video_v2a_scale, video_v2a_shift), a2v_gate = rows(
        block.video_a2v_cross_attn_scale_shift_table, temb_ca_scale_shift, temb_ca_gate)
    (audio_a2v_scale, audio_a2v_shift, audio_v2a_scale, audio_v2a_shift), v2a_gate = rows(
        block.audio_a2v_cross_attn_scale_shift_table, temb_ca_audio_scale_shift, temb_ca_audio_gate)

    def modulated_pair(video_scale, video_shift, audio_scale, audio_shift):
        """Both streams' modulations of their values before the a2v residual: ((video value, its
        modulation), (audio value, its modulation)), the video stream's first."""
        return (modulated_ca(video_in, block.audio_to_video_norm, normed_video, video_scale, video_shift),
                modulated_ca(audio_in, block.video_to_audio_norm, normed_audio, audio_scale, audio_shift))

    if use_a2v:
        (x, v), (y, a) = modulated_pair(video_a2v_scale, video_a2v_shift, audio_a2v_scale, audio_a2v_shift)
        video_in, audio_in = (x, None, None), (y, None, None)
        audio = audio_in
        video = (x, block.audio_to_video_attn(v, encoder_hidden_states=a, query_rotary_emb=ca_video_rotary_emb,
                                              key_rotary_emb=ca_audio_rotary_emb, attention_mask=a2v_mask), a2v_gate)
    if use_v2a:
        (x, v), (y, a) = modulated_pair(video_v2a_scale, video_v2a_shift, audio_v2a_scale, audio_v2a_shift)
        if not use_a2v:
            video = (x, None, None)
        audio = (y, block.video_to_audio_attn(a, encoder_hidden_states=v, query_rotary_emb=ca_audio_rotary_emb,
                                              key_rotary_emb=ca_video_rotary_emb, attention_mask=v2a_mask), v2a_gate)
    return video, audio


def _feed_forward(block, sites, names, stream, mlp):
    """Sub-block 4 of one stream: the pending residual and the modulated norm3, the feed-forward and
    its gated residual (added here: the block's output)."""
    shift, scale, gate = mlp
    x, normed = sites.normed(stream, getattr(block, names["norm3"]), scale, shift)
    return sites.gated(x, getattr(block, names["ff"])(normed), gate)


def block_forward(residual: MappedSite, adaln: MappedSite, norm: MappedSite, residual_norm: MappedSite,
                  add_norm: MappedSite):
    """LTX2VideoTransformerBlock.forward (diffusers 0.42.1) with the gated residuals and the norms'
    modulations through the sites (the QK sites are in the attentions' processors), sub-block by
    sub-block in the model's order, each stream through the same code; each residual but the
    feed-forward's added by the next norm's call where the residual + norm sites run."""
    sites = _BlockSites(residual, adaln, norm, residual_norm, add_norm)

    def forward(self, hidden_states, audio_hidden_states, encoder_hidden_states, audio_encoder_hidden_states, temb,
                temb_audio, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                temb_prompt=None, temb_prompt_audio=None, video_rotary_emb=None, audio_rotary_emb=None,
                ca_video_rotary_emb=None, ca_audio_rotary_emb=None, encoder_attention_mask=None,
                audio_encoder_attention_mask=None, self_attention_mask=None, audio_self_attention_mask=None,
                a2v_cross_attention_mask=None, v2a_cross_attention_mask=None, use_a2v_cross_attention=True,
                use_v2a_cross_attention=True, perturbation_mask=None, all_perturbed=None):
        batch_size = hidden_states.size(0)
        # 1. Video and audio self-attention
        video, video_mlp, video_text_q = _self_attention(
            self, sites, VIDEO, hidden_states, temb, batch_size, video_rotary_emb, self_attention_mask,
            perturbation_mask, all_perturbed)
        audio, audio_mlp, audio_text_q = _self_attention(
            self, sites, AUDIO, audio_hidden_states, temb_audio, batch_size, audio_rotary_emb,
            audio_self_attention_mask, perturbation_mask, all_perturbed)
        # 2. Video and audio cross-attention with the text
        video_kv = audio_kv = None
        if self.cross_attn_adaln:
            video_kv = _text_kv(self, VIDEO, temb_prompt, hidden_states, batch_size)
            audio_kv = _text_kv(self, AUDIO, temb_prompt_audio, audio_hidden_states, batch_size)
        video = _text_cross_attention(self, sites, VIDEO, video, video_text_q, encoder_hidden_states, video_kv,
                                      encoder_attention_mask)
        audio = _text_cross_attention(self, sites, AUDIO, audio, audio_text_q, audio_encoder_hidden_states, audio_kv,
                                      audio_encoder_attention_mask)
        # 3. Audio-to-video and video-to-audio cross-attention
        if use_a2v_cross_attention or use_v2a_cross_attention:
            video, audio = _av_cross_attention(
                self, sites, adaln.op is not None, video, audio, batch_size,
                temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                ca_video_rotary_emb, ca_audio_rotary_emb, a2v_cross_attention_mask, v2a_cross_attention_mask,
                use_a2v_cross_attention, use_v2a_cross_attention)
        # 4. Feed-forward
        return _feed_forward(self, sites, VIDEO, video, video_mlp), _feed_forward(self, sites, AUDIO, audio, audio_mlp)

    return forward


# ---------------------------------------------------------------- RoPE tables (the rope modules)

ROPE_MODULES = ("rope", "audio_rope", "cross_attn_rope", "cross_attn_audio_rope")
ROPE_TABLES_CHAIN = ("LTX2AudioVideoRotaryPosEmbed.forward: the bounds' midpoint (start + end) / 2.0, "
                     "/ max_positions[a] per axis, torch.stack, theta ** linspace(0, 1, F, float64) * pi / 2.0 as "
                     "float32, (grid * 2 - 1) * freqs, transpose and flatten, cos and sin in float32, the padding "
                     "(ones, zeros) in front; split: reshaped to [B, H, T, D/2] per head")


def _max_positions(module) -> tuple:
    return ((module.base_num_frames, module.base_height, module.base_width) if module.modality == "video"
            else (module.base_num_frames,))


def rope_tables_mapping(module) -> Mapping:
    """The rope module's forward(coords) as one fractional_rope_tables call: its frequencies computed
    once per (count, device) by the module's own torch operations (ditops.eager.fractional_rope_tables.
    module_freqs; not during a capture or a trace, whose tensors hold no values yet), cos and sin
    allocated here and written by the op, the split tables reshaped per head as the module does."""
    if not op_options("fractional_rope_tables"):
        return Mapping(why="this build of ditops has no fractional_rope_tables op")
    from ditops.eager.fractional_rope_tables import module_freqs
    cached = {}

    def shape_of(coords):
        axes = coords.shape[1]
        frequencies = module.dim // (2 * axes)
        width = module.dim // 2 if module.rope_type == "split" else module.dim
        return axes, frequencies, width

    def fit(coords):
        if coords.dtype != torch.float32 or coords.device.type not in ("cpu", "cuda"):
            return f"coords {coords.dtype} on {coords.device.type}, not float32 on cpu or cuda"
        if coords.dim() not in (3, 4) or (coords.dim() == 4 and coords.shape[-1] != 2):
            return f"coords {tuple(coords.shape)}, not [B, A, P, 2] or [B, A, P]"
        if module.rope_type not in ("split", "interleaved") or module.modality not in ("video", "audio"):
            return f"rope_type {module.rope_type!r}, modality {module.modality!r}"
        axes, frequencies, width = shape_of(coords)
        if not 1 <= axes <= len(_max_positions(module)) or frequencies < 1:
            return f"{axes} position axes for dim {module.dim} ({module.modality})"
        if module.rope_type == "split" and width % module.num_attention_heads:
            return f"{width} columns do not split into {module.num_attention_heads} heads"
        return ""

    def freqs_for(frequencies, device):
        key = (frequencies, str(device), float(module.theta), bool(module.double_precision))
        if key in cached:
            return cached[key]
        freqs = module_freqs(module.theta, frequencies, module.double_precision, device)
        # kept only when computed eagerly: a trace's or a capture's tensors hold no values yet
        if not torch.compiler.is_compiling() and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            cached[key] = freqs
        return freqs

    def call(coords):
        axes, frequencies, width = shape_of(coords)
        batch, positions = coords.shape[0], coords.shape[2]
        cos = torch.empty(batch, positions, width, dtype=torch.float32, device=coords.device)
        sin = torch.empty_like(cos)
        bases = list(_max_positions(module)) + [1, 1]
        options = {f"max_pos{a}": int(bases[a]) for a in range(3)}
        options["layout"] = module.rope_type

        def output(_):
            if module.rope_type == "split":
                heads = module.num_attention_heads
                return (cos.reshape(batch, positions, heads, -1).swapaxes(1, 2),
                        sin.reshape(batch, positions, heads, -1).swapaxes(1, 2))
            return cos, sin

        return OpCall("fractional_rope_tables", (coords, freqs_for(frequencies, coords.device), cos, sin), options,
                      output)

    def signature(coords):  # the module's attributes too: a caller may change them
        return (str(coords.device), tuple(coords.shape), coords.stride(), module.dim, module.rope_type,
                module.modality, _max_positions(module), float(module.theta), bool(module.double_precision),
                module.num_attention_heads)

    return Mapping(op="fractional_rope_tables", fit=fit, signature=signature, call=call)


def rope_forward(site: MappedSite, cls):
    """cls.forward(coords, device) through the site: (cos, sin). Coords on another device than the
    tables' (the module moves its grid there) run the module's code."""

    def forward(self, coords, device=None):
        if device is not None and torch.device(device) != coords.device:
            return cls.forward(self, coords, device)
        return site(lambda c: cls.forward(self, c, device), coords)

    return forward


def patch_rope_modules(plan: Plan, model) -> None:
    """One site per rope module (each its own mapping: its dim, modality and bases), one class."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed
    for name in ROPE_MODULES:
        module = getattr(model, name, None)
        if module is None:
            continue
        if type(module) is LTX2AudioVideoRotaryPosEmbed:
            mapping = rope_tables_mapping(module)
        else:
            mapping = Mapping(why=f"{name} is {type(module).__name__}, not LTX2AudioVideoRotaryPosEmbed")
        site = plan.add_site(MappedSite(f"rope_tables ({name})", mapping=mapping, outputs=2, chain=ROPE_TABLES_CHAIN))
        site.places.append(plan.prefix + name)
        if site.op is not None:
            plan.patch_forward(name, module, rope_forward(site, type(module)))


# ---------------------------------------------------------------- the output layers

# Per stream: the time embedding, the modulation table, the norm, the projection, and the model
# forward's lines between them (diffusers 0.42.1): a forward that reads otherwise keeps its code.
OUTPUT_LAYERS = {
    "video": ("time_embed", "scale_shift_table", "norm_out", "proj_out",
              ("scale_shift_values = self.scale_shift_table[None, None] + embedded_timestep[:, :, None]",
               "shift, scale = scale_shift_values[:, :, 0], scale_shift_values[:, :, 1]",
               "hidden_states = self.norm_out(hidden_states)",
               "hidden_states = hidden_states * (1 + scale) + shift",
               "output = self.proj_out(hidden_states)")),
    "audio": ("audio_time_embed", "audio_scale_shift_table", "audio_norm_out", "audio_proj_out",
              ("audio_scale_shift_values = self.audio_scale_shift_table[None, None] + audio_embedded_timestep[:, :, None]",
               "audio_shift, audio_scale = audio_scale_shift_values[:, :, 0], audio_scale_shift_values[:, :, 1]",
               "audio_hidden_states = self.audio_norm_out(audio_hidden_states)",
               "audio_hidden_states = audio_hidden_states * (1 + audio_scale) + audio_shift",
               "audio_output = self.audio_proj_out(audio_hidden_states)")),
}


class _OutputState(threading.local):
    """One thread's hand-over within a forward: the time embedding's second output per stream (set
    by the time embedding, taken by norm_out) and the modulated norm (set by norm_out, taken by
    proj_out). A call's time embedding drops what an earlier call of the thread left."""

    def __init__(self):
        self.embedded = {}
        self.modulated = {}


def _output_layers_why(model, stream) -> str:
    embed, table, norm, proj, lines = OUTPUT_LAYERS[stream]
    for name in (embed, table, norm, proj):
        if getattr(model, name, None) is None:
            return f"the model has no {name}"
    why = affine_free_layer_norm(getattr(model, norm))
    if why:
        return f"{norm}: {why}"
    if type(getattr(model, proj)) is not torch.nn.Linear:
        return f"{proj} is {type(getattr(model, proj)).__name__}, not torch.nn.Linear"
    try:
        source = " ".join(inspect.getsource(type(model).forward).split())
    except (OSError, TypeError) as e:
        return f"the model's forward has no source to check ({e})"
    if " ".join(" ".join(lines).split()) not in source:
        return f"the model's forward does not run {norm}, the modulation and {proj} as diffusers 0.42.1 does"
    return ""


def patch_output_layers(plan: Plan, model, site: MappedSite) -> None:
    """norm_out / audio_norm_out and the modulation after them through the adaLN site, where the
    model's forward writes them as diffusers 0.42.1 does (OUTPUT_LAYERS). Under torch.compile, with
    a per-token modulation ([B, T, D] scale, T > 1) or where a part is missing, each module runs
    its own code and the forward its own modulation."""
    state = _OutputState()
    for stream, (embed, table_name, norm_name, proj_name, _) in OUTPUT_LAYERS.items():
        site.places.append(plan.prefix + norm_name)
        if site.op is None:
            continue
        why = _output_layers_why(model, stream)
        if why:
            site.skipped.append((plan.prefix + norm_name, why))
            continue
        plan.patch_forward(embed, getattr(model, embed), _embedding_forward(state, stream, type(getattr(model, embed))))
        plan.patch_forward(norm_name, getattr(model, norm_name),
                           _norm_out_forward(site, state, stream, weakref.ref(model), table_name))
        plan.patch_forward(proj_name, getattr(model, proj_name), _proj_out_forward(state, stream))


def _embedding_forward(state: _OutputState, stream: str, cls):
    def forward(self, *args, **kwargs):
        out = cls.forward(self, *args, **kwargs)
        if not torch.compiler.is_compiling():
            state.modulated.pop(stream, None)
            state.embedded[stream] = out[1]
        return out
    return forward


def _norm_out_forward(site: MappedSite, state: _OutputState, stream: str, model_ref, table_name: str):
    # The norm as the site's mapping and chain see it: an affine-free LayerNorm like the model's,
    # not patched (the model's module now runs this forward); kept in step with the module's eps.
    twin = torch.nn.LayerNorm(1, elementwise_affine=False)

    def forward(self, x):
        embedded = None if torch.compiler.is_compiling() else state.embedded.pop(stream, None)
        if embedded is None or x.dim() != 3:
            return torch.nn.LayerNorm.forward(self, x)
        embedded = embedded.view(x.shape[0], -1, embedded.size(-1))
        if embedded.shape[1] != 1:  # a modulation per token: the model's code
            return torch.nn.LayerNorm.forward(self, x)
        twin.normalized_shape, twin.eps = self.normalized_shape, self.eps
        values = getattr(model_ref(), table_name)[None, None] + embedded[:, :, None]  # the model's own operations
        shift, scale = values[:, 0, 0], values[:, 0, 1]
        state.modulated[stream] = _common.modulate(site, x, scale, shift, twin)
        return x.new_zeros(())
    return forward


def _proj_out_forward(state: _OutputState, stream: str):
    def forward(self, x):
        modulated = None if torch.compiler.is_compiling() else state.modulated.pop(stream, None)
        return torch.nn.Linear.forward(self, x if modulated is None else modulated)
    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    rope = model.config.rope_type
    rope_chain = ROPE_CHAINS.get(rope, f"rope_type {rope!r}")
    qk_video = plan.add_site(_common.cross_head_qk_site("qk_norm_rope (video self-attn)", rope,
                                                        f"{QK_NORM}, then {rope_chain}"))
    qk_audio = plan.add_site(_common.cross_head_qk_site("qk_norm_rope (audio self-attn)", rope,
                                                        f"{QK_NORM}, then {rope_chain}"))
    qk_av = plan.add_site(_common.cross_head_qk_site(
        "qk_norm_rope (a2v/v2a cross-attn)", rope,
        f"{QK_NORM} of q and of k (other modality, tokens and width), then {rope_chain} with q's table for q, "
        "k's for k (q's where the model passes none)"))
    qk_text = plan.add_site(_common.cross_head_qk_site(
        "qk_norm_rope (text cross-attn)", "none", f"{QK_NORM} of the queries and the text keys, no RoPE"))
    adaln = plan.add_site(MappedSite("adaln_modulate", mapping=adaln_mapping(), chain=ADALN_CHAIN))
    norm = plan.add_site(MappedSite("adaln_modulate (norm2, no modulation)", mapping=norm_mapping(), chain=NORM_CHAIN))
    residual = plan.add_site(_common.gated_residual_site())
    residual_norm = plan.add_site(MappedSite(
        "adaln_modulate (gated residual + norm)", mapping=residual_norm_mapping(), chain=RESIDUAL_NORM_CHAIN,
        classes=("adaln_modulate", "gated_residual"), outputs=2))
    add_norm = plan.add_site(MappedSite("adaln_modulate (residual + norm)",
                                        mapping=residual_norm_mapping(gated=False), chain=ADD_NORM_CHAIN, outputs=2))

    attentions = (("attn1", qk_video, "video"), ("audio_attn1", qk_audio, "audio"),
                  ("audio_to_video_attn", qk_av, "video q, audio k"),
                  ("video_to_audio_attn", qk_av, "audio q, video k"),
                  ("attn2", qk_text, "video q, text k"), ("audio_attn2", qk_text, "audio q, text k"))
    for i, block in enumerate(model.transformer_blocks):
        path = f"transformer_blocks.{i}"
        if type(block) is not LTX2VideoTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not LTX2VideoTransformerBlock")
            continue
        for name, site, stream in attentions:
            attn = getattr(block, name)
            _common.patch_cross_head_processor(plan, site, f"{path}.{name}", attn, PROCESSORS, stream,
                                               (attn.inner_dim, attn.inner_kv_dim))
        at = plan.prefix + path
        adaln.places += [f"{at}.{n}" for n in ("norm1", "audio_norm1", "audio_to_video_norm (v2a)",
                                               "video_to_audio_norm (v2a)")]
        residual.places += [f"{at} (ff)", f"{at} (audio_ff)"]
        # Each residual but the feed-forward's and the norm after it: one call of a fused site, whose
        # places go back to the two sites where it does not run. (The first a2v modulation of each
        # stream takes the text cross-attention's residual; without a2v, the v2a one or norm3 does.)
        for names, a2v_norm, a2v_attn in ((VIDEO, "audio_to_video_norm", "audio_to_video_attn"),
                                          (AUDIO, "video_to_audio_norm", "video_to_audio_attn")):
            norm2, attn1, attn2 = names["norm2"], names["attn1"], names["attn2"]
            if getattr(block, names["text_q_adaln"]):
                residual_norm.fuse(f"{at}.{norm2} (+ {attn1} residual)",
                                   [(residual, f"{at} ({attn1})"), (adaln, f"{at}.{norm2}")])
                residual_norm.fuse(f"{at}.{a2v_norm} (a2v) (+ {attn2} residual)",
                                   [(residual, f"{at} ({attn2})"), (adaln, f"{at}.{a2v_norm} (a2v)")])
            else:
                residual_norm.fuse(f"{at}.{norm2} (+ {attn1} residual)",
                                   [(residual, f"{at} ({attn1})"), (norm, f"{at}.{norm2}")])
                add_norm.fuse(f"{at}.{a2v_norm} (a2v) (+ {attn2} residual)", [(adaln, f"{at}.{a2v_norm} (a2v)")])
            residual_norm.fuse(f"{at}.{names['norm3']} (+ {a2v_attn} residual)",
                               [(residual, f"{at} ({a2v_attn})"), (adaln, f"{at}.{names['norm3']}")])
        plan.patch_forward(path, block, block_forward(residual, adaln, norm, residual_norm, add_norm))
    patch_output_layers(plan, model, plan.add_site(_common.adaln_site("adaln_modulate (norm_out)")))
    patch_rope_modules(plan, model)
