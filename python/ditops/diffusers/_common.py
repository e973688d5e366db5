"""Site helpers shared by the model modules: the model's chain at each site (what a call falls
back to, and what the first-sight check compares with) and the patches of modules that several
models share (diffusers' adaLN modules).

The gated residual's reference is written `residual + update * gate`; models write `gate * update`
or add in the other order. IEEE multiplication and addition are commutative bit for bit, so
the values are the model's."""
from __future__ import annotations

import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

import ditops

from ._sites import (MappedSite, Mapping, OpCall, affine_free_layer_norm, cross_head_norm, cross_head_qk_mapping,
                     layernorm_modulate_mapping, op_options, qk_norm_rope_mapping, residual_gate_add_mapping,
                     rms_norm_rounding)


# Where the torch op norm_scale_shift returns each output (residual_out, y, fp8_rowwise, fp8_scale):
# read once, since the op table does not change and a forward traced by dynamo must not deep-copy it.
NSS_OUTPUTS = {t["name"]: i for e in ditops.op_table() if e["name"] == "norm_scale_shift"
               for i, t in enumerate(t for t in e["tensors"] if t["role"] == "out" and t["present"] != "caller")}


def residual_out_and_y(out):
    """(residual_out, y) of a norm_scale_shift call with a residual."""
    return out[NSS_OUTPUTS["residual_out"]], out[NSS_OUTPUTS["y"]]


# ---------------------------------------------------------------- site constructors

ADALN_CHAIN = ("LayerNorm without affine (F.layer_norm), then * (1 + scale[:, None]) + shift[:, None], "
               "each op rounded to the activation dtype")


class ProcessorWrapper:
    """Base of the replacement attention processors: holds the replaced processor and the qk site.
    set_attention_backend and context parallelism set _attention_backend / _parallel_config on the
    installed processor; they are forwarded to the replaced one, so both always agree."""

    def __init__(self, original, site: MappedSite):
        self.original = original
        self.site = site

    @property
    def _attention_backend(self):
        return self.original._attention_backend

    @_attention_backend.setter
    def _attention_backend(self, value):
        self.original._attention_backend = value

    @property
    def _parallel_config(self):
        return self.original._parallel_config

    @_parallel_config.setter
    def _parallel_config(self, value):
        self.original._parallel_config = value


# ---------------------------------------------------------------- token ranges joined without a copy


def joint_rows(first, second):
    """torch.cat([first, second], dim=1) of two token ranges (a single block's two streams, or the
    halves of its norm or attention output). Where they are the two halves of one contiguous
    [B, S1 + S2, D] buffer (a previous step returned them as views of it), that buffer itself: the
    values the cat would copy, without the copy. The caller only reads it. Traced by torch.compile:
    the cat (inductor plans the copies itself)."""
    if not torch.compiler.is_compiling() and first.dim() == 3 and second.dim() == 3 and \
            first.dtype == second.dtype and first.device == second.device and \
            first.shape[0] == second.shape[0] and first.shape[2] == second.shape[2]:
        B, S1, D = first.shape
        S = S1 + second.shape[1]
        stride = (S * D, D, 1)
        if first.stride() == stride and second.stride() == stride and \
                first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr() and \
                second.storage_offset() == first.storage_offset() + S1 * D:
            return first.as_strided((B, S, D), stride, first.storage_offset())
    return torch.cat([first, second], dim=1)


# ---------------------------------------------------------------- activations into a cat buffer

# Input columns per output column of each activation op: swiglu reads [gate | up].
ACT_INPUT_COLUMNS = {"swiglu": 2, "gelu_tanh": 1}


def act_fit(op: str, x) -> str:
    """'' when the model's activation of x is the op's: swiglu's gate and up are the halves of an even
    width (the model's chunk(2) splits an odd one unevenly). Dtypes, shapes and strides are the
    matcher's: the first sight's explain says why it refuses a call."""
    if x.dim() < 1:
        return "x is a scalar"
    if x.shape[-1] % ACT_INPUT_COLUMNS[op]:
        return f"x's last dim {x.shape[-1]} is odd"
    return ""


def cat_act_mapping(op: str) -> Mapping:
    """torch.cat([attention output, act(mlp)], -1) before the single block's output projection: the
    op writes the [..., D + N] buffer the cat would allocate in one pass, the attention output (its
    prefix) into the columns [0, D) and act(mlp) into [D, D + N)."""

    def fit(attn_out, mlp) -> str:
        why = act_fit(op, mlp)
        if why:
            return why
        if attn_out.dtype != mlp.dtype or attn_out.device != mlp.device:
            return f"attention output {attn_out.dtype} on {attn_out.device}, mlp {mlp.dtype} on {mlp.device}"
        if attn_out.shape[:-1] != mlp.shape[:-1]:
            return f"attention output {tuple(attn_out.shape)} and mlp {tuple(mlp.shape)} differ in their rows"
        return ""

    def call(attn_out, mlp) -> OpCall:
        D, N = attn_out.shape[-1], mlp.shape[-1] // ACT_INPUT_COLUMNS[op]
        cat = attn_out.new_empty(*attn_out.shape[:-1], D + N)
        return OpCall(op, (mlp, cat, attn_out), {}, lambda _: cat)

    return Mapping(op=op, fit=fit, signature=lambda a, m: (str(m.device), m.dtype, a.shape[-1], m.shape[-1], m.stride(),
                                                        a.stride()),
                   call=call)


def adaln_site(name="adaln_modulate"):
    return MappedSite(name, mapping=layernorm_modulate_mapping(), chain=ADALN_CHAIN)


RESIDUAL_ADALN_CHAIN = ("residual + update * gate in the activation dtype (the product rounded, then the sum), then "
                        + ADALN_CHAIN + " of the new residual: (the new residual, the modulated norm)")


def _residual_adaln_fit(x, update, gate, scale, shift, norm) -> str:
    """norm_scale_shift's residual form takes the chain: 16-bit [B, S, D] x (the residual) and update
    of one shape, dtype and device, update with a unit last stride, gate [B, 1, D] and scale / shift
    [B, D] of x's dtype, an affine-free LayerNorm over D; strides and alignment are the matcher's."""
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 3:
        return f"x is {x.dtype} of rank {x.dim()} (16-bit [batch, tokens, dim])"
    if not isinstance(update, torch.Tensor) or update.shape != x.shape or update.dtype != x.dtype \
            or update.device != x.device or update.stride(-1) != 1:
        return "update is not x's shape and dtype on x's device with a unit last stride"
    B, _, D = x.shape
    if gate.dtype != x.dtype or tuple(gate.shape) != (B, 1, D) or gate.device != x.device:
        return f"gate is not {x.dtype} [batch, 1, dim] on x's device"
    for name, t in (("scale", scale), ("shift", shift)):
        if t.dtype != x.dtype or tuple(t.shape) != (B, D) or t.device != x.device:
            return f"{name} is not {x.dtype} [batch, dim] on x's device"
    if tuple(norm.normalized_shape) != (D,):
        return "the norm's shape is not x's last dim"
    return affine_free_layer_norm(norm)


# The gated residual and the next modulated LayerNorm in one pass (FLUX.1's, Qwen-Image's and
# HunyuanVideo's attention residual and norm2): norm_scale_shift's residual form with eager numerics,
# residual_out = rne(x + rne(update * gate)), y = rne(rne(rne(LayerNorm(residual_out)) * rne(1 + scale))
# + shift) (docs/norm_scale_shift.md §2): the two chains' roundings, one read of x and update.
RESIDUAL_ADALN = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "residual": "gated"}, fit=_residual_adaln_fit,
    # layouts as classes (not raw strides, which change with the token count): one first sight each
    signature=lambda x, update, gate, scale, shift, norm: (str(x.device), x.dtype, x.shape[-1], float(norm.eps),
                                                           x.is_contiguous(), update.is_contiguous()),
    call=lambda x, update, gate, scale, shift, norm: OpCall(
        "norm_scale_shift", (update, scale, shift), dict(residual=x, gate=gate, norm="layer", eps=float(norm.eps)),
        residual_out_and_y))


def _residual_adaln_fp8_call(x, update, gate, scale, shift, norm):
    q, s, r = NSS_OUTPUTS["fp8_rowwise"], NSS_OUTPUTS["fp8_scale"], NSS_OUTPUTS["residual_out"]
    return OpCall("norm_scale_shift", (update, scale, shift),
                  dict(residual=x, gate=gate, norm="layer", eps=float(norm.eps), rowwise_fp8=True),
                  lambda out: (out[r], out[q], out[s]))


# RESIDUAL_ADALN whose modulated norm feeds FP8 linears only (issue 43, fp8.py): the same pass with
# the per-token e4m3 of y and its scales instead of y (rowwise_fp8: y never written), the new residual
# as before; the same fit and signature.
RESIDUAL_ADALN_FP8 = Mapping(
    op="norm_scale_shift", options={"norm": "layer", "residual": "gated", "rowwise_fp8": True},
    fit=RESIDUAL_ADALN.fit, signature=RESIDUAL_ADALN.signature, call=_residual_adaln_fp8_call)


def residual_adaln_site(name="adaln_modulate (residual + norm2)"):
    """The fused gated residual + modulated norm2 of a double block: it serves two places, the
    gated_residual one and the adaln_modulate one (fuse), which take it back where it does not run."""
    return MappedSite(name, mapping=RESIDUAL_ADALN, chain=RESIDUAL_ADALN_CHAIN,
                      classes=("adaln_modulate", "gated_residual"), outputs=2)


def gated_residual_site(name="gated_residual", chain="residual + update * gate in the activation dtype "
                        "(the product rounded, then the sum)"):
    return MappedSite(name, mapping=residual_gate_add_mapping(), chain=chain)


def qk_site(name, attentions, *, chain, note="", probe=False, probe_reason=""):
    """The per-head QK norm + RoPE site: qknorm_rope with the rounding the models' norm modules
    do, or op None with the reason. attentions: (path, attention module, [(q norm, k norm)
    attribute names per stream]). probe_reason: a part of the chain qknorm_rope does not
    document (the site then maps only with enable(probe=True), the first sight deciding)."""
    roundings, whys = set(), []
    for path, attn, streams in attentions:
        for nq, nk in streams:
            for attr in (nq, nk):
                rounding, why = rms_norm_rounding(getattr(attn, attr, None))
                if rounding is None:
                    whys.append(f"{path}.{attr}: {why}")
                roundings.add(rounding)
    choices = op_options("qknorm_rope").get("norm_weight_rounding")
    rounding = next(iter(roundings)) if len(roundings) == 1 else None
    if not roundings:
        why = "the model has no attention of this kind"
    elif whys:
        why = "; ".join(sorted(set(whys))[:3])
    elif len(roundings) > 1:
        why = "the model mixes norms that round once and twice"
    elif choices is None and rounding == "twice":
        why = ("the model's norm is diffusers' RMSNorm, which rounds twice ((x * rsqrt(mean(x^2) + eps))"
               ".to(dtype) * weight); qknorm_rope in this build rounds once (F.rms_norm) and has no "
               "norm_weight_rounding option")
    elif choices is not None and rounding not in choices:
        why = f"qknorm_rope's norm_weight_rounding has no choice {rounding!r} ({choices})"
    elif probe_reason and not probe:
        why = probe_reason + " (enable(..., probe=True) tries it under the first-sight check)"
    else:
        why = ""
    if why:
        return MappedSite(name, mapping=Mapping(why=why), chain=chain, note=note, outputs=2)
    if probe_reason:
        note = (note + "; " if note else "") + "probed: " + probe_reason
    options = {} if choices is None else {"norm_weight_rounding": rounding}
    return MappedSite(name, mapping=qk_norm_rope_mapping(rounding, options), chain=chain, note=note, outputs=2)


def cross_head_qk_site(name, rope, chain):
    """The cross-head QK norm (+ RoPE) site of Wan / LTX-2: cross_head_qknorm_rope, where this build
    has it."""
    if not op_options("cross_head_qknorm_rope"):
        mapping = Mapping(why="this build of ditops has no cross_head_qknorm_rope op")
    else:
        mapping = cross_head_qk_mapping(rope)
    return MappedSite(name, mapping=mapping, chain=chain, outputs=2)


# ---------------------------------------------------------------- the chains at call time

def qk_chain(q, k, norm_q, norm_k, freqs, layout, start, rows, identity):
    """The model's per-head QK norm + RoPE (the qk site's chain, its arguments those of
    qk_norm_rope_mapping's call)."""
    if identity:  # the last `identity` tokens normalized, not rotated; freqs None: none rotated
        nq, nk = norm_q(q), norm_k(k)
        if freqs is None:
            return nq, nk
        return (torch.cat([apply_rotary_emb(nq[:, :-identity], freqs, sequence_dim=1), nq[:, -identity:]], dim=1),
                torch.cat([apply_rotary_emb(nk[:, :-identity], freqs, sequence_dim=1), nk[:, -identity:]], dim=1))
    if layout == "full_width":
        tokens = q.shape[1]
        table = (freqs[0][start:start + tokens], freqs[1][start:start + tokens])
        return (apply_rotary_emb(norm_q(q), table, sequence_dim=1),
                apply_rotary_emb(norm_k(k), table, sequence_dim=1))
    return (apply_rotary_emb_qwen(norm_q(q), freqs, use_real=False),
            apply_rotary_emb_qwen(norm_k(k), freqs, use_real=False))


def qk(site: MappedSite, q, k, norm_q, norm_k, freqs, start: int, layout="full_width", rows=None):
    """(q, k) normalized per head and rotated with rows [start, start + tokens) of freqs (rows:
    how many the model's chain expects, default start + tokens).

    full_width: freqs = (cos, sin) [rows, head_dim] float32, diffusers' apply_rotary_emb with
    interleaved pairs; complex: freqs complex64 [tokens, head_dim / 2], Qwen-Image's
    apply_rotary_emb_qwen(use_real=False)."""
    return site(qk_chain, q, k, norm_q, norm_k, freqs, layout, start, rows, 0)


def qk_with_unrotated_tail(site: MappedSite, q, k, norm_q, norm_k, freqs, identity: int):
    """(q, k) normalized per head over all their tokens, the first ones rotated with freqs (cos,
    sin) [tokens - identity, head_dim] and the last `identity` left unrotated (HunyuanVideo's
    single blocks: latent then text tokens); freqs None: no token rotated (its text stream)."""
    return site(qk_chain, q, k, norm_q, norm_k, freqs, "full_width", 0, None, identity)


def modulate_chain(x, scale, shift, norm):
    """The model's adaLN modulation: norm(x) * (1 + scale[:, None]) + shift[:, None]."""
    return norm(x) * (1 + scale[:, None]) + shift[:, None]


def modulate(site: MappedSite, x, scale, shift, norm):
    """norm(x) * (1 + scale[:, None]) + shift[:, None]; scale, shift [B, D]."""
    return site(modulate_chain, x, scale, shift, norm)


def residual_modulate_chain(x, update, gate, scale, shift, norm):
    """The model's gated residual, then its modulated norm of the new residual (the fused site's
    chain): (new residual, modulated norm)."""
    x = gated_chain(x, update, gate)
    return x, modulate_chain(x, scale, shift, norm)


def residual_modulate(site: MappedSite, x, update, gate, scale, shift, norm):
    """(x + update * gate, norm(that) * (1 + scale[:, None]) + shift[:, None]); gate [B, 1, D],
    scale and shift [B, D]."""
    return site(residual_modulate_chain, x, update, gate, scale, shift, norm)


def gated_chain(residual, update, gate):
    """The model's gated residual (the site's chain)."""
    return residual + update * gate


def gated(site: MappedSite, residual, update, gate):
    """residual + update * gate."""
    return site(gated_chain, residual, update, gate)


# ---------------------------------------------------------------- shared module patches

def double_block_places(plan, path, block, adaln, residual, residual_norm) -> None:
    """A FLUX-style double block's adaLN and residual places (FLUX.1, HunyuanVideo): its norm1 and
    norm1_context modules through the adaLN site, each stream's attention residual and norm2 through
    the fused site (the gated-residual and adaLN places where it does not run), the feed-forwards'
    residuals."""
    patch_adaln_module(plan, adaln, f"{path}.norm1", block.norm1)
    patch_adaln_module(plan, adaln, f"{path}.norm1_context", block.norm1_context)
    at = plan.prefix + path
    for norm2, attn in (("norm2", "attn"), ("norm2_context", "context attn")):
        residual_norm.fuse(f"{at}.{norm2} (+ {attn} residual)", [(residual, f"{at} ({attn})"),
                                                                  (adaln, f"{at}.{norm2}")])
    residual.places += [f"{at} ({n})" for n in ("ff", "context ff")]


def patch_processor(plan, site, path, attn, default_cls, ours_cls, streams):
    """Count the attention's QK streams as places; install ours_cls when the site's op is mapped
    and the attention runs the model's default processor (an IP-adapter or user processor is
    left alone)."""
    site.places += [f"{plan.prefix}{path} ({s})" for s in streams]
    if site.op is None:
        return
    if type(attn.processor) is not default_cls:
        site.skipped.append((plan.prefix + path, f"processor is {type(attn.processor).__name__}, "
                                                 f"not {default_cls.__name__}"))
        return
    plan.patch_processor(f"{path}.processor", attn, ours_cls(attn.processor, site))


def patch_cross_head_processor(plan, site, path, attn, processors, stream, widths):
    """Count the attention as a place of the cross-head QK site; install ours where the site's op is
    mapped, the attention runs one of the model's processors (processors: its class -> ours) and
    its QK norms are what the op reproduces (torch.nn.RMSNorm over the whole projected row of
    widths = (q's, k's), with an eps)."""
    site.places.append(f"{plan.prefix}{path} ({stream})")
    if site.op is None:
        return
    ours = processors.get(type(attn.processor))
    if ours is None:
        site.skipped.append((plan.prefix + path, f"processor is {type(attn.processor).__name__}, not "
                                                 f"{' or '.join(c.__name__ for c in processors)}"))
        return
    why = cross_head_norm(attn.norm_q, widths[0]) or cross_head_norm(attn.norm_k, widths[1])
    if why:
        site.skipped.append((plan.prefix + path, why))
        return
    plan.patch_processor(f"{path}.processor", attn, ours(attn.processor, site))


def _adaln_zero_forward(site):
    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        return modulate(site, x, scale_msa, shift_msa, self.norm), gate_msa, shift_mlp, scale_mlp, gate_mlp
    return forward


def _adaln_zero_single_forward(site):
    def forward(self, x, emb=None):
        shift_msa, scale_msa, gate_msa = self.linear(self.silu(emb)).chunk(3, dim=1)
        return modulate(site, x, scale_msa, shift_msa, self.norm), gate_msa
    return forward


def _adaln_continuous_forward(site):
    def forward(self, x, conditioning_embedding):
        # the embedding is cast to x's dtype before the projection, as the module does
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return modulate(site, x, scale, shift, self.norm)
    return forward


def patch_adaln_module(plan, site, path, module):
    """AdaLayerNormZero / AdaLayerNormZeroSingle / AdaLayerNormContinuous with an affine-free
    torch LayerNorm: the modulation through the site."""
    site.places.append(plan.prefix + path)
    if site.op is None:
        return
    kind = type(module)
    why = affine_free_layer_norm(getattr(module, "norm", None))
    if kind is AdaLayerNormZero:
        if module.emb is not None:
            why = why or "AdaLayerNormZero with its own timestep embedding"
        forward = _adaln_zero_forward(site)
    elif kind is AdaLayerNormZeroSingle:
        forward = _adaln_zero_single_forward(site)
    elif kind is AdaLayerNormContinuous:
        forward = _adaln_continuous_forward(site)
    else:
        why = f"{kind.__name__} is not a diffusers adaLN module ditops knows"
    if why:
        site.skipped.append((plan.prefix + path, why))
        return
    plan.patch_forward(path, module, forward)
