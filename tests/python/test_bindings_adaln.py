"""The adaLN-family bindings on the CPU (reference backend): residual_gate_add, layernorm_modulate,
layernorm_modulate_fp8, qk_head_layernorm and norm_scale_shift through ditops' plain functions.

numpy has no bfloat16 it can export through DLPack (ml_dtypes' is refused), so the bf16-only layernorm ops take CPU torch
tensors (skipped without torch); everything numpy can express uses numpy."""
import numpy as np
import pytest

import ditops

# ---------------------------------------------------------------- residual_gate_add


def rga_expected(r, u, g):
    """Eager rounding from float64: the product rounded to the dtype, then the sum (both exact in
    float64 before their one rounding for f16; for f32 the double rounding of a sum is harmless)."""
    p = (u.astype(np.float64) * g.astype(np.float64)).astype(r.dtype)
    return (r.astype(np.float64) + p.astype(np.float64)).astype(r.dtype)


GATE_SHAPES = {"full": lambda B, T, D: (B, T, D), "row": lambda B, T, D: (1, 1, D),
               "token": lambda B, T, D: (B, T, 1), "batch": lambda B, T, D: (B, 1, D)}


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("mode", sorted(GATE_SHAPES))
def test_residual_gate_add_is_bit_exact_to_eager_rounding(dtype, mode):
    rng = np.random.default_rng(1)
    B, T, D = 3, 5, 40
    r = rng.standard_normal((B, T, D)).astype(dtype)
    u = rng.standard_normal((B, T, D)).astype(dtype)
    g = rng.standard_normal(GATE_SHAPES[mode](B, T, D)).astype(dtype)
    out = ditops.residual_gate_add(r, u, g)
    assert out.shape == r.shape and out.dtype == r.dtype
    assert np.array_equal(out.view(np.uint8), rga_expected(r, u, g).view(np.uint8))
    # numpy's own f16 arithmetic rounds the same way (a second, independent oracle)
    assert np.array_equal(out, r + u * g)


def test_residual_gate_add_transposed_residual_keeps_its_strides():
    rng = np.random.default_rng(2)
    B, T, H = 2, 24, 16
    r = rng.standard_normal((B, H, T)).astype(np.float16).transpose(0, 2, 1)  # [B, T, H], (T*H, 1, T)
    u = rng.standard_normal((B, T, H)).astype(np.float16)
    g = rng.standard_normal((B, 1, H)).astype(np.float16)
    out = ditops.residual_gate_add(r, u, g)
    assert out.strides == r.strides
    assert np.array_equal(out, rga_expected(r, u, g))


def test_residual_gate_add_writes_the_given_out_and_returns_it():
    rng = np.random.default_rng(3)
    r, u = (rng.standard_normal((4, 32)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((1, 32)).astype(np.float32)
    out = np.full_like(r, 7.0)
    assert ditops.residual_gate_add(r, u, g, out=out) is out
    assert np.array_equal(out, rga_expected(r, u, g))


def test_residual_gate_add_refusals_write_nothing():
    r = np.ones((4, 32), np.float16)
    u = np.ones((4, 32), np.float16)
    g = np.ones((1, 32), np.float16)
    ro = np.full_like(r, 3.0)
    ro.flags.writeable = False
    with pytest.raises(ditops.Error, match="out is a read-only numpy array"):
        ditops.residual_gate_add(r, u, g, out=ro)
    assert np.all(ro == 3.0)
    with pytest.raises(ditops.Error, match="out"):  # in place is refused by the facade
        ditops.residual_gate_add(r, u, g, out=r)
    assert np.all(r == 1.0)
    out = np.full_like(r, 5.0)
    with pytest.raises(ditops.Error, match="update"):
        ditops.residual_gate_add(r, np.ones((4, 31), np.float16), g, out=out)
    with pytest.raises(ditops.Error, match="gate"):
        ditops.residual_gate_add(r, u, np.ones((2, 32), np.float16), out=out)
    with pytest.raises(ditops.Error, match="dtype"):
        ditops.residual_gate_add(r, u.astype(np.float32), g, out=out)
    assert np.all(out == 5.0)


def test_residual_gate_add_read_only_inputs_and_empty_tensors():
    r = np.arange(64, dtype=np.float32).reshape(2, 32)
    r.flags.writeable = False  # inputs are only read: fine
    out = ditops.residual_gate_add(r, r, np.full((1, 32), 0.5, np.float32))
    assert np.array_equal(out, r * 1.5)
    e = np.ones((0, 32), np.float16)
    assert ditops.residual_gate_add(e, e, np.ones((1, 32), np.float16)).shape == (0, 32)


def test_residual_gate_add_needs_out_for_other_producers():
    class Producer:  # a DLPack producer other than torch and numpy: ditops cannot allocate like it
        def __dlpack__(self, **kwargs):
            raise NotImplementedError
    with pytest.raises(ditops.Error, match=r"out was not given .* \(got Producer for residual\); pass out="):
        ditops.residual_gate_add(Producer(), Producer(), Producer())

    class Opaque:  # not a tensor at all: named as the input it is
        pass
    with pytest.raises(ditops.Error, match="residual must be a tensor .* but is Opaque"):
        ditops.residual_gate_add(Opaque(), Opaque(), Opaque())


# ---------------------------------------------------------------- norm_scale_shift (numpy f32)


def nss_float64(x, scale, shift, eps, norm="layer"):
    xd = x.astype(np.float64)
    if norm == "layer":
        mu = xd.mean(-1, keepdims=True)
        n = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + eps)
    else:
        n = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + eps)
    y = n * (1 + scale.astype(np.float64))
    return y if shift is None else y + shift.astype(np.float64)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norm_scale_shift_numpy_matches_float64(norm):
    rng = np.random.default_rng(4)
    B, S, D = 2, 7, 64
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    scale = (0.1 * rng.standard_normal((B, 1, D))).astype(np.float32)
    shift = rng.standard_normal((D,)).astype(np.float32)
    o = ditops.norm_scale_shift(x, scale, shift, norm=norm)
    assert isinstance(o, ditops.NormScaleShiftOutputs)
    assert o.residual_out is None and o.fp8 is None and o.nvfp4_packed is None
    assert o.y.shape == x.shape and o.y.dtype == np.float32
    np.testing.assert_allclose(o.y, nss_float64(x, scale, shift, 1e-6, norm), rtol=1e-5, atol=1e-5)


def test_norm_scale_shift_gated_residual_is_exact_and_feeds_the_norm():
    rng = np.random.default_rng(5)
    B, S, D = 2, 4, 32
    x, res = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(2))
    gate = rng.standard_normal((B, 1, D)).astype(np.float32)
    scale = np.zeros((D,), np.float32)
    o = ditops.norm_scale_shift(x, scale, residual=res, gate=gate)
    v = rga_expected(res, x, gate)
    assert np.array_equal(o.residual_out, v)
    np.testing.assert_allclose(o.y, nss_float64(v, scale, None, 1e-6), rtol=1e-5, atol=1e-5)


def test_norm_scale_shift_simple_exact_case():
    # Rows of +-a: mean 0, every normalized value +-1/sqrt(1 + eps/a^2), which is +-1 in f32 for
    # eps = 0; then * (1 + 1) + 0.25 -> 2.25 / -1.75 exactly.
    x = np.tile(np.array([3.0, -3.0], np.float32), (1, 2, 16))
    o = ditops.norm_scale_shift(x, np.ones((), np.float32), np.full((32,), 0.25, np.float32), eps=0.0)
    assert np.array_equal(o.y, np.tile(np.array([2.25, -1.75], np.float32), (1, 2, 16)))


def test_norm_scale_shift_quantized_outputs_are_allocated():
    rng = np.random.default_rng(6)
    B, S, D = 1, 3, 64
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    scale = np.zeros((D,), np.float32)
    o = ditops.norm_scale_shift(x, scale, input_scale=np.ones(1, np.float32))
    assert o.y is None and o.fp8.shape == x.shape and o.fp8.itemsize == 1
    both = ditops.norm_scale_shift(x, scale, input_scale=np.ones(1, np.float32), store_y=True)
    assert both.y.shape == x.shape and np.array_equal(both.fp8, o.fp8)
    # nvfp4 takes 16-bit activations
    n = ditops.norm_scale_shift(x.astype(np.float16), scale.astype(np.float16),
                                global_scale=np.ones(1, np.float32))
    assert n.nvfp4_packed.shape == (B * S, D // 2) and n.nvfp4_packed.dtype == np.uint8
    assert n.nvfp4_scales.shape == (128, D // 16)
    # The scales are 128x4 swizzled (include/ditops/norm_scale_shift.h): padding rows, located
    # through the swizzle, are written as 0; real rows carry nonzero E4M3 scales.
    cols = D // 16
    flat = n.nvfp4_scales.reshape(-1)

    def at(m, k):
        return flat[(m // 128) * (cols // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4]
    assert all(at(m, k) == 0 for m in range(B * S, 128) for k in range(cols))
    assert all(at(m, k) != 0 for m in range(B * S) for k in range(cols))
    assert np.any(n.nvfp4_packed != 0)


def test_norm_scale_shift_errors_name_the_tensor_and_write_nothing():
    x = np.ones((1, 2, 32), np.float32)
    y = np.full_like(x, 9.0)
    with pytest.raises(ditops.Error, match="scale"):
        ditops.norm_scale_shift(x, np.ones((3, 32), np.float32), y=y)
    with pytest.raises(ditops.Error, match="shift"):
        ditops.norm_scale_shift(x, np.ones((32,), np.float32), np.ones((31,), np.float32), y=y)
    with pytest.raises(ditops.Error, match="bias"):  # bias needs weight
        ditops.norm_scale_shift(x, np.ones((32,), np.float32), bias=np.ones(32, np.float32), y=y)
    with pytest.raises(ditops.Error, match="at most one quantized output"):
        ditops.norm_scale_shift(x, np.ones((32,), np.float32), input_scale=np.ones(1, np.float32),
                                global_scale=np.ones(1, np.float32))
    for option, value in [("norm", "batch"), ("numerics", "fast"), ("fp8_reciprocal", "rcp"),
                          ("e2m1", "magic")]:
        with pytest.raises(ditops.Error, match=f"unknown {option} '{value}'"):
            ditops.norm_scale_shift(x, np.ones((32,), np.float32), y=y, **{option: value})
    ro = np.zeros_like(x)
    ro.flags.writeable = False
    with pytest.raises(ditops.Error, match="y is a read-only"):
        ditops.norm_scale_shift(x, np.ones((32,), np.float32), y=ro)
    assert np.all(y == 9.0) and np.all(ro == 0)


def test_norm_scale_shift_in_place_output():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 32)).astype(np.float32)
    expected = ditops.norm_scale_shift(x, np.zeros(32, np.float32)).y
    assert ditops.norm_scale_shift(x, np.zeros(32, np.float32), y=x).y is x
    assert np.array_equal(x, expected)


# ---------------------------------------------------------------- layernorm ops (CPU torch, bf16)


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def ln_inputs(torch, B=2, S=5, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, D, generator=g).to(torch.bfloat16)
    emb = (0.2 * torch.randn(B, 3 * D, generator=g)).to(torch.bfloat16)
    scale, shift = emb[:, :D], emb[:, D:2 * D]  # chunks of an adaLN projection: strided rows
    return x, scale, shift


def ln_float64(torch, x, eps=1e-6):
    xd = x.double()
    return (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + eps)


def test_layernorm_modulate_shape_dtype_and_closeness(torch):
    x, scale, shift = ln_inputs(torch)
    out = ditops.layernorm_modulate(x, scale, shift)
    assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    expected = ln_float64(torch, x) * (1 + scale[:, None].double()) + shift[:, None].double()
    # bf16 chain: a few roundings of 2^-8 relative each
    torch.testing.assert_close(out.double(), expected, rtol=2 ** -6, atol=2 ** -6)
    ref = ditops.layernorm_modulate(x, scale, shift, backend="reference")
    assert torch.equal(ref, out)
    for mapping in ("warp", "cta"):  # GPU mappings: the CPU reference ignores them
        assert torch.equal(ditops.layernorm_modulate(x, scale, shift, mapping=mapping), out)


def test_layernorm_modulate_simple_exact_case(torch):
    # Rows of +-2: normalized +-1/sqrt(1 + eps/4) rounds to +-1 in bf16; * (1 + 1) + 0.5.
    x = torch.tensor([2.0, -2.0]).repeat(1, 3, 32).to(torch.bfloat16)
    one = torch.ones(1, 64, dtype=torch.bfloat16)
    out = ditops.layernorm_modulate(x, one, 0.5 * one)
    assert torch.equal(out, torch.tensor([2.5, -1.5]).repeat(1, 3, 32).to(torch.bfloat16))
    no_shift = ditops.layernorm_modulate(x, one)
    assert torch.equal(no_shift, torch.tensor([2.0, -2.0]).repeat(1, 3, 32).to(torch.bfloat16))


def test_layernorm_modulate_in_place_and_stats(torch):
    x, scale, shift = ln_inputs(torch, seed=1)
    expected = ditops.layernorm_modulate(x, scale, shift)
    stats = torch.full((2, 5, 2), float("nan"))
    y = x.clone()
    assert ditops.layernorm_modulate(y, scale, shift, out=y, stats_out=stats) is y
    assert torch.equal(y, expected)
    xd = x.double()
    torch.testing.assert_close(stats[..., 0].double(), xd.mean(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats[..., 1].double(),
                               1 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-6), rtol=1e-5, atol=1e-6)


def test_layernorm_modulate_fp8_is_the_static_quant_of_the_bf16_result(torch):
    x, scale, shift = ln_inputs(torch, seed=2)
    input_scale = torch.tensor([0.004])
    out = ditops.layernorm_modulate_fp8(x, scale, shift, input_scale)
    assert out.shape == x.shape and out.dtype == torch.float8_e4m3fn
    y = ditops.layernorm_modulate(x, scale, shift)
    expected = (y.float() * (1.0 / input_scale)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
    assert torch.any(out.float().abs() == 448)  # the clamp was exercised


def test_qk_head_layernorm_shapes_and_closeness(torch):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(2, 3, 2, 64, generator=g).to(torch.bfloat16)
    qo, ko = ditops.qk_head_layernorm(q, k)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == ko.dtype == torch.bfloat16
    torch.testing.assert_close(qo.double(), ln_float64(torch, q), rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(ko.double(), ln_float64(torch, k), rtol=2 ** -7, atol=2 ** -7)
    q2, k2 = q.clone(), k.clone()
    assert ditops.qk_head_layernorm(q2, k2, q_out=q2, k_out=k2) == (q2, k2)
    assert torch.equal(q2, qo) and torch.equal(k2, ko)
    ones = torch.tensor([3.0, -3.0]).repeat(1, 1, 1, 32).to(torch.bfloat16)
    assert torch.equal(ditops.qk_head_layernorm(ones, ones)[0],
                       torch.tensor([1.0, -1.0]).repeat(1, 1, 1, 32).to(torch.bfloat16))


def test_layernorm_errors_name_the_tensor_and_write_nothing(torch):
    x, scale, shift = ln_inputs(torch)
    out = torch.full_like(x, 4.0)
    with pytest.raises(ditops.Error, match=r"layernorm_modulate: x.dtype must be bf16"):
        ditops.layernorm_modulate(x.float(), scale, shift, out=out)
    with pytest.raises(ditops.Error, match=r"scale.shape\[0\]"):
        ditops.layernorm_modulate(x, scale[:1], shift, out=out)
    with pytest.raises(ditops.Error, match="shift"):
        ditops.layernorm_modulate(x, scale, shift[:, :32], out=out)
    with pytest.raises(ditops.Error, match="unknown mapping 'row'"):
        ditops.layernorm_modulate(x, scale, shift, out=out, mapping="row")
    with pytest.raises(ditops.Error, match="input_scale"):
        ditops.layernorm_modulate_fp8(x, scale, shift, torch.ones(2))
    with pytest.raises(ditops.Error, match="unknown fp8_reciprocal"):
        ditops.layernorm_modulate_fp8(x, scale, shift, torch.ones(1), fp8_reciprocal="fast")
    with pytest.raises(ditops.Error, match="out"):
        ditops.layernorm_modulate_fp8(x, scale, shift, torch.ones(1), out=out)  # bf16, not e4m3
    q = torch.zeros(1, 2, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ditops.Error, match="k"):
        ditops.qk_head_layernorm(q, torch.zeros(1, 2, 2, 32, dtype=torch.bfloat16))
    assert torch.all(out == 4.0)


# ---------------------------------------------------------------- registry


def test_explain_and_list_kernels_know_every_op():
    x32 = np.ones((1, 2, 32), np.float32)
    r = ditops.explain("residual_gate_add", x32, x32, np.ones((1, 1, 32), np.float32))
    assert r.op == "residual_gate_add" and r.chosen.endswith(".reference")
    r = ditops.explain("norm_scale_shift", x32, np.ones(32, np.float32), residual=x32)
    assert r.op == "norm_scale_shift" and r.chosen.endswith(".reference")
    ops = {k["op"] for k in ditops.list_kernels()}
    assert {"residual_gate_add", "layernorm_modulate", "norm_scale_shift"} <= ops


def test_explain_layernorm_ops(torch):
    x, scale, shift = ln_inputs(torch)
    for op, args in [("layernorm_modulate", (x, scale, shift)),
                     ("layernorm_modulate_fp8", (x, scale, shift, torch.ones(1))),
                     ("qk_head_layernorm", (x[:, :, None], x[:, :, None]))]:
        r = ditops.explain(op, *args)
        assert r.chosen is not None and r.chosen.endswith(".reference"), (op, str(r))
    with pytest.raises(ditops.Error, match="scale"):
        ditops.explain("layernorm_modulate", x, scale[:1], shift)


# ---------------------------------------------------------------- Wan's float32 chains


def test_residual_gate_add_f32_gate_is_the_promoted_chain():
    """An f32 gate beside f16 data (a chunk of [B, 6, D]: a strided view): Wan's
    (x.float() + update * gate).type_as(x), numpy's own f32 arithmetic as the oracle."""
    rng = np.random.default_rng(8)
    B, S, D = 2, 5, 40
    r = (4 * rng.standard_normal((B, S, D))).astype(np.float16)
    u = rng.standard_normal((B, S, D)).astype(np.float16)
    g = (0.5 * rng.standard_normal((B, 6, D))).astype(np.float32)[:, 2:3]
    out = ditops.residual_gate_add(r, u, g)
    assert out.dtype == np.float16
    assert np.array_equal(out, (r.astype(np.float32) + u.astype(np.float32) * g).astype(np.float16))
    assert not np.array_equal(out, rga_expected(r, u, g.astype(np.float16)))
    with pytest.raises(ditops.Error, match="gate.dtype must be f32 \\(as residual\\) but is f16"):
        ditops.residual_gate_add(r.astype(np.float32), u.astype(np.float32), g.astype(np.float16))


def test_norm_scale_shift_float32_numerics_is_wans_chain():
    """numerics="float32": f16 x and residual, f32 operands; residual_out exact, y close to float64."""
    rng = np.random.default_rng(9)
    B, S, D = 2, 3, 64
    x, res = (rng.standard_normal((B, S, D)).astype(np.float16) for _ in range(2))
    mod = (0.3 * rng.standard_normal((B, 6, D))).astype(np.float32)
    shift, scale, gate = mod[:, 0:1], mod[:, 1:2], mod[:, 2:3]
    o = ditops.norm_scale_shift(x, scale, shift, residual=res, gate=gate, numerics="float32")
    v = (res.astype(np.float32) + x.astype(np.float32) * gate).astype(np.float16)
    assert o.y.dtype == np.float16 and np.array_equal(o.residual_out, v)
    np.testing.assert_allclose(o.y.astype(np.float64), nss_float64(v, scale, shift, 1e-6), rtol=2e-3, atol=2e-3)
    w, b = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32), (0.1 * rng.standard_normal(D)).astype(np.float32)
    n = ditops.norm_scale_shift(x, weight=w, bias=b, numerics="float32")  # norm2: no modulation
    np.testing.assert_allclose(n.y.astype(np.float64), nss_float64(x, np.zeros(D), None, 1e-6) * w + b,
                               rtol=2e-3, atol=2e-3)
    with pytest.raises(ditops.Error, match="scale.dtype must be f32 \\(numerics=float32"):
        ditops.norm_scale_shift(x, scale.astype(np.float16), numerics="float32")
