"""The adaLN-family torch.library ops on the CPU: torch.library.opcheck (schema, fake
implementation, AOT dispatch) and torch.compile(fullgraph=True) against the eager op call.
Skipped without PyTorch."""
import pytest

from conftest import torch_or_skip

torch = torch_or_skip()
import ditops  # noqa: E402
import ditops.torch  # noqa: E402,F401  (registers torch.ops.ditops.*)
from ditops.eager import fp8_rowwise_eager, residual_gate_add_eager  # noqa: E402

pytestmark = pytest.mark.cpu_only  # CI runs it; the device verify leaves it out (conftest.py)

ops = torch.ops.ditops


def rand(*shape, dtype=torch.bfloat16, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


def rga_cases():
    r = rand(2, 6, 32, dtype=torch.float16)
    u = rand(2, 6, 32, dtype=torch.float16, seed=1)
    rt = rand(2, 32, 6, dtype=torch.float16, seed=2).transpose(1, 2)  # the transposed residual stream
    return [(r, u, rand(1, 1, 32, dtype=torch.float16, seed=3)),
            (r, u, rand(2, 6, 1, dtype=torch.float16, seed=4)),
            (rt, u, rand(2, 1, 32, dtype=torch.float16, seed=5))]


def ln_case():
    emb = rand(2, 192, seed=6, scale=0.2)
    return rand(2, 5, 64, seed=7), emb[:, :64], emb[:, 64:128]


def nss_cases():
    x, scale, shift = ln_case()
    return [((x, scale, shift), {}),
            ((x, scale, None), dict(residual=rand(2, 5, 64, seed=8), gate=rand(2, 1, 64, seed=9),
                                    norm="rms", weight=rand(64, seed=10))),
            ((x, scale, shift), dict(input_scale=torch.tensor([0.05]))),
            ((x, scale, shift), dict(input_scale=torch.tensor([0.05]), store_y=True)),
            ((x, scale, shift), dict(global_scale=torch.tensor([2.0]))),
            ((x, scale, shift), dict(rowwise_fp8=True)),
            ((x, scale.float()[:, None], shift.float()[:, None]), dict(rowwise_fp8=True, numerics="float32",
                                                                     store_y=True))]


@pytest.mark.parametrize("case", range(3))
def test_opcheck_residual_gate_add(case):
    torch.library.opcheck(ops.residual_gate_add.default, rga_cases()[case])


def test_opcheck_layernorm_ops():
    x, scale, shift = ln_case()
    torch.library.opcheck(ops.layernorm_modulate.default, (x, scale, shift))
    torch.library.opcheck(ops.layernorm_modulate.default, (x, scale, None), dict(eps=1e-5))
    torch.library.opcheck(ops.layernorm_modulate_fp8.default, (x, scale, shift, torch.tensor([0.01])),
                          dict(fp8_reciprocal="div_full"))
    torch.library.opcheck(ops.qk_head_layernorm.default, (rand(1, 3, 4, 64), rand(1, 3, 2, 64, seed=1)))


@pytest.mark.parametrize("case", range(7))
def test_opcheck_norm_scale_shift(case):
    args, kwargs = nss_cases()[case]
    torch.library.opcheck(ops.norm_scale_shift.default, args, kwargs)


def test_residual_gate_add_op_values_and_strides():
    for r, u, g in rga_cases():
        out = ops.residual_gate_add(r, u, g)
        assert out.stride() == r.stride()
        assert torch.equal(out, residual_gate_add_eager(r, u, g))  # CPU eager rounds the same way


def test_norm_scale_shift_op_marks_absent_outputs_empty():
    x, scale, shift = ln_case()
    y, res, fp8, packed, scales, q, s = ops.norm_scale_shift(x, scale, shift, input_scale=torch.tensor([0.05]))
    assert y.numel() == 0 and res.numel() == 0 and packed.numel() == 0 and scales.numel() == 0
    assert q.numel() == 0 and s.numel() == 0
    assert fp8.shape == x.shape and fp8.dtype == torch.float8_e4m3fn
    plain = ditops.norm_scale_shift(x, scale, shift, input_scale=torch.tensor([0.05]))
    assert torch.equal(fp8.view(torch.uint8), plain.fp8.view(torch.uint8))


@pytest.mark.parametrize("numerics", ["eager", "float32"])
def test_norm_scale_shift_rowwise_output_is_the_recipe_of_its_y(numerics):
    """rowwise_fp8=True: fp8_rowwise [B, S, D] e4m3 and fp8_scale [B, S, 1] float32, y absent unless
    store_y; the pair is fp8_rowwise_eager of the op's own y (here the CPU reference's), with or
    without y written."""
    x, scale, shift = ln_case()
    if numerics == "float32":
        scale, shift = scale.float()[:, None], shift.float()[:, None]
    y, res, fp8, packed, scales, q, s = ops.norm_scale_shift(x, scale, shift, rowwise_fp8=True, numerics=numerics)
    assert y.numel() == 0 and res.numel() == 0 and fp8.numel() == 0 and packed.numel() == 0
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    assert s.shape == (*x.shape[:2], 1) and s.dtype == torch.float32
    y2, *_, q2, s2 = ops.norm_scale_shift(x, scale, shift, rowwise_fp8=True, numerics=numerics, store_y=True)
    assert y2.shape == x.shape and y2.dtype == x.dtype
    want_q, want_s = fp8_rowwise_eager(y2)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)
    named = ditops.norm_scale_shift(x, scale, shift, rowwise_fp8=True, numerics=numerics)
    assert named.y is None and torch.equal(named.fp8_rowwise.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(named.fp8_scale, s)
    with pytest.raises(ditops.Error, match="at most one quantized output"):
        ops.norm_scale_shift(x, scale, shift, rowwise_fp8=True, numerics=numerics, input_scale=torch.tensor([0.05]))


def same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    v = torch.uint8 if a.element_size() == 1 else a.dtype
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(a.view(v), b.view(v))


def compiled_equals_eager(fn, *args):
    torch._dynamo.reset()
    return same(torch.compile(fn, fullgraph=True)(*args), fn(*args))


def test_compile_fullgraph_residual_gate_add():
    for r, u, g in rga_cases():
        assert compiled_equals_eager(lambda r, u, g: ops.residual_gate_add(r, u, g), r, u, g)


def test_compile_fullgraph_layernorm_ops():
    x, scale, shift = ln_case()
    inv = torch.tensor([0.01])
    assert compiled_equals_eager(lambda x, s, h: ops.layernorm_modulate(x, s, h), x, scale, shift)
    assert compiled_equals_eager(lambda x, s, h, i: ops.layernorm_modulate_fp8(x, s, h, i), x, scale,
                                 shift, inv)
    assert compiled_equals_eager(lambda q, k: ops.qk_head_layernorm(q, k), rand(1, 3, 4, 64),
                                 rand(1, 3, 2, 64, seed=1))


def test_compile_fullgraph_norm_scale_shift_chain():
    # A DiT block's pre-norm step: gated residual + norm + modulate, feeding further eager ops.
    x, scale, shift = ln_case()
    res, gate = rand(2, 5, 64, seed=8), rand(2, 1, 64, seed=9)

    def block(x, scale, shift, res, gate):
        y, r, *_ = ops.norm_scale_shift(x, scale, shift, residual=res, gate=gate)
        return y * 2, r

    assert compiled_equals_eager(block, x, scale, shift, res, gate)


def test_compile_fullgraph_norm_scale_shift_rowwise():
    # Wan's adaLN into an FP8 linear: the float32 chain's per-token e4m3 and scales, y never written.
    x, scale, shift = ln_case()
    scale, shift = scale.float()[:, None], shift.float()[:, None]

    def adaln(x, scale, shift):
        *_, q, s = ops.norm_scale_shift(x, scale, shift, rowwise_fp8=True, numerics="float32")
        return q, s * 2

    assert compiled_equals_eager(adaln, x, scale, shift)
