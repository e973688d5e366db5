"""The dual-stream QK site: per-stream QK norm + RoPE and the joint [text; image] q, k, v of a double
block's attention in one joint_qknorm_rope call (FLUX.1, FLUX.2, HunyuanVideo), where the model normalizes each
stream, concatenates q, k and v, and rotates the joint rows. The op writes fresh joint buffers, so
the model's three torch.cat calls disappear; its values are the chain's (qknorm_rope's numerics per
head, docs/joint_qknorm_rope.md), and the first-sight check decides as at every site."""
from __future__ import annotations

import torch

from ._sites import MappedSite, Mapping, OpCall, RopeTable, norm_eps, op_options, rms_norm_rounding

OP = "joint_qknorm_rope"


def joint_qk_site(name, attentions, *, chain):
    """The site over `attentions` [(path, attention module)] whose four QK norms are norm_q, norm_k
    (stream 2, the image) and norm_added_q, norm_added_k (stream 1, the text): joint_qknorm_rope with
    the rounding the norms do, or op None with the reason."""
    roundings, whys = set(), []
    for path, attn in attentions:
        for attr in ("norm_added_q", "norm_added_k", "norm_q", "norm_k"):
            rounding, why = rms_norm_rounding(getattr(attn, attr, None))
            if rounding is None:
                whys.append(f"{path}.{attr}: {why}")
            roundings.add(rounding)
    if not attentions:
        mapping = Mapping(why="the model has no dual-stream attention")
    elif not op_options(OP):
        mapping = Mapping(why=f"this build of ditops has no {OP} op")
    elif whys:
        mapping = Mapping(why="; ".join(sorted(set(whys))[:3]))
    elif len(roundings) > 1:
        mapping = Mapping(why="the model mixes norms that round once and twice")
    else:
        mapping = joint_qk_mapping(*roundings)
    return MappedSite(name, mapping=mapping, chain=chain, outputs=3)


def joint_qk_mapping(rounding: str) -> Mapping:
    """RMSNorm per head of each stream's q and k with its own norm, the concatenation [stream 1;
    stream 2] of q, k and v, and RoPE of the joint rows (full-width cos/sin, interleaved pairs:
    diffusers' apply_rotary_emb), as one joint_qknorm_rope call. rounding: what the model's norms
    do ("once" / "twice").

    The site is called as site(chain, q1, k1, v1, q2, k2, v2, norms, freqs, rotate_stream2): the
    streams [B, S, H, D], stream 1 first in the joint rows; norms: (norm of q1, of k1, of q2, of
    k2); freqs: the model's (cos, sin) [S1 + S2, D], or [S1, D] with rotate_stream2 False
    (HunyuanVideo: [latent; text], the text rows not rotated: they sit on an identity row of the
    cache, cos 1 and sin 0). Its output is the joint (q, k, v) [B, S1 + S2, H, D]."""
    rope = RopeTable()  # the site's rotary cache, per thread
    options = {"norm_weight_rounding": rounding}
    if rounding == "twice":  # diffusers' RMSNorm sums squares as x.float().pow(2).mean(-1)
        options["norm_order"] = "aten_mean"

    def fit(q1, k1, v1, q2, k2, v2, norms, freqs, rotate_stream2) -> str:
        # what the cache and one eps need; dtypes, shapes, strides and weights are the matcher's
        streams = (q1, k1, v1, q2, k2, v2)
        if any(t.dim() != 4 for t in streams):
            return "q, k, v of both streams must be [batch, tokens, heads, head_dim]"
        if len({norm_eps(n) for n in norms}) != 1:
            return "the four norms have different eps"
        if any(t.device != q1.device for t in (*streams, *(n.weight for n in norms))):
            return "tensors on different devices"
        if torch.is_grad_enabled() and any(t.requires_grad for t in streams):
            return "autograd records q, k or v (the op has no backward)"
        if not (isinstance(freqs, (tuple, list)) and len(freqs) == 2):
            return "the rotary embedding is not (cos, sin)"
        cos, sin = freqs
        if cos.shape != sin.shape:
            return "cos/sin are not of one shape"
        # the positions the op reads are the rows the model's chain takes
        rows = q1.shape[1] + q2.shape[1] if rotate_stream2 else q1.shape[1]
        if cos.dim() != 2 or cos.shape != (rows, q1.shape[-1]):
            return ("cos/sin are not [both streams' tokens, head_dim]" if rotate_stream2
                    else "cos/sin are not [the first stream's tokens, head_dim]")
        if cos.device != q1.device or sin.device != q1.device:
            return "rotary tensors on another device"
        return ""

    def signature(q1, k1, v1, q2, k2, v2, norms, freqs, rotate_stream2):
        streams = (q1, k1, v1, q2, k2, v2)
        B, _, H, D = q1.shape
        return (str(q1.device), tuple(t.dtype for t in streams), D, H, rounding, rotate_stream2,
                all(t.shape == q1.shape for t in (k1, v1)) and all(t.shape == q2.shape for t in (k2, v2))
                and q2.shape[0] == B and q2.shape[2:] == (H, D),
                all(t.stride(-1) == 1 for t in streams), H == 1 or len({t.stride(2) for t in streams}) == 1,
                tuple((n.weight.dtype, tuple(n.weight.shape), n.weight.is_contiguous()) for n in norms),
                freqs[0].dtype, freqs[1].dtype, norm_eps(norms[0]))

    def call(q1, k1, v1, q2, k2, v2, norms, freqs, rotate_stream2):
        if rotate_stream2:
            cache, positions = rope.get(freqs, "full_width", 0, q1.shape[1] + q2.shape[1], 1, q1.device)
        else:
            cache, positions = rope.get(freqs, "full_width", 0, q1.shape[1], 1, q1.device,
                                        identity=q2.shape[1], head_dim=q1.shape[-1])
        return OpCall(OP, (q1, k1, v1, q2, k2, v2, *(n.weight for n in norms), cache, positions),
                      dict(is_neox=False, eps=norm_eps(norms[0]), rope_dim=q1.shape[-1], cache_full_width=True,
                           rounding="rounded", **options), tuple)

    return Mapping(op=OP, options={"norm_weight_rounding": rounding}, fit=fit, signature=signature, call=call)
