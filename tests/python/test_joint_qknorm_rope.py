"""joint_qknorm_rope through torch.ops.ditops: on the CPU (its reference) against qknorm_rope per
stream followed by the concatenation, on fused-projection views without a copy, traced by
torch.compile(fullgraph=True), and its refusals; on CUDA torch.equal against the dual-stream chain
FLUX.1's and FLUX.2's processors run (torch.nn.RMSNorm per stream, torch.cat, diffusers'
apply_rotary_emb) at their widths, under torch.compile and inside a captured CUDA graph (skipped
without a device). The driver's cases (tests/cases/joint_qknorm_rope_cases.cpp) check the
reference against float64 math and the V copy bit for bit."""
import pytest

from conftest import needs_cuda_mark

torch = pytest.importorskip("torch", reason="the op's torch tests need PyTorch")
import ditops  # noqa: E402
import ditops.torch  # noqa: E402,F401
from ditops.eager import joint_qknorm_rope_eager  # noqa: E402

ops = torch.ops.ditops
needs_cuda = needs_cuda_mark(torch)


def flux_rope(S, D, device="cpu"):
    """FLUX's rotary table as diffusers builds it: float32 cos/sin [S, D], each frequency twice."""
    t = torch.arange(S, dtype=torch.float64, device=device)[:, None]
    inv = 2000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64, device=device) / D)
    return ((t * inv).cos().repeat_interleave(2, -1).float(), (t * inv).sin().repeat_interleave(2, -1).float())


def streams(B, S1, S2, H, D, fused=False, device="cpu", seed=0):
    """q, k, v of both streams ([B, S, H, D]); fused: thirds of one [B, S, 3 H D] projection each (the
    fused to_qkv / to_added_qkv: token-strided views)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def one(S):
        if fused:
            qkv = torch.randn(B, S, 3 * H * D, generator=g, device=device).bfloat16()
            return [t.unflatten(-1, (H, D)) for t in qkv.chunk(3, -1)]
        return [torch.randn(B, S, H, D, generator=g, device=device).bfloat16() for _ in range(3)]

    weights = [(1 + 0.3 * torch.randn(D, generator=g, device=device)).bfloat16() for _ in range(4)]
    return one(S1) + one(S2), weights


def joint_call(x, w, cos, sin, **options):
    cache = torch.cat([cos, sin], -1)
    positions = torch.arange(cos.shape[0], device=cos.device)
    return ops.joint_qknorm_rope(*x, *w, cache, positions, cache_full_width=True, **options)


def model_chain(x, w, cos, sin, eps=1e-6):
    """Flux2AttnProcessor / FluxAttnProcessor: RMSNorm per stream, cat([text, image]), RoPE."""
    from diffusers.models.embeddings import apply_rotary_emb
    q1, k1, v1, q2, k2, v2 = x
    D = q1.shape[-1]
    norm = lambda t, weight: torch.nn.functional.rms_norm(t, (D,), weight, eps)  # noqa: E731 (torch.nn.RMSNorm)
    q = torch.cat([norm(q1, w[0]), norm(q2, w[2])], dim=1)
    k = torch.cat([norm(k1, w[1]), norm(k2, w[3])], dim=1)
    v = torch.cat([v1, v2], dim=1)
    return apply_rotary_emb(q, (cos, sin), sequence_dim=1), apply_rotary_emb(k, (cos, sin), sequence_dim=1), v


# ---------------------------------------------------------------- CPU (the reference)

@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused_qkv"])
def test_reference_is_qknorm_rope_per_stream_then_the_concatenation(fused):
    B, S1, S2, H, D = 2, 5, 11, 3, 128
    x, w = streams(B, S1, S2, H, D, fused)
    cos, sin = flux_rope(S1 + S2, D)
    q, k, v = joint_call(x, w, cos, sin)
    assert ditops.torch.last_dispatch().ran == "joint_qknorm_rope.reference"
    assert q.shape == (B, S1 + S2, H, D) and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    cache = torch.cat([cos, sin], -1)
    want = []
    for which, first, S in ((0, 0, S1), (1, S1, S2)):
        qs, ks = (x[3 * which].contiguous().flatten(0, 1).clone(), x[3 * which + 1].contiguous().flatten(0, 1).clone())
        positions = torch.arange(first, first + S).repeat(B)
        ops.qknorm_rope(qs, ks, w[2 * which], w[2 * which + 1], cache, positions, cache_full_width=True)
        want.append((qs.unflatten(0, (B, S)), ks.unflatten(0, (B, S))))
    assert torch.equal(q, torch.cat([want[0][0], want[1][0]], 1))
    assert torch.equal(k, torch.cat([want[0][1], want[1][1]], 1))
    assert torch.equal(v, torch.cat([x[2], x[5]], 1))


def test_fused_projection_views_are_read_in_place():
    """q, k, v of a fused projection are token-strided views: the op reads them as they are (same
    values as contiguous copies) and leaves the projection untouched."""
    x, w = streams(1, 4, 12, 2, 64, fused=True, seed=3)
    assert x[0].stride(1) == 3 * 2 * 64
    before = [t.clone() for t in x]
    cos, sin = flux_rope(16, 64)
    fused = joint_call(x, w, cos, sin)
    separate = joint_call([t.contiguous() for t in x], w, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(fused, separate))
    assert all(torch.equal(a, b) for a, b in zip(x, before))


def test_eager_chain_is_the_model_chain():
    """ditops.eager's chain (the torch op's fallback and the bench's oracle) is the processors'
    chain: the same ops on the same values."""
    pytest.importorskip("diffusers", reason="needs diffusers")
    x, w = streams(2, 3, 9, 2, 128, seed=5)
    cos, sin = flux_rope(12, 128)
    cache, positions = torch.cat([cos, sin], -1), torch.arange(12)
    got = joint_qknorm_rope_eager(*x, *w, cache, positions, 128, False, 1e-6, True)
    assert all(torch.equal(a, b) for a, b in zip(got, model_chain(x, w, cos, sin)))


def test_compile_fullgraph_traces_the_op():
    x, w = streams(1, 3, 5, 2, 64, seed=7)
    cos, sin = flux_rope(8, 64)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def f(*args):
        q, k, v = joint_call(args[:6], args[6:10], cos, sin)
        return q + 1, k, v

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, fullgraph=True, backend=recording)(*x, *w)
    finally:
        torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(compiled, f(*x, *w)))
    assert "ditops.joint_qknorm_rope" in targets, targets


def test_bad_arguments_raise_naming_the_tensor():
    x, w = streams(1, 2, 3, 2, 128)
    cos, sin = flux_rope(5, 128)
    cache = torch.cat([cos, sin], -1)
    with pytest.raises(ditops.Error, match=r"positions.shape\[0\] must equal S1\+S2=5"):
        ops.joint_qknorm_rope(*x, *w, cache, torch.arange(4), cache_full_width=True)
    bad = list(x)
    bad[4] = x[4][:, :, :1]  # k2 with one head
    with pytest.raises(ditops.Error, match=r"k2.shape\[2\] must equal H=2"):
        ops.joint_qknorm_rope(*bad, *w, cache, torch.arange(5), cache_full_width=True)
    with pytest.raises(ditops.Error, match="head_dim"):
        ops.joint_qknorm_rope(*[t[..., :96] for t in x], *[t[:96] for t in w], cache[:, :192], torch.arange(5),
                              cache_full_width=True)


# ---------------------------------------------------------------- CUDA: torch.equal to the model's chain

SHAPES = {  # (B, S1 text, S2 image, H): FLUX.1 and FLUX.2-klein 4B (24 x 128), FLUX.2-dev (48 x 128)
    "flux1": (1, 512, 4096, 24),
    "flux2_dev": (1, 512, 4096, 48),
    "flux2_klein_9b": (1, 512, 1024, 32),
    "batch2": (2, 77, 256, 24),
}


@needs_cuda
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused_qkv"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_gpu_equals_the_model_chain(shape, fused):
    pytest.importorskip("diffusers", reason="needs diffusers")
    B, S1, S2, H = SHAPES[shape]
    x, w = streams(B, S1, S2, H, 128, fused, device="cuda", seed=11)
    cos, sin = flux_rope(S1 + S2, 128, "cuda")
    got = joint_call(x, w, cos, sin)
    assert ditops.torch.last_dispatch().ran == "joint_qknorm_rope.jit"
    want = model_chain(x, w, cos, sin)
    for name, a, b in zip("qkv", got, want):
        assert torch.equal(a, b), (name, int((a != b).sum()))


@needs_cuda
def test_gpu_under_compile_and_in_a_captured_graph():
    """torch.compile(fullgraph=True) around the op (inductor compiles the glue, the op stays opaque)
    and a CUDA graph of the call replayed on new inputs: both torch.equal to the model's chain."""
    pytest.importorskip("diffusers", reason="needs diffusers")
    B, S1, S2, H = SHAPES["flux1"]
    x, w = streams(B, S1, S2, H, 128, device="cuda", seed=13)
    cos, sin = flux_rope(S1 + S2, 128, "cuda")
    cache, positions = torch.cat([cos, sin], -1), torch.arange(S1 + S2, device="cuda")

    def f(*args):
        return ops.joint_qknorm_rope(*args, *w, cache, positions, cache_full_width=True)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, fullgraph=True)(*x)
    finally:
        torch._dynamo.reset()
    want = model_chain(x, w, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(compiled, want))

    static = [t.clone() for t in x]
    f(*static)  # compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(*static)
    for seed in (17, 19):
        fresh, _ = streams(B, S1, S2, H, 128, device="cuda", seed=seed)
        for s, t in zip(static, fresh):
            s.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        want = model_chain(fresh, w, cos, sin)
        assert all(torch.equal(a, b) for a, b in zip(out, want)), seed
