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
