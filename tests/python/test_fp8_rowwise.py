"""The FP8 producers from Python on the CPU (the reference runs): the generated signatures return the
pair (e4m3 tensor, fp32 scales) the FP8 model path takes, the torch ops' schemas and fakes (under
torch.compile with fullgraph), and the bytes against the eager chains (act=none and the LayerNorm
chain, byte for byte; the GELU's tanh and SwiGLU's exp of the CPU reference are not CUDA's tanhf and
expf, so there the shapes and a bound). On CUDA (skipped without a device): act=swiglu byte for byte
against its eager chain. Skipped without PyTorch."""
import inspect

from conftest import torch_or_skip

torch = torch_or_skip()
import ditops  # noqa: E402
import ditops.torch  # noqa: E402,F401  (registers torch.ops.ditops)
from ditops import eager  # noqa: E402


def same(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_signatures_take_the_model_arguments_and_return_both_outputs():
    sig = inspect.signature(ditops.fp8_rowwise_quant)
    assert list(sig.parameters)[:2] == ["x", "prefix"] and sig.parameters["prefix"].default is None
    assert sig.parameters["act"].default == "none"
    assert list(inspect.signature(ditops.layernorm_modulate_fp8_rowwise).parameters)[:3] == ["x", "scale", "shift"]
    for op in ("fp8_rowwise_quant", "layernorm_modulate_fp8_rowwise"):
        schema = str(getattr(torch.ops.ditops, op).default._schema)
        assert schema.endswith("-> (Tensor out, Tensor out_scale)"), schema


def test_fp8_rowwise_quant_equals_the_eager_chain_and_compiles():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 5, 96, generator=gen) * 3).to(torch.bfloat16)
    prefix = torch.randn(2, 5, 32, generator=gen).to(torch.bfloat16)
    x[0, 1] = 0  # a zero row: scale 1
    got = ditops.fp8_rowwise_quant(x, prefix)
    want = eager.fp8_rowwise_quant_eager(x, prefix)
    assert got.out.shape == (10, 128) and got.out.dtype == torch.float8_e4m3fn
    assert got.out_scale.shape == (10, 1) and got.out_scale.dtype == torch.float32
    assert same(got.out, want[0]) and torch.equal(got.out_scale, want[1])
    fn = torch.compile(lambda a, p: torch.ops.ditops.fp8_rowwise_quant(a, p, act="gelu_tanh"), fullgraph=True)
    q, s = fn(x, prefix)
    wq, ws = eager.fp8_rowwise_quant_eager(x, prefix, "gelu_tanh")
    assert q.shape == wq.shape and s.shape == ws.shape
    # The CPU tanh against ATen's CPU GELU: within one e4m3 code and one bf16 ulp of the scale.
    assert torch.allclose(s, ws, rtol=2 ** -7, atol=0)
    assert ((q.float() - wq.float()).abs() <= wq.float().abs() / 8 + 2 ** -9).all()
    q2, s2 = torch.ops.ditops.fp8_rowwise_quant(x[0])  # [S, K]: one row per token
    assert q2.shape == (5, 96) and s2.shape == (5, 1)


def test_layernorm_modulate_fp8_rowwise_equals_the_eager_chain_and_compiles():
    gen = torch.Generator().manual_seed(1)
    D = 256
    x = (torch.randn(2, 7, D, generator=gen) + 0.3).to(torch.bfloat16)
    emb = (torch.randn(2, 6 * D, generator=gen) * 0.3).to(torch.bfloat16)
    scale, shift = emb[:, D:2 * D], emb[:, 2 * D:3 * D]  # chunks of the adaLN projection
    got = ditops.layernorm_modulate_fp8_rowwise(x, scale, shift)
    want = eager.layernorm_modulate_fp8_rowwise_eager(x, scale, shift, 1e-6)
    assert got.out.shape == (2, 7, D) and got.out_scale.shape == (2, 7, 1)
    assert same(got.out, want[0]) and torch.equal(got.out_scale, want[1])
    fn = torch.compile(lambda a, b, c: torch.ops.ditops.layernorm_modulate_fp8_rowwise(a, b, c), fullgraph=True)
    q, s = fn(x, scale, shift)
    assert same(q, want[0]) and torch.equal(s, want[1])


def test_fp8_rowwise_quant_swiglu_takes_half_of_x_and_follows_the_eager_chain():
    import pytest
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 5, 192, generator=gen) * 3).to(torch.bfloat16)  # [gate | up], N = 96
    prefix = torch.randn(2, 5, 32, generator=gen).to(torch.bfloat16)
    x[1, 2] = 0  # a zero row without the prefix: scale 1
    for p in (None, prefix):
        got = ditops.fp8_rowwise_quant(x, p, act="swiglu")
        wq, ws = eager.fp8_rowwise_quant_eager(x, p, "swiglu")
        assert got.out.shape == wq.shape == (10, 96 + (0 if p is None else 32))
        assert got.out_scale.shape == ws.shape == (10, 1)
        # The CPU reference's exp against ATen's CPU silu: the scale within four bf16 ulps, each byte
        # within two e4m3 codes (docs/fp8_rowwise_quant.md).
        assert torch.allclose(got.out_scale, ws, rtol=2 ** -5, atol=0)
        assert ((got.out.float() - wq.float()).abs() <= wq.float().abs() / 4 + 2 ** -8).all()
    fn = torch.compile(lambda a, b: torch.ops.ditops.fp8_rowwise_quant(a, b, act="swiglu"), fullgraph=True)
    q, s = fn(x, prefix)
    assert q.shape == (10, 128) and s.shape == (10, 1)
    assert same(q, ditops.fp8_rowwise_quant(x, prefix, act="swiglu").out)
    # FLUX.2's single block: x is the MLP columns of the fused projection (rows of their own stride).
    proj = torch.randn(10, 96 + 192, generator=gen).to(torch.bfloat16)
    mlp = proj[:, 96:]
    got = ditops.fp8_rowwise_quant(mlp, prefix.reshape(10, 32), act="swiglu")
    want = ditops.fp8_rowwise_quant(mlp.contiguous(), prefix.reshape(10, 32), act="swiglu")
    assert same(got.out, want.out) and torch.equal(got.out_scale, want.out_scale)
    with pytest.raises(ditops.Error, match=r"x.shape\[2\] must be even for act=swiglu .* but is 191"):
        ditops.fp8_rowwise_quant(x[..., :191], act="swiglu")
    with pytest.raises(ditops.Error, match=r"out must be \[M, Kp \+ K/2\] \(act=swiglu\) = \[10, 96\]"):
        ditops.fp8_rowwise_quant(x, act="swiglu", out=torch.empty(10, 192, dtype=torch.float8_e4m3fn))


def test_gpu_swiglu_equals_the_eager_chain_byte_for_byte():
    """act=swiglu's bit_exact claim on CUDA (compiled, not yet run on a GPU when written): FLUX.2's
    FF (x [M, 36864]) and single block (prefix 6144, x the MLP columns of the fused projection),
    bf16, a few hundred tokens; f16 and an odd N on the scalar path."""
    import pytest
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(4)

    def randn(*shape, dtype=torch.bfloat16, amp=3.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * amp).to(dtype)

    proj = randn(1, 300, 3 * 6144 + 36864)
    cases = [(randn(1, 300, 36864), None), (proj[..., 3 * 6144:], randn(1, 300, 6144)),
             (randn(7, 34, dtype=torch.float16), randn(7, 3, dtype=torch.float16)),
             (randn(5, 2 * 4096, amp=40.0), None)]  # silu's tails: exp overflow, large products
    for x, prefix in cases:
        got = torch.ops.ditops.fp8_rowwise_quant(x, prefix, act="swiglu", backend="jit")
        want = eager.fp8_rowwise_quant_eager(x, prefix, "swiglu")
        assert same(got[0], want[0]) and torch.equal(got[1], want[1]), (tuple(x.shape), prefix is not None)
