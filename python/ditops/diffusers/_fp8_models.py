"""Which producer feeds which FP8 linear, per model (issue 43; fp8.py has the recipe and the sites).

Every block linear is an Fp8Linear that quantizes a bf16 input itself (the "fp8_quant (linear
input)" site). Where one activation feeds several linears, or a fused producer can write it in
FP8 directly, the mappings below make it a Rowwise pair once and pass the pair on:

  * every model: a diffusers FeedForward with GELU(tanh) and an FP8 down projection: the FF-up
    output's GELU quantized in one pass ("fp8_quant (gelu ff)") into the down projection;
  * FLUX.1: norm1 -> to_q/to_k/to_v, norm1_context -> add_q/k/v_proj, the single blocks' norm ->
    proj_mlp + to_q/to_k/to_v: the adaLN LayerNorm-modulate quantized per token ("fp8_quant
    (adaLN)"); each stream's attention residual and norm2 -> ff / ff_context in one pass, the new
    residual and the norm's e4m3 ("fp8_quant (residual + adaLN)": norm_scale_shift's residual form
    with rowwise_fp8=True, y never written); the single blocks' cat(attn, gelu(mlp)) -> proj_out
    ("fp8_quant (cat attn + gelu mlp)");
  * Qwen-Image: the norm1 modulations -> the image / text q, k, v, the attention residuals and norm2
    modulations -> the two MLPs (as FLUX.1's norm2);
  * HunyuanVideo: the double blocks as FLUX.1's; the single blocks' cat -> proj_out (their norm
    output is sliced and re-joined by the attention processor: each linear quantizes it);
  * Wan: norm1 -> attn1's q, k, v and norm3 -> ffn: the float32 adaLN chain quantized per token in
    the same pass ("fp8_quant (adaLN)": norm_scale_shift(numerics="float32", rowwise_fp8=True), its
    bf16 y never written; where that does not fit, the adaLN site's value then the recipe);
  * FLUX.2: the inline adaLN modulations quantized per token ("fp8_quant (adaLN)"): norm1 ->
    to_q/to_k/to_v (or to_qkv), norm1_context -> add_q/k/v_proj (or to_added_qkv), norm2 -> ff,
    norm2_context -> ff_context, the single blocks' norm -> to_qkv_mlp_proj; the feed-forwards'
    SwiGLU of linear_in's output quantized in one pass into linear_out ("fp8_quant (swiglu ff)"),
    the single blocks' cat(attn, swiglu(mlp)) -> to_out ("fp8_quant (cat attn + swiglu mlp)": the
    MLP columns read where to_qkv_mlp_proj wrote them);
  * LTX-2: the FeedForwards and each linear's own quantization.

A pair goes only where every consumer is an Fp8Linear and the attention runs a processor whose
code passes it to the projections alone (the model's default processor, or ditops's replacement
of it); elsewhere the bf16 value flows and each Fp8Linear quantizes it. The forwards reuse the
model modules' own block forwards with the adaLN site swapped for its FP8 one where they can.
"""
from __future__ import annotations

import torch

from ditops import Error

from . import _common
from ._sites import affine_free_layer_norm


def _is_gelu_tanh(module) -> bool:
    from diffusers.models.activations import GELU
    if type(module) is GELU:
        return module.approximate == "tanh" and isinstance(getattr(module, "proj", None), torch.nn.Linear)
    return type(module) is torch.nn.GELU and module.approximate == "tanh"


def feed_forward(gelu_site):
    """diffusers FeedForward.forward with GELU(tanh): the up projection, then its GELU quantized
    in one pass into the FP8 down projection (dropout is the identity at inference)."""

    def forward(self, hidden_states, *args, **kwargs):
        h = gelu_site(self.net[0].proj(hidden_states))
        for module in self.net[1:]:
            if isinstance(module, torch.nn.Dropout):
                if module.training and module.p > 0:
                    raise Error("ditops.diffusers FP8: a FeedForward in training mode with dropout; the FP8 path is "
                                "for inference (model.eval())")
                continue
            h = module(h)
        return h

    return forward


def map_feed_forwards(ctx) -> None:
    """Patch every diffusers FeedForward of the blocks whose activation is GELU(tanh) and whose
    down projection is FP8; ctx.takes_pair(ff) then says whether it takes a Rowwise input."""
    from diffusers.models.attention import FeedForward
    from .fp8 import BLOCK_LISTS
    ctx.ff_patched = set()
    ctx.takes_pair = lambda ff: id(ff) in ctx.ff_patched and ctx.fp8(ff.net[0].proj)
    for list_name in BLOCK_LISTS[type(ctx.model).__name__]:
        blocks = getattr(ctx.model, list_name, None)
        if blocks is None:
            continue
        for path, module in blocks.named_modules(prefix=list_name):
            if type(module) is not FeedForward:
                continue
            net = list(module.net)
            rest = net[1:]
            linears = [m for m in rest if not isinstance(m, torch.nn.Dropout)]
            if not net or not _is_gelu_tanh(net[0]) or len(linears) != 1 or not ctx.fp8(linears[0]):
                continue
            ctx.patch_forward(path, module, feed_forward(ctx.gelu))
            ctx.ff_patched.add(id(module))
            ctx.gelu.places.append(ctx.plan.prefix + path)


def _adaln_to_pair(ctx, site, path, module, consumers) -> None:
    """Patch an AdaLayerNormZero / AdaLayerNormZeroSingle module to return its modulated output as
    a Rowwise pair (the FP8 adaLN site) where every consumer is FP8."""
    from diffusers.models.normalization import AdaLayerNormZero, AdaLayerNormZeroSingle
    if not consumers or not ctx.fp8(*consumers) or affine_free_layer_norm(getattr(module, "norm", None)):
        return
    if type(module) is AdaLayerNormZero and module.emb is None:
        forward = _common._adaln_zero_forward(site)
    elif type(module) is AdaLayerNormZeroSingle:
        forward = _common._adaln_zero_single_forward(site)
    else:
        return
    ctx.patch_forward(path, module, forward)
    site.places.append(ctx.plan.prefix + path)


def _norm2_places(ctx, pair, at, *norms):
    """A double block whose FP8 forward feeds each stream's modulated norm2 to an FP8 feed-forward:
    where the bf16 fused residual + norm2 site serves a stream's place, that place moves to its FP8
    form ("fp8_quant (residual + adaLN)": the new residual and the norm's Rowwise pair in one pass);
    elsewhere (the FP8 form does not run: producers off, an older build) the place goes back to the
    gated residual and the adaLN pair. norms: (norm2 attribute, attention stream) per stream. Returns
    the FP8 fused site for the block forward, or None where no place of the block moved to it."""
    bf16 = ctx.site("adaln_modulate (residual + norm2)")
    fused, residual = ctx.residual_adaln(bf16), ctx.site("gated_residual")
    moved = False
    for norm2, attn in norms:
        place = f"{at}.{norm2} (+ {attn} residual)"
        if place in bf16.places and fused.active:
            bf16.give(place, fused, [(residual, f"{at} ({attn})"), (pair, f"{at}.{norm2}")])
            moved = True
            continue
        if place in bf16.places:
            bf16.hand_back(place)
        pair.places.append(f"{at}.{norm2}")
    return fused if moved else None


def _projections(attn):
    """(image stream projections, text stream projections) the attention applies to its inputs."""
    if getattr(attn, "fused_projections", False):
        return [getattr(attn, "to_qkv", None)], (
            [getattr(attn, "to_added_qkv", None)] if getattr(attn, "added_kv_proj_dim", None) is not None else [])
    image = [attn.to_q, attn.to_k, attn.to_v]
    text = [getattr(attn, n, None) for n in ("add_q_proj", "add_k_proj", "add_v_proj")]
    return image, (text if all(m is not None for m in text) else [])


# ---------------------------------------------------------------- FLUX.1


def _cat_quant(site):
    """The single blocks' cat(block, attention output, proj_mlp output) of flux.single_block_forward:
    cat(attention output, GELU(tanh) of proj_mlp) quantized in one pass for the FP8 proj_out."""
    return lambda block, attn_output, mlp_up: site(attn_output, mlp_up)


def flux(ctx) -> None:
    from diffusers.models.transformers.transformer_flux import (FluxAttnProcessor, FluxSingleTransformerBlock,
                                                                FluxTransformerBlock)
    from . import flux as model_code
    adaln, residual = ctx.site("adaln_modulate"), ctx.site("gated_residual")
    pair = ctx.adaln(adaln)
    prefix = ctx.plan.prefix
    for i, block in enumerate(ctx.model.transformer_blocks):
        path = f"transformer_blocks.{i}"
        if type(block) is not FluxTransformerBlock:
            continue
        if type(block.attn.processor) is FluxAttnProcessor:
            image, text = _projections(block.attn)
            _adaln_to_pair(ctx, pair, f"{path}.norm1", block.norm1, image)
            _adaln_to_pair(ctx, pair, f"{path}.norm1_context", block.norm1_context, text)
        if ctx.takes_pair(block.ff) and ctx.takes_pair(block.ff_context):
            fused = _norm2_places(ctx, pair, f"{prefix}{path}", ("norm2", "attn"), ("norm2_context", "context attn"))
            ctx.patch_forward(path, block, model_code.double_block_forward(pair, residual, fused))
    for i, block in enumerate(ctx.model.single_transformer_blocks):
        path = f"single_transformer_blocks.{i}"
        if type(block) is not FluxSingleTransformerBlock or not _is_gelu_tanh(block.act_mlp):
            continue
        if type(block.attn.processor) is FluxAttnProcessor:
            image, _ = _projections(block.attn)
            _adaln_to_pair(ctx, pair, f"{path}.norm", block.norm, image + [block.proj_mlp])
        if ctx.fp8(block.proj_out):
            ctx.patch_forward(path, block, model_code.single_block_forward(residual, _cat_quant(ctx.cat_gelu)))
            ctx.cat_gelu.places.append(f"{prefix}{path}.proj_out")
            _moved(ctx.site("gelu_tanh (single block cat)"), f"{prefix}{path} (cat attn + gelu mlp)")


# ---------------------------------------------------------------- Qwen-Image


def qwen(ctx) -> None:
    from diffusers.models.transformers.transformer_qwenimage import (QwenDoubleStreamAttnProcessor2_0,
                                                                     QwenImageTransformerBlock)
    from . import qwenimage as model_code
    adaln, residual = ctx.site("adaln_modulate"), ctx.site("gated_residual")
    pair = ctx.adaln(adaln)
    for i, block in enumerate(ctx.model.transformer_blocks):
        path = f"transformer_blocks.{i}"
        if type(block) is not QwenImageTransformerBlock or type(block.attn.processor) is not \
                QwenDoubleStreamAttnProcessor2_0:
            continue
        image, text = _projections(block.attn)
        if text and ctx.fp8(*image, *text) and ctx.takes_pair(block.img_mlp) and ctx.takes_pair(block.txt_mlp):
            at = ctx.plan.prefix + path
            fused = _norm2_places(ctx, pair, at, ("img_norm2", "img attn"), ("txt_norm2", "txt attn"))
            ctx.patch_forward(path, block, model_code.block_forward(pair, residual, fused))
            pair.places += [f"{at}.{n}" for n in ("img_norm1", "txt_norm1")]


# ---------------------------------------------------------------- HunyuanVideo


def hunyuan(ctx) -> None:
    from diffusers.models.transformers.transformer_hunyuan_video import (
        HunyuanVideoAttnProcessor2_0, HunyuanVideoSingleTransformerBlock, HunyuanVideoTransformerBlock)
    from . import hunyuan_video as model_code
    adaln, residual = ctx.site("adaln_modulate"), ctx.site("gated_residual")
    pair = ctx.adaln(adaln)
    prefix = ctx.plan.prefix
    for i, block in enumerate(ctx.model.transformer_blocks):
        path = f"transformer_blocks.{i}"
        if type(block) is not HunyuanVideoTransformerBlock:
            continue
        if type(block.attn.processor) is HunyuanVideoAttnProcessor2_0:
            image, text = _projections(block.attn)
            _adaln_to_pair(ctx, pair, f"{path}.norm1", block.norm1, image)
            _adaln_to_pair(ctx, pair, f"{path}.norm1_context", block.norm1_context, text)
        if ctx.takes_pair(block.ff) and ctx.takes_pair(block.ff_context):
            fused = _norm2_places(ctx, pair, f"{prefix}{path}", ("norm2", "attn"), ("norm2_context", "context attn"))
            ctx.patch_forward(path, block, model_code.double_block_forward(pair, residual, fused))
    for i, block in enumerate(ctx.model.single_transformer_blocks):
        path = f"single_transformer_blocks.{i}"
        if type(block) is HunyuanVideoSingleTransformerBlock and _is_gelu_tanh(block.act_mlp) and \
                ctx.fp8(block.proj_out):
            ctx.patch_forward(path, block, model_code.single_block_forward(residual, _cat_quant(ctx.cat_gelu)))
            ctx.cat_gelu.places.append(f"{prefix}{path}.proj_out")
            _moved(ctx.site("gelu_tanh (single block cat)"), f"{prefix}{path} (cat attn + gelu mlp)")


# ---------------------------------------------------------------- Wan


def wan(ctx) -> None:
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor, WanTransformerBlock
    from . import wan as model_code
    adaln, norm2, residual = (ctx.site("adaln_modulate"), ctx.site("adaln_modulate (norm2)"),
                              ctx.site("gated_residual"))
    residual_norm2, add_norm3 = (ctx.site("adaln_modulate (residual + norm2)"),
                                 ctx.site("adaln_modulate (residual + norm3)"))
    pair = None
    for i, block in enumerate(ctx.model.blocks):
        path = f"blocks.{i}"
        if type(block) is not WanTransformerBlock or type(block.attn1.processor) is not WanAttnProcessor:
            continue
        image, _ = _projections(block.attn1)
        if ctx.fp8(*image) and ctx.takes_pair(block.ffn):
            pair = pair or ctx.mapped_fp8(adaln, model_code.fp8_adaln_mapping())
            # norm3 feeds the FP8 ffn through the pair: the residual add before it stays the model's,
            # and the bf16 adaLN site is the pair's fallback there (add_norm3 does not run)
            ctx.patch_forward(path, block, model_code.block_forward(pair, norm2, residual, residual_norm2))
            pair.places += [f"{ctx.plan.prefix}{path}.{n}" for n in ("norm1", "norm3")]
            fused = f"{ctx.plan.prefix}{path}.norm3 (+ attn2 residual)"
            if fused in add_norm3.places:
                add_norm3.hand_back(fused)


# ---------------------------------------------------------------- FLUX.2


def swiglu_feed_forward(swiglu_site):
    """Flux2FeedForward.forward with linear_out fed by the SwiGLU of linear_in's output, quantized
    in the same pass (linear_in takes the bf16 input or the adaLN pair as it is)."""

    def forward(self, x):
        return self.linear_out(swiglu_site(self.linear_in(x)))

    return forward


def _moved(site, place: str) -> None:
    """place leaves the bf16 site: an FP8 producer serves it now."""
    if place in site.places:
        site.places.remove(place)


def flux2(ctx) -> None:
    from diffusers.models.transformers.transformer_flux2 import (Flux2AttnProcessor, Flux2FeedForward,
                                                                 Flux2ParallelSelfAttnProcessor,
                                                                 Flux2SingleTransformerBlock, Flux2SwiGLU,
                                                                 Flux2TransformerBlock)
    from . import flux2 as model_code
    adaln, residual = ctx.site("adaln_modulate"), ctx.site("gated_residual")
    bf16_ff, bf16_cat = ctx.site("swiglu (ff)"), ctx.site("swiglu (single block cat)")
    pair = ctx.adaln(adaln)
    prefix = ctx.plan.prefix
    for i, block in enumerate(ctx.model.transformer_blocks):
        path = f"transformer_blocks.{i}"
        if type(block) is not Flux2TransformerBlock:
            continue
        for name in ("ff", "ff_context"):  # SwiGLU quantized into linear_out where that is FP8
            ff = getattr(block, name)
            if type(ff) is Flux2FeedForward and type(ff.act_fn) is Flux2SwiGLU and ctx.fp8(ff.linear_out):
                ctx.patch_forward(f"{path}.{name}", ff, swiglu_feed_forward(ctx.swiglu))
                ctx.swiglu.places.append(f"{prefix}{path}.{name}.linear_out")
                _moved(bf16_ff, f"{prefix}{path}.{name}.act_fn")  # the producer replaces the bf16 act
        image, text = _projections(block.attn)
        # the pair needs every consumer FP8: all the projections of both streams, or both FFs' linear_in
        attn_pair = type(block.attn.processor) is Flux2AttnProcessor and bool(text) and ctx.fp8(*image, *text)
        ff_pair = ctx.fp8(block.ff.linear_in, block.ff_context.linear_in)
        if not (attn_pair or ff_pair):
            continue
        # each stream's attention residual + norm2: the FP8 fused site where the FFs take the pair,
        # else the bf16 one the model plan put there (its places stay)
        fused = (_norm2_places(ctx, pair, f"{prefix}{path}", ("norm2", "attn"), ("norm2_context", "context attn"))
                 if ff_pair else ctx.site("adaln_modulate (residual + norm2)"))
        ctx.patch_forward(path, block, model_code.double_block_forward(pair if attn_pair else adaln, residual,
                                                                       pair if ff_pair else adaln, fused))
        if attn_pair:
            pair.places += [f"{prefix}{path}.{n}" for n in ("norm1", "norm1_context")]
    for i, block in enumerate(ctx.model.single_transformer_blocks):
        path = f"single_transformer_blocks.{i}"
        attn = block.attn
        if type(block) is not Flux2SingleTransformerBlock or type(attn.processor) is not Flux2ParallelSelfAttnProcessor:
            continue
        if type(attn.mlp_act_fn) is Flux2SwiGLU and ctx.fp8(attn.to_out):
            # cat(attn, swiglu(mlp)) quantized into to_out: ditops's processor with the site
            processor = model_code.Flux2ParallelSelfAttnProcessorDitops(attn.processor, ctx.site("qk_norm_rope"),
                                                                        cat_quant=ctx.cat_swiglu)
            ctx.plan.patch_processor(f"{path}.attn.processor", attn, processor)
            ctx.cat_swiglu.places.append(f"{prefix}{path}.attn.to_out")
            _moved(bf16_cat, f"{prefix}{path}.attn (cat attn + swiglu mlp)")
        if ctx.fp8(attn.to_qkv_mlp_proj):
            ctx.patch_forward(path, block, model_code.single_block_forward(pair, residual))
            pair.places.append(f"{prefix}{path}.norm")


MAPPINGS = {
    "FluxTransformer2DModel": flux,
    "Flux2Transformer2DModel": flux2,
    "QwenImageTransformer2DModel": qwen,
    "HunyuanVideoTransformer3DModel": hunyuan,
    "WanTransformer3DModel": wan,
}
