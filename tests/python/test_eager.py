"""ditops.eager's norm chains on the CPU: which qknorm_rope options have an eager oracle, and that
the diffusers chains are written op for op as diffusers writes them (compared with diffusers' own
modules where diffusers is installed). Bit-exactness against the fused kernel is a CUDA matter
(test_ops_eager.py)."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (ditops.eager's chains are torch code)")
from ditops import eager  # noqa: E402


def _qk_inputs(D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, H, R = 5, 3, D
    x = {
        "q": torch.randn(T, H, D, generator=g).to(dtype),
        "k": torch.randn(T, H, D, generator=g).to(dtype),
        "q_weight": (1 + 0.5 * torch.randn(D, generator=g)).to(dtype),
        "k_weight": (1 + 0.5 * torch.randn(D, generator=g)).to(dtype),
        "cos_sin_cache": torch.randn(8, R, generator=g),
        "positions": torch.arange(T),
    }
    return x, {"rope_dim": str(R), "is_neox": "false", "eps": "1e-6"}


@pytest.mark.parametrize("options,has_oracle", [
    ({}, True),
    ({"norm_order": "aten_mean", "norm_weight_rounding": "twice"}, True),
    ({"norm_order": "aten_mean", "norm_weight_rounding": "once"}, True),
    ({"norm_order": "aten", "norm_weight_rounding": "twice"}, False),
    ({"norm_order": "warp"}, False),
    ({"rounding": "fp32"}, False),
])
def test_qknorm_rope_oracle_exists_only_for_model_chains(options, has_oracle):
    x, o = _qk_inputs(64, torch.bfloat16)
    out = eager.oracle_outputs("qknorm_rope", x, {**o, **options})
    assert (out is not None) == has_oracle
    if has_oracle:
        assert out["q"].shape == x["q"].shape and out["q"].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weight_rounding_twice_differs_from_once_on_random_weights(dtype):
    x, o = _qk_inputs(128, dtype, seed=1)
    once = eager.oracle_outputs("qknorm_rope", x, {**o, "norm_order": "aten_mean"})
    twice = eager.oracle_outputs("qknorm_rope", x, {**o, "norm_order": "aten_mean",
                                                    "norm_weight_rounding": "twice"})
    assert not torch.equal(once["q"], twice["q"])


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mean_chains_are_diffusers_modules(D, dtype):
    normalization = pytest.importorskip("diffusers.models.normalization", reason="diffusers is not installed")
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, 33, 3, D, generator=g).to(dtype)  # [B, S, H, D] as the processors pass it
    weight = (1 + 0.5 * torch.randn(D, generator=g)).to(dtype)
    eps = 1e-6
    rms = normalization.RMSNorm(D, eps=eps).to(dtype)
    mochi = normalization.MochiRMSNorm(D, eps=eps).to(dtype)
    with torch.no_grad():
        rms.weight.copy_(weight)
        mochi.weight.copy_(weight)
        assert torch.equal(rms(x), eager.rms_norm_mean_eager(x, weight, eps, round_twice=True))
        assert torch.equal(mochi(x), eager.rms_norm_mean_eager(x, weight, eps, round_twice=False))


def _wan_inputs(B, S, D, per_token, seed=0):
    """bf16 hidden states and updates; the f32 modulation as Wan's block builds it: chunks of
    [B, 6, D] (14B) or of [B, S, 6, D] squeezed (2.2 TI2V)."""
    g = torch.Generator().manual_seed(seed)
    hidden, update = (torch.randn(B, S, D, generator=g).to(torch.bfloat16) for _ in range(2))
    if per_token:
        chunks = [c.squeeze(2) for c in (0.3 * torch.randn(B, S, 6, D, generator=g)).chunk(6, dim=2)]
    else:
        chunks = list((0.3 * torch.randn(B, 6, D, generator=g)).chunk(6, dim=1))
    return hidden, update, chunks


@pytest.mark.parametrize("per_token", [False, True])
def test_wan_float32_chains_are_diffusers_block_ops(per_token):
    """The chains of norm_scale_shift's numerics="float32" and of residual_gate_add's f32 gate are
    WanTransformerBlock.forward's expressions (diffusers 0.42.1) op for op, FP32LayerNorm included."""
    normalization = pytest.importorskip("diffusers.models.normalization")
    B, S, D, eps = 2, 9, 64, 1e-6
    hidden, attn, (shift, scale, gate, c_shift, c_scale, c_gate) = _wan_inputs(B, S, D, per_token)
    norm1 = normalization.FP32LayerNorm(D, eps, elementwise_affine=False)
    norm2 = normalization.FP32LayerNorm(D, eps, elementwise_affine=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm2.weight.copy_(1 + 0.2 * torch.randn(D, generator=g))
        norm2.bias.copy_(0.1 * torch.randn(D, generator=g))
        y1 = (norm1(hidden.float()) * (1 + scale) + shift).type_as(hidden)
        assert torch.equal(y1, eager.norm_scale_shift_float32_eager(hidden, scale, shift, eps=eps)[0])
        h2 = (hidden.float() + attn * gate).type_as(hidden)
        assert torch.equal(h2, eager.residual_gate_add_float32_eager(hidden, attn, gate))
        y2 = norm2(h2.float()).type_as(h2)
        fused_y, fused_v = eager.norm_scale_shift_float32_eager(attn, None, None, eps=eps, weight=norm2.weight,
                                                                bias=norm2.bias, residual=hidden, gate=gate)
        assert torch.equal(fused_v, h2) and torch.equal(fused_y, y2)
        h3 = h2 + attn  # the cross-attention residual, then norm3
        y3 = (norm1(h3.float()) * (1 + c_scale) + c_shift).type_as(h3)
        fused_y, fused_v = eager.norm_scale_shift_float32_eager(attn, c_scale, c_shift, eps=eps, residual=h2)
        assert torch.equal(fused_v, h3) and torch.equal(fused_y, y3)
        h4 = (h3.float() + attn.float() * c_gate).type_as(h3)  # the FFN's form
        assert torch.equal(h4, eager.residual_gate_add_float32_eager(h3, attn, c_gate))


def test_float32_options_route_to_the_float32_chains():
    """oracle_outputs for an f32 gate beside bf16 data and for numerics="float32" gives Wan's
    expressions, written here again (not ditops.eager's functions), and not the 16-bit chains."""
    hidden, attn, (shift, scale, gate, *_) = _wan_inputs(1, 5, 32, False)
    out = eager.oracle_outputs("residual_gate_add", {"residual": hidden, "update": attn, "gate": gate}, {})
    assert out["out"].dtype == torch.bfloat16
    wan_residual = (hidden.float() + attn * gate).type_as(hidden)
    assert torch.equal(out["out"], wan_residual)
    assert not torch.equal(wan_residual, hidden + attn * gate.bfloat16())  # the inputs tell the chains apart
    x = {"x": hidden, "scale": scale, "shift": shift}
    y = eager.oracle_outputs("norm_scale_shift", x, {"numerics": "float32"})["y"]
    wan_adaln = (torch.nn.functional.layer_norm(hidden.float(), (32,), eps=1e-6) * (1 + scale) + shift).type_as(hidden)
    assert y.dtype == torch.bfloat16 and torch.equal(y, wan_adaln)
    bf16_adaln = torch.nn.functional.layer_norm(hidden, (32,), eps=1e-6) * (1 + scale.bfloat16()) + shift.bfloat16()
    assert not torch.equal(wan_adaln, bf16_adaln)
    assert eager.oracle_outputs("norm_scale_shift", x, {"numerics": "sglang"}) is None
    # The eager numerics without a scale: F.layer_norm alone.
    y = eager.oracle_outputs("norm_scale_shift", {"x": hidden}, {})["y"]
    assert torch.equal(y, torch.nn.functional.layer_norm(hidden, (32,), eps=1e-6))


def test_an_eager_chain_is_its_op_oracle_by_parameter_name():
    """@eager: the chain's parameters take the call's tensors and options by name (an option from the
    table's text, an absent optional tensor as None), its result lands on the op's written tensors
    in the table's order, and `when` leaves other option values without an oracle."""
    pytest.importorskip("ditops", reason="the oracle reads the op table (the compiled ditops module)")
    g = torch.Generator().manual_seed(3)
    x = {"x": torch.randn(2, 5, 64, generator=g).bfloat16(), "scale": torch.randn(2, 64, generator=g).bfloat16()}
    out = eager.oracle_outputs("layernorm_modulate", x, {"eps": "0.001"})
    assert set(out) == {"out"}  # stats_out is the caller's: the chain returns out alone
    assert torch.equal(out["out"], eager.layernorm_modulate_eager(x["x"], x["scale"], None, 1e-3))
    out = eager.oracle_outputs("layernorm_modulate_fp8_rowwise", x, {"eps": "0.001"})
    want = eager.fp8_rowwise_eager(eager.layernorm_modulate_eager(x["x"], x["scale"], None, 1e-3))
    assert set(out) == {"out", "out_scale"}  # the two the chain returns, in the table's order
    assert torch.equal(out["out"].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(out["out_scale"], want[1])
    q, k = torch.randn(1, 3, 2, 8, generator=g).bfloat16(), torch.randn(1, 3, 1, 8, generator=g).bfloat16()
    out = eager.oracle_outputs("qk_head_layernorm", {"q": q, "k": k}, {"eps": "1e-6"})
    want = eager.qk_head_layernorm_eager(q, k, 1e-6)
    assert set(out) == {"q_out", "k_out"} and torch.equal(out["q_out"], want[0]) and torch.equal(out["k_out"], want[1])
    y, s = torch.randn(3, 32, generator=g).bfloat16(), torch.tensor([0.02])
    assert eager.oracle_outputs("fp8_static_quant", {"x": y, "scale": s}, {"fp8_reciprocal": "div_full"}) is None
    out = eager.oracle_outputs("fp8_static_quant", {"x": y, "scale": s}, {"fp8_reciprocal": "ieee"})
    assert torch.equal(out["out"].view(torch.uint8), eager.fp8_static_quant_eager(y, s).view(torch.uint8))


@pytest.mark.parametrize("numerics", ["eager", "float32"])
def test_norm_scale_shift_rowwise_oracle_is_the_chain_then_the_recipe(numerics):
    """The fp8_rowwise output's oracle: the numerics' chain (its y in x's dtype: Wan's adaLN line for
    float32), then fp8_rowwise_eager; y only where the call has it."""
    hidden, _, (shift, scale, *_) = _wan_inputs(2, 5, 32, False)
    if numerics == "eager":
        scale, shift = scale.to(hidden.dtype), shift.to(hidden.dtype)
    x = {"x": hidden, "scale": scale, "shift": shift, "fp8_rowwise": None, "fp8_scale": None}
    out = eager.oracle_outputs("norm_scale_shift", x, {"numerics": numerics})
    assert set(out) == {"fp8_rowwise", "fp8_scale"}
    if numerics == "float32":
        y = (torch.nn.functional.layer_norm(hidden.float(), (32,), eps=1e-6) * (1 + scale) + shift).type_as(hidden)
    else:
        y = torch.nn.functional.layer_norm(hidden, (32,), eps=1e-6) * (1 + scale) + shift
    q, s = eager.fp8_rowwise_eager(y)
    assert torch.equal(out["fp8_rowwise"].view(torch.uint8), q.view(torch.uint8)) and torch.equal(out["fp8_scale"], s)
    chain = eager.norm_scale_shift_fp8_rowwise_eager(hidden, scale, shift, numerics=numerics)
    assert torch.equal(chain[0].view(torch.uint8), q.view(torch.uint8)) and torch.equal(chain[1], s)
    assert torch.equal(chain[2], y)
    with_y = eager.oracle_outputs("norm_scale_shift", {**x, "y": None}, {"numerics": numerics})
    assert torch.equal(with_y["y"], y)
