"""Wan (diffusers WanTransformer3DModel), as diffusers 0.42 writes it.

Sites and the chains they reproduce (docs/diffusers.md has the table):
  * QK norm + RoPE: Wan normalizes q and k across all heads (torch.nn.RMSNorm over
    heads * head_dim, before the heads are split). qknorm_rope normalizes per head, so the model's
    code runs there until the cross-head op exists.
  * adaLN: norm1 and norm3 are FP32LayerNorm on x.float(), the modulation is float32
    ((norm(x.float()) * (1 + scale) + shift).type_as(x), scale/shift float32 [B, 1, D] or, for
    Wan 2.2 TI2V, per token): norm_scale_shift on the float32 copy (eager numerics, LayerNorm
    without affine), then the model's one rounding. norm_scale_shift's float32 rows stop at
    D = 4096: Wan 1.3B (1536) fits, the 14B models (5120) run the model's code for that call.
  * gated residuals: (x.float() + update * gate).type_as(x) mixes a 16-bit update with a float32
    gate and sums in float32; residual_gate_add takes one dtype, and float32 copies of x and the
    update would cost more than the fusion saves, so the model's code runs there.
"""
from __future__ import annotations

from diffusers.models.transformers.transformer_wan import WanTransformerBlock

from ._patching import Plan
from ._sites import Fp32NormScaleShiftSite, QkNormRopeSite, GatedResidualSite

MODEL_CLASS = "WanTransformer3DModel"
DIFFUSERS_MODULE = "diffusers.models.transformers.transformer_wan"

FP32_ADALN_CHAIN = ("FP32LayerNorm(x.float()) (no affine) * (1 + scale) + shift, all float32, then "
                    ".type_as(x)")


def block_forward(adaln: Fp32NormScaleShiftSite):
    """WanTransformerBlock.forward with the two float32 adaLN modulations through the site."""

    def modulate(x, norm, scale, shift):
        return adaln(x, scale, shift, norm, lambda: (norm(x.float()) * (1 + scale) + shift).type_as(x))

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        if temb.ndim == 4:  # Wan 2.2 TI2V: [batch, tokens, 6, dim]
            chunks = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
            chunks = [c.squeeze(2) for c in chunks]
        else:
            chunks = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = chunks

        norm_hidden = modulate(hidden_states, self.norm1, scale_msa, shift_msa)
        attn_output = self.attn1(norm_hidden, None, None, rotary_emb)
        hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)

        norm_hidden = self.norm2(hidden_states.float()).type_as(hidden_states)
        hidden_states = hidden_states + self.attn2(norm_hidden, encoder_hidden_states, None, None)

        norm_hidden = modulate(hidden_states, self.norm3, c_scale_msa, c_shift_msa)
        ff_output = self.ffn(norm_hidden)
        return (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)

    return forward


def plan(model, plan: Plan, probe: bool = False) -> None:
    qk = plan.add_site(QkNormRopeSite(
        "qk_norm_rope (cross-head)", op=None,
        chain="torch.nn.RMSNorm over heads * head_dim (across heads), then the heads split, then "
              "RoPE (x1 * cos - x2 * sin, x1 * sin + x2 * cos in float32, one rounding)",
        why="Wan's QK norm spans all heads; qknorm_rope normalizes per head and the cross-head "
            "op is not in ditops yet"))
    adaln = plan.add_site(Fp32NormScaleShiftSite("adaln_modulate", op="norm_scale_shift",
                                                 chain=FP32_ADALN_CHAIN,
                                                 options={"norm": "layer", "numerics": "eager"}))
    residual = plan.add_site(GatedResidualSite(
        "gated_residual", op=None,
        chain="(x.float() + update * gate).type_as(x): 16-bit update times a float32 gate, float32 sum",
        why="mixed dtypes (residual_gate_add takes one dtype; float32 copies of x and the update "
            "would cost more than the fusion saves)"))
    for i, block in enumerate(model.blocks):
        path = f"blocks.{i}"
        qk.places.append(plan.prefix + f"{path}.attn1")
        residual.places += [plan.prefix + f"{path} ({n})" for n in ("attn1", "ffn")]
        adaln.places += [plan.prefix + f"{path}.{n}" for n in ("norm1", "norm3")]
        if type(block) is not WanTransformerBlock:
            plan.skip(path, f"{type(block).__name__} is not WanTransformerBlock")
            continue
        plan.patch_forward(path, block, block_forward(adaln))
