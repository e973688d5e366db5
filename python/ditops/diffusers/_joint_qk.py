"""The dual-stream QK site: per-stream QK norm + RoPE and the joint [text; image] q, k, v of a double
block's attention in one joint_qknorm_rope call (FLUX.1, FLUX.2, HunyuanVideo), where the model normalizes each
stream, concatenates q, k and v, and rotates the joint rows. The op writes fresh joint buffers, so
the model's three torch.cat calls disappear; its values are the chain's (qknorm_rope's numerics per
head, docs/joint_qknorm_rope.md), and the first-sight check decides as at every site."""
from __future__ import annotations

import torch

import ditops

from . import _sites
from ._sites import RopeTable, Site, norm_eps, op_options, rms_norm_rounding

OP = "joint_qknorm_rope"


def joint_qk_site(name, attentions, *, chain):
    """The site over `attentions` [(path, attention module)] whose four QK norms are norm_q, norm_k
    (stream 2, the image) and norm_added_q, norm_added_k (stream 1, the text): joint_qknorm_rope with
    the rounding the norms do, or op None with the reason."""
    site = JointQkNormRopeSite(name, op=None, chain=chain)
    roundings, whys = set(), []
    for path, attn in attentions:
        for attr in ("norm_added_q", "norm_added_k", "norm_q", "norm_k"):
            rounding, why = rms_norm_rounding(getattr(attn, attr, None))
            if rounding is None:
                whys.append(f"{path}.{attr}: {why}")
            roundings.add(rounding)
    choices = op_options(OP)
    if not attentions:
        site.why = "the model has no dual-stream attention"
    elif not choices:
        site.why = f"this build of ditops has no {OP} op"
    elif whys:
        site.why = "; ".join(sorted(set(whys))[:3])
    elif len(roundings) > 1:
        site.why = "the model mixes norms that round once and twice"
    else:
        (site.rounding,) = roundings
        site.op = OP
        site.options["norm_weight_rounding"] = site.rounding
    return site


class JointQkNormRopeSite(Site):
    """RMSNorm per head of each stream's q and k with its own norm, the concatenation [stream 1;
    stream 2] of q, k and v, and RoPE of the joint rows (full-width float32 cos/sin, interleaved
    pairs: diffusers' apply_rotary_emb), as one joint_qknorm_rope call."""

    def __init__(self, *args, rounding: str | None = None, **kw):
        super().__init__(*args, **kw)
        self.rounding = rounding  # what the model's norms do: "once" / "twice"
        self.rope = RopeTable()

    def __call__(self, streams, norms, freqs, reference, rotate_stream2: bool = True):
        """streams: (q1, k1, v1, q2, k2, v2) [B, S, H, D], stream 1 first in the joint rows; norms:
        (norm of q1, of k1, of q2, of k2); freqs: the model's (cos, sin) [S1 + S2, D], or [S1, D]
        with rotate_stream2 False (HunyuanVideo: [latent; text], the text rows not rotated: they sit
        on an identity row of the cache, cos 1 and sin 0); reference(): the model's (q, k, v).
        Returns the joint (q, k, v) [B, S1 + S2, H, D]."""
        why = self._fit(streams, norms, freqs, rotate_stream2)
        q1, q2 = streams[0], streams[3]
        sig = None if why else (str(q1.device), q1.dtype, q1.shape[-1], q1.shape[2], self.rounding, rotate_stream2)
        options = {"norm_weight_rounding": self.rounding} if self.rounding else {}
        if self.rounding == "twice":  # diffusers' RMSNorm sums squares as x.float().pow(2).mean(-1)
            options["norm_order"] = "aten_mean"

        def arguments():
            if rotate_stream2:
                cache, positions = self.rope.get(freqs, "full_width", 0, q1.shape[1] + q2.shape[1], 1, q1.device)
            else:
                cache, positions = self.rope.get(freqs, "full_width", 0, q1.shape[1], 1, q1.device,
                                                 identity=q2.shape[1], head_dim=q1.shape[-1])
            return ((*streams, *(n.weight for n in norms), cache, positions),
                    dict(is_neox=False, eps=norm_eps(norms[0]), rope_dim=q1.shape[-1], cache_full_width=True,
                         rounding="rounded", quality=self.quality, **options))

        def fused():
            args, kwargs = arguments()
            return tuple(_sites.ops.joint_qknorm_rope(*args, **kwargs))

        def explain():
            args, kwargs = arguments()
            return ditops.explain(OP, *args, **kwargs)

        return self.run(why, sig, q1.device, fused, reference, explain)

    @staticmethod
    def _fit(streams, norms, freqs, rotate_stream2: bool = True) -> str:
        if len(streams) != 6 or any(t.dim() != 4 for t in streams):
            return "q, k, v of both streams must be [batch, tokens, heads, head_dim]"
        q1, k1, v1, q2, k2, v2 = streams
        if q1.dtype not in (torch.float16, torch.bfloat16) or any(t.dtype != q1.dtype for t in streams):
            return f"q/k/v are {sorted({str(t.dtype) for t in streams})} (the op takes one of float16, bfloat16)"
        B, S1, H, D = q1.shape
        if any(t.shape != q1.shape for t in (k1, v1)) or any(t.shape != q2.shape for t in (k2, v2)) or \
                q2.shape[0] != B or q2.shape[2:] != (H, D):
            return "the streams' q, k, v differ in batch, heads or head_dim"
        if D not in (64, 128, 256):
            return f"head_dim {D} (the op takes 64, 128 or 256)"
        if any(t.stride(-1) != 1 for t in streams) or (H > 1 and len({t.stride(2) for t in streams}) != 1):
            return "q/k/v strides (a unit last stride and one head stride needed)"
        for n in norms:
            w = n.weight
            if w is None or w.dtype != q1.dtype or w.shape != (D,) or not w.is_contiguous():
                return (f"a norm weight is {None if w is None else (w.dtype, tuple(w.shape))}, not contiguous "
                        f"{q1.dtype} [head_dim]")
        if len({norm_eps(n) for n in norms}) != 1:
            return "the four norms have different eps"
        if any(t.device != q1.device for t in (*streams, *(n.weight for n in norms))):
            return "tensors on different devices"
        if torch.is_grad_enabled() and any(t.requires_grad for t in streams):
            return "autograd records q, k or v (the op has no backward)"
        if not (isinstance(freqs, (tuple, list)) and len(freqs) == 2):
            return "the rotary embedding is not (cos, sin)"
        cos, sin = freqs
        if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != sin.shape:
            return "cos/sin are not float32 of one shape"
        rows = S1 + q2.shape[1] if rotate_stream2 else S1
        if cos.dim() != 2 or cos.shape != (rows, D):
            return ("cos/sin are not [both streams' tokens, head_dim]" if rotate_stream2
                    else "cos/sin are not [the first stream's tokens, head_dim]")
        if cos.device != q1.device or sin.device != q1.device:
            return "rotary tensors on another device"
        return ""
