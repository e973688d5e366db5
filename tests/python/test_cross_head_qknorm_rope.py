"""cross_head_qknorm_rope on the CPU (its reference): the semantics against float64 math and
against the model code it replaces (LTX-2's RoPE functions from diffusers, when installed), the
tables as the models slice them, the rounding modes, and the defaults (k takes q's tables). The
bit-exact check against the eager chain on CUDA is tests/python/test_ops_eager.py and
bench/cross_head_qknorm_rope_torch.py (on a device)."""
import pytest

torch = pytest.importorskip("torch", reason="the op's torch tests need PyTorch")
import ditops.torch  # noqa: E402,F401
from ditops.eager import cross_head_qknorm_rope_eager, cross_head_rope_eager  # noqa: E402

ops = torch.ops.ditops


def bf16_ulps(a, b):
    """|a - b| in bf16 ulps of max(|a|, |b|, 1)."""
    scale = torch.maximum(torch.maximum(a.abs(), b.abs()), torch.ones_like(a)).double()
    return ((a.double() - b.double()).abs() / (torch.exp2(torch.floor(torch.log2(scale))) * 2.0 ** -7)).max().item()


def float64_chain(x, w, cos, sin, head_dim, rope, eps):
    """The op's formula in float64 (no intermediate roundings)."""
    xd = x.double()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.double()
    if rope == "none":
        return y
    return cross_head_rope_eager(y, cos.double(), sin.double(), head_dim, rope)


def wan_tables(S, D):
    """Wan's rotary table as WanRotaryPosEmbed returns it ([1, S, 1, D], each frequency twice),
    and the views its processor reads: cos[..., 0::2], sin[..., 1::2]."""
    t = torch.arange(S, dtype=torch.float64)[:, None]
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    cos = torch.cos(t * inv).repeat_interleave(2, -1).float().reshape(1, S, 1, D)
    sin = torch.sin(t * inv).repeat_interleave(2, -1).float().reshape(1, S, 1, D)
    return cos, sin, cos[..., 0::2], sin[..., 1::2]


@pytest.mark.parametrize("rope", ["interleaved", "split", "none"])
@pytest.mark.parametrize("weights", [True, False])
def test_reference_matches_float64_math(rope, weights):
    g = torch.Generator().manual_seed(3)
    B, S, Sk, H, D = 2, 5, 3, 4, 64
    q = torch.randn(B, S, H * D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, Sk, H * D, generator=g).to(torch.bfloat16)
    wq = (1 + 0.25 * torch.randn(H * D, generator=g)).to(torch.bfloat16) if weights else None
    wk = (1 + 0.25 * torch.randn(H * D, generator=g)).to(torch.bfloat16) if weights else None
    tables = {}
    if rope != "none":
        tables = dict(q_cos=torch.randn(B, S, H, D // 2, generator=g), q_sin=torch.randn(B, S, H, D // 2, generator=g),
                      k_cos=torch.randn(1, Sk, 1, D // 2, generator=g), k_sin=torch.randn(1, Sk, 1, D // 2, generator=g))
    want_q = float64_chain(q, wq, tables.get("q_cos"), tables.get("q_sin"), D, rope, 1e-6)
    want_k = float64_chain(k, wk, tables.get("k_cos"), tables.get("k_sin"), D, rope, 1e-6)
    for rounding, ulps in (("fp32", 1.0), ("rounded", 4.0)):
        q2, k2 = q.clone(), k.clone()
        ops.cross_head_qknorm_rope(q2, k2, wq, wk, **tables, head_dim=D, rope=rope, rounding=rounding)
        assert ditops.torch.last_dispatch().ran == "cross_head_qknorm_rope.reference"
        # fp32: one rounding of an fp32 computation; rounded: the norm rounded before RoPE too
        # (its error times |cos| + |sin| <= 2 with these random tables, plus the final rounding).
        assert bf16_ulps(q2, want_q.to(torch.bfloat16).double()) <= ulps
        assert bf16_ulps(k2, want_k.to(torch.bfloat16).double()) <= ulps


def test_rounded_mode_rounds_the_norm_before_rope():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 64, 256, generator=g).to(torch.bfloat16)
    cos, sin, c, s = wan_tables(64, 128)
    out = {}
    for rounding in ("rounded", "fp32"):
        a, b = q.clone(), q.clone()
        ops.cross_head_qknorm_rope(a, b, None, None, c, s, head_dim=128, rounding=rounding)
        out[rounding] = a
    # The eager chain on the CPU in fp32 with the norm rounded: the rounded mode's formula.
    qn = torch.nn.functional.rms_norm(q.float(), (256,), None, 1e-6).to(torch.bfloat16)
    eager = cross_head_rope_eager(qn, c, s, 128, "interleaved")
    assert bf16_ulps(out["rounded"], eager) <= 1.0
    assert not torch.equal(out["rounded"], out["fp32"])  # the two modes differ somewhere


def test_k_takes_q_tables_when_it_has_none():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 6, 512, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 6, 512, generator=g).to(torch.bfloat16)
    cos, sin = torch.randn(1, 6, 4, 64, generator=g), torch.randn(1, 6, 4, 64, generator=g)
    a, b = q.clone(), k.clone()
    ops.cross_head_qknorm_rope(a, b, None, None, cos, sin, head_dim=128, rope="split")
    c, d = q.clone(), k.clone()
    ops.cross_head_qknorm_rope(c, d, None, None, cos, sin, cos, sin, head_dim=128, rope="split")
    assert torch.equal(a, c) and torch.equal(b, d)


def test_eager_chain_is_ltx2_rope():
    """cross_head_rope_eager with the op's table views computes what LTX-2's own RoPE functions do
    (diffusers' transformer_ltx2), for the split and the interleaved form."""
    ltx2 = pytest.importorskip("diffusers.models.transformers.transformer_ltx2", reason="needs diffusers")
    g = torch.Generator().manual_seed(11)
    B, T, H, D = 2, 7, 4, 64
    x = torch.randn(B, T, H * D, generator=g).to(torch.bfloat16)
    # split: [B, H, T, D/2] tables; the op reads them as [B, T, H, D/2]
    cos, sin = torch.randn(B, H, T, D // 2, generator=g), torch.randn(B, H, T, D // 2, generator=g)
    want = ltx2.apply_split_rotary_emb(x, (cos, sin))
    got = cross_head_rope_eager(x, cos.transpose(1, 2), sin.transpose(1, 2), D, "split")
    assert bf16_ulps(got, want) <= 1.0
    # interleaved: full-width [B, T, H*D] tables, each frequency twice; the op reads every other one
    cos = torch.randn(B, T, H * D // 2, generator=g).repeat_interleave(2, -1)
    sin = torch.randn(B, T, H * D // 2, generator=g).repeat_interleave(2, -1)
    want = ltx2.apply_interleaved_rotary_emb(x, (cos, sin))
    got = cross_head_rope_eager(x, cos[..., 0::2].unflatten(-1, (H, D // 2)), sin[..., 0::2].unflatten(-1, (H, D // 2)),
                                D, "interleaved")
    assert bf16_ulps(got, want) <= 1.0


def test_eager_chain_matches_the_reference_on_wan_tables():
    g = torch.Generator().manual_seed(13)
    S, H, D = 9, 3, 128
    q = torch.randn(1, S, H * D, generator=g).to(torch.bfloat16)
    k = torch.randn(1, S, H * D, generator=g).to(torch.bfloat16)
    w = (1 + 0.25 * torch.randn(H * D, generator=g)).to(torch.bfloat16)
    _, _, c, s = wan_tables(S, D)
    want_q, want_k = cross_head_qknorm_rope_eager(q, k, w, w, c, s, head_dim=D)
    ops.cross_head_qknorm_rope(q, k, w, w, c, s, head_dim=D)
    assert bf16_ulps(q, want_q) <= 1.0 and bf16_ulps(k, want_k) <= 1.0


def test_bad_tables_raise_and_write_nothing():
    q = torch.randn(1, 4, 256).to(torch.bfloat16)
    k = q.clone() + 1
    before = (q.clone(), k.clone())
    with pytest.raises(ditops.Error, match=r"q_cos.shape\[3\] must be 64 \(head_dim / 2\) but is 32"):
        ops.cross_head_qknorm_rope(q, k, None, None, torch.zeros(1, 4, 1, 32), torch.zeros(1, 4, 1, 32),
                                   head_dim=128)
    with pytest.raises(ditops.Error, match="needs q_cos and q_sin"):
        ops.cross_head_qknorm_rope(q, k, None, None, head_dim=128, rope="split")
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
