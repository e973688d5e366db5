"""ditops.diffusers on a tiny random FLUX.2 (Flux2Transformer2DModel; no hub access): the sites plan
and enable find (counts from the config, FLUX.2-dev and klein widths planned on the meta device),
exact restoration by disable, the fallback paths (a first-sight mismatch, a failing op, calls that
do not fit: the model's values bit for bit), the single blocks' q and k taken as strided chunks of
the fused projection, the KV-cache processors left to the model, torch.compile(fullgraph=True)
tracing the ops, the CPU reference backend against the unpatched model; on CUDA (skipped without
a device) patched == unpatched bit for bit (random norm weights and modulation), compiled, and
captured in CUDA graphs. Skipped without PyTorch or diffusers."""
import warnings

import pytest

from conftest import diffusers_or_skip, needs_cuda_mark

torch, diffusers = diffusers_or_skip()
import ditops  # noqa: E402
import ditops.diffusers as dd  # noqa: E402
from ditops.diffusers import _sites  # noqa: E402


from diffusers.models.transformers import transformer_flux2  # noqa: E402
from test_diffusers import Perturbing  # noqa: E402

STRICT, CLOSE = "exact", "high"
OPS = {"qk_norm_rope (dual-stream)": "joint_qknorm_rope", "qk_norm_rope": "qknorm_rope",
       "adaln_modulate": "layernorm_modulate", "gated_residual": "residual_gate_add",
       "adaln_modulate (residual + norm2)": "norm_scale_shift", "swiglu (ff)": "swiglu", "swiglu (single block cat)": "swiglu", "rope_tables (pos_embed)": "rope_tables"}


def counts(L, N):
    return {"qk_norm_rope (dual-stream)": L, "qk_norm_rope": N, "adaln_modulate": 2 * L + N + 1,
            "gated_residual": 2 * L + N, "adaln_modulate (residual + norm2)": 2 * L, "swiglu (ff)": 2 * L,
            "swiglu (single block cat)": N,
            "rope_tables (pos_embed)": 2}  # the image ids' and the text ids' tables


def randomize(model, seed=0):
    """Every weight random: norm weights around 1 (where the norms' rounding orders part ways), the
    modulation projections (so scale, shift and gate are far from 0), the linear layers."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                torch.nn.init.normal_(p, mean=1.0, std=0.3, generator=gen)
            elif "modulation" in name:
                torch.nn.init.normal_(p, std=0.3, generator=gen)
            else:
                torch.nn.init.normal_(p, std=0.05, generator=gen)
    return model


def ids(grid):
    """FLUX.2's 4-axis position ids (t, h, w, l) of a grid [(extent per axis)]."""
    axes = torch.meshgrid(*[torch.arange(float(n)) for n in grid], indexing="ij")
    return torch.stack(axes, -1).reshape(-1, 4)


def tiny_flux2(dtype=torch.bfloat16, batch=1, guidance=True, fused_qkv=False, text=8, seed=0):
    """2 double and 2 single blocks of 2 heads x 64 (RoPE axes 4 x 16), 16 image + `text` text tokens;
    guidance=False: klein's configuration (no guidance embedder)."""
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=64, num_attention_heads=2,
        joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(16, 16, 16, 16),
        guidance_embeds=guidance)
    with warnings.catch_warnings():  # "modules that should be kept in float32": there are none
        warnings.simplefilter("ignore")
        model = randomize(model, seed).to(dtype)
    if fused_qkv:
        model.fuse_qkv_projections()
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = dict(hidden_states=torch.randn(batch, 16, 8, generator=gen).to(dtype),
                  encoder_hidden_states=torch.randn(batch, text, 32, generator=gen).to(dtype),
                  timestep=torch.full((batch,), 0.5).to(dtype), img_ids=ids((1, 4, 4, 1)),
                  txt_ids=ids((1, 1, 1, text)), return_dict=False)
    if guidance:
        inputs["guidance"] = torch.full((batch,), 3.5).to(dtype)
    return model, inputs


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


def snapshot(model):
    """Every module's attributes and registered children, parameters and buffers, by identity."""
    return {name: ({k: v for k, v in module.__dict__.items()},
                   {k: dict(getattr(module, k)) for k in ("_parameters", "_buffers", "_modules")})
            for name, module in model.named_modules()}


def assert_same(before, after):
    assert before.keys() == after.keys()
    for name, (attrs, regs) in before.items():
        attrs_a, regs_a = after[name]
        assert attrs.keys() == attrs_a.keys(), (name, attrs.keys() ^ attrs_a.keys())
        assert all(attrs[k] is attrs_a[k] for k in attrs), name
        for kind in regs:
            assert regs[kind].keys() == regs_a[kind].keys() and all(
                regs[kind][k] is regs_a[kind][k] for k in regs[kind]), (name, kind)


# ---------------------------------------------------------------- plan, enable, disable


def test_plan_finds_the_sites_and_changes_nothing():
    model, _ = tiny_flux2()
    before = snapshot(model)
    report = dd.plan(model)
    assert_same(before, snapshot(model))
    assert not report.patched and report.model_class == "Flux2Transformer2DModel"
    assert {s.name: len(s.places) for s in report.sites} == counts(2, 2)
    assert {s.name: s.op for s in report.sites} == OPS
    assert report["qk_norm_rope (dual-stream)"].places[0] == "transformer_blocks.0.attn (text + image)"
    assert report["qk_norm_rope (dual-stream)"].options == {"norm_weight_rounding": "once"}
    text = str(report)
    assert all(s.name in text for s in report.sites)


@pytest.mark.parametrize("widths", ["dev", "klein_4b", "klein_9b"])
def test_real_widths_plan_on_the_meta_device(widths):
    """FLUX.2-dev (48 x 128 heads, hidden 6144, MLP 18432 after SwiGLU) and klein's widths (24 and
    32 heads of 128): every site maps (the plan reads modules only, no weights)."""
    config = {"dev": dict(num_attention_heads=48, joint_attention_dim=15360),
              "klein_4b": dict(num_attention_heads=24, joint_attention_dim=7680, guidance_embeds=False),
              "klein_9b": dict(num_attention_heads=32, joint_attention_dim=12288, guidance_embeds=False)}[widths]
    with torch.device("meta"):
        model = diffusers.Flux2Transformer2DModel(num_layers=2, num_single_layers=3, **config)
    single = model.single_transformer_blocks[0].attn
    assert single.mlp_hidden_dim == 3 * model.inner_dim  # SwiGLU halves 2 x 3 x hidden
    report = dd.plan(model)
    assert {s.name: len(s.places) for s in report.sites} == counts(2, 3)
    assert {s.name: s.op for s in report.sites} == OPS


@pytest.mark.filterwarnings("ignore:ditops.diffusers:RuntimeWarning")  # CPU: the close reference is not used
def test_enable_disable_restores_exactly():
    model, inputs = tiny_flux2()
    reference = run(model, inputs)
    before = snapshot(model)
    state = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    report = dd.enable(model, allow_cpu=True)
    assert report.patched and {s.name: len(s.places) for s in report.sites} == counts(2, 2)
    processors = {type(b.attn.processor).__name__ for b in (*model.transformer_blocks, *model.single_transformer_blocks)}
    assert processors == {"Flux2AttnProcessorDitops", "Flux2ParallelSelfAttnProcessorDitops"}
    run(model, inputs)
    assert dd.disable(model) is report and dd.enabled(model) is None
    assert_same(before, snapshot(model))
    after = model.state_dict()
    assert all(after[k].data_ptr() == p and torch.equal(after[k], v) for k, (p, v) in state.items())
    assert torch.equal(run(model, inputs), reference)


@pytest.mark.parametrize("variant", ["dev", "klein", "fused_qkv", "batch2"])
def test_cpu_reference_backend_against_the_unpatched_model(variant):
    """The ops' CPU reference in the strict tier (first sight decides) and a close tier (the ops'
    values kept). The references follow the CUDA kernels' order, not CPU PyTorch's: close, and the
    max difference is printed."""
    model, inputs = tiny_flux2(guidance=variant != "klein", fused_qkv=variant == "fused_qkv",
                               batch=2 if variant == "batch2" else 1)
    reference = run(model, inputs)
    for quality in (STRICT, CLOSE):
        report = dd.enable(model, quality, allow_cpu=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = run(model, inputs)
        dd.disable(model)
        diff = float((out.float() - reference.float()).abs().max())
        print(f"{variant} {quality}: max |patched - unpatched| = {diff:.3g}")
        assert diff <= 0.05 * float(reference.float().abs().max())
        for site in report.sites:
            if quality == CLOSE:
                assert site.fused_calls == len(site.places), site.name  # every call fits at every place
            else:
                assert site.fused_calls > 0 or all("not bit_exact" in why for why in site.fallbacks), site.name
            assert not site.fallbacks or quality == STRICT, (site.name, dict(site.fallbacks))


@pytest.mark.parametrize("fail", [False, True], ids=["mismatch", "op_error"])
def test_first_sight_failure_falls_back_to_the_model_values(monkeypatch, fail):
    model, inputs = tiny_flux2()
    reference = run(model, inputs)
    ops = Perturbing(fail)
    monkeypatch.setattr(_sites, "ops", ops)
    monkeypatch.setattr(_sites, "_contract", lambda implementation: "bit_exact")  # as on a GPU
    report = dd.enable(model, allow_cpu=True)
    with pytest.warns(RuntimeWarning, match="disabling"):
        out = run(model, inputs)
    assert torch.equal(out, reference) and ops.calls > 0
    for site in report.sites:
        assert site.reasons and site.fused_calls == 0, site.name
        assert ("simulated launch failure" if fail else "differ from the model's chain") in \
            next(iter(site.reasons.values()))
    calls = ops.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # decided: no new warnings, no op calls
        assert torch.equal(run(model, inputs), reference)
    assert ops.calls == calls


def test_calls_that_do_not_fit_fall_back_per_call():
    """FLUX.2 in float32: the QK ops (16-bit) and layernorm_modulate (bf16) do not fit, residual_gate_add
    takes float32: each call decides, the output is the model's."""
    model, inputs = tiny_flux2(torch.float32)
    reference = run(model, inputs)
    report = dd.enable(model, allow_cpu=True)
    with pytest.warns(RuntimeWarning, match="runs the model's code for a call"):
        out = run(model, inputs)
    assert torch.equal(out, reference)
    for name in ("qk_norm_rope (dual-stream)", "qk_norm_rope", "adaln_modulate"):
        site = report[name]
        assert site.fused_calls == 0 and sum(site.fallbacks.values()) == len(site.places), name
    assert any("q1.dtype must be bf16 or f16 but is f32" in why  # the op's matcher
               for why in report["qk_norm_rope (dual-stream)"].fallbacks)
    assert report["gated_residual"].fused_calls == len(report["gated_residual"].places)


def test_decisions_are_made_once_per_signature(monkeypatch):
    model, inputs = tiny_flux2()
    report = dd.enable(model, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run(model, inputs)
    assert report["qk_norm_rope (dual-stream)"].implementations
    asked = []
    monkeypatch.setattr(ditops, "explain", lambda *a, **k: asked.append(a[0]))
    run(model, inputs)
    assert asked == []


def test_single_stream_q_and_k_are_strided_chunks_taken_in_place():
    """The single blocks' q and k are chunks of to_qkv_mlp_proj's output (rows of 3 inner + 2 mlp
    elements): the qk site fits them as they are (no copy: the op writes the projection's q and k
    columns) and leaves v and the MLP columns as they were."""
    model, inputs = tiny_flux2()
    attn = model.single_transformer_blocks[0].attn
    seen = []
    original = _sites.MappedSite.__call__

    def spy(self, chain, *args):
        if self.name != "qk_norm_rope":
            return original(self, chain, *args)
        q, k = args[:2]
        base = q._base if q._base is not None else q
        seen.append((q.stride(), k.stride(), q.data_ptr() - base.data_ptr(), base.clone(), self.mapping.fit(*args)))
        out = original(self, chain, *args)
        seen[-1] += (base,)
        return out

    _sites.MappedSite.__call__ = spy
    try:
        dd.enable(model, CLOSE, allow_cpu=True)
        run(model, inputs)
    finally:
        _sites.MappedSite.__call__ = original
    row = 3 * attn.inner_dim + attn.mlp_hidden_dim * attn.mlp_mult_factor
    assert len(seen) == 2
    for q_stride, k_stride, offset, before, why, after in seen:
        assert q_stride == (24 * row, row, 64, 1) and k_stride == q_stride and offset == 0
        assert why == ""
        inner = attn.inner_dim
        assert torch.equal(after[..., 2 * inner:], before[..., 2 * inner:])  # v and the MLP columns
        assert not torch.equal(after[..., :2 * inner], before[..., :2 * inner])  # q and k, normalized in place


def test_swiglu_sites_take_the_feed_forward_act_and_write_the_single_blocks_cat(monkeypatch):
    """The feed-forwards' act runs swiglu on linear_in's output; the single blocks' act reads the MLP
    columns of to_qkv_mlp_proj's output as they are (a column slice, no copy) and writes the whole
    [B, S, D + H] buffer to_out reads, the attention output (its prefix) in the same pass: the
    processor's torch.cat is gone."""
    model, inputs = tiny_flux2()
    attn = model.single_transformer_blocks[0].attn
    seen = []

    class Recording:
        def __getattr__(self, name):
            op = getattr(torch.ops.ditops, name)

            def call(*args, **kwargs):
                if name == "swiglu":
                    x, out = args[:2]
                    prefix = args[2] if len(args) > 2 else kwargs.get("prefix")
                    seen.append((x.shape, x.stride(), out.shape, out.stride(), out.storage_offset(),
                                 out.untyped_storage().nbytes() // out.element_size(),
                                 None if prefix is None else prefix.shape))
                return op(*args, **kwargs)
            return call

    reference = run(model, inputs)
    monkeypatch.setattr(_sites, "ops", Recording())
    report = dd.enable(model, CLOSE, allow_cpu=True)
    out = run(model, inputs)  # the close tier's bound against the unpatched model, as the reference-backend test's
    assert float((out.float() - reference.float()).abs().max()) <= 0.05 * float(reference.float().abs().max())
    assert report["swiglu (ff)"].fused_calls == 4 and report["swiglu (single block cat)"].fused_calls == 2
    D, H = attn.inner_dim, attn.mlp_hidden_dim
    row = 3 * D + 2 * H
    ff = [c for c in seen if c[1][-2] == c[0][-1] and c[-1] is None]  # contiguous x: the feed-forwards
    single = [c for c in seen if c[1][-2] == row]
    assert len(ff) == 4 and len(single) == 2  # one forward: each place once
    for x_shape, x_stride, out_shape, out_stride, offset, elements, prefix_shape in single:
        assert x_shape[-1] == 2 * H and out_shape[-1] == D + H and prefix_shape[-1] == D
        assert out_stride[-2] == D + H and offset == 0  # the whole cat buffer, the attention output first
        assert elements == x_shape[0] * x_shape[1] * (D + H)  # the whole buffer, nothing else
    assert report["swiglu (single block cat)"].places == [
        "single_transformer_blocks.0.attn (cat attn + swiglu mlp)", "single_transformer_blocks.1.attn (cat attn + swiglu mlp)"]


def test_rope_tables_site_builds_the_image_and_text_tables():
    """Flux2PosEmbed (model.pos_embed, called for the image ids and the text ids) is the rope_tables
    site over its axes_dim. Close tier (the op's CPU reference): the tables within a float32 ulp of
    the module's own forward (2^-10 below it), the model's output within the CPU tests' bound of the
    unpatched one. Exact tier: on the CPU the reference is close, so the site is unfit and the
    module's own code runs (the output is the unpatched one)."""
    model, inputs = tiny_flux2()
    reference = run(model, inputs)
    site = dd.plan(model)["rope_tables (pos_embed)"]
    assert site.op == "rope_tables" and site.places == ["pos_embed (img_ids)", "pos_embed (txt_ids)"]
    assert "Flux2PosEmbed.forward" in site.chain
    cls = type(model.pos_embed)
    ids_list = [ids((1, 5, 7, 1)), ids((1, 1, 1, 300)), torch.tensor([[1e4, -1e4, -3.5, 65535.0]] * 3),
                torch.randn(6, 5) * 100]  # the last: more columns than axes (the first four are read)
    report = dd.enable(model, CLOSE, allow_cpu=True, sites=["rope_tables"])
    for x in ids_list:
        got, want = model.pos_embed(x), cls.forward(model.pos_embed, x)
        for a, b in zip(got, want):
            assert a.dtype == torch.float32 and a.shape == b.shape
            ulp = torch.ldexp(torch.ones_like(b, dtype=torch.float64),
                              torch.frexp(b.double().abs().clamp_min(2.0 ** -10))[1] - 24)
            assert bool(((a.double() - b.double()).abs() <= ulp).all())
    out = run(model, inputs)
    rope = report["rope_tables (pos_embed)"]
    assert rope.fused_calls == len(ids_list) + 2 and not rope.reasons and not rope.unfit
    diff = float((out.float() - reference.float()).abs().max())
    print(f"flux2 rope_tables high: max |patched - unpatched| = {diff:.3g}")
    assert diff <= 0.05 * float(reference.float().abs().max())
    dd.disable(model)

    report = dd.enable(model, STRICT, allow_cpu=True, sites=["rope_tables"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = run(model, inputs)
    rope = report["rope_tables (pos_embed)"]
    assert rope.fused_calls == 0 and len(rope.unfit) == 2  # the image and the text signatures
    assert all("not bit_exact" in why for why in rope.unfit.values()), rope.unfit
    assert torch.equal(out, reference)


def test_kv_cache_processors_stay_the_model_code():
    """Klein KV's processors (its pipeline installs them) are left as they are, listed under the QK
    sites; the blocks' adaLN and residual sites still serve."""
    model, inputs = tiny_flux2(guidance=False)
    for block in model.transformer_blocks:
        block.attn.set_processor(transformer_flux2.Flux2KVAttnProcessor())
    for block in model.single_transformer_blocks:
        block.attn.set_processor(transformer_flux2.Flux2KVParallelSelfAttnProcessor())
    reference = run(model, inputs)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    for name, cls in (("qk_norm_rope (dual-stream)", "Flux2KVAttnProcessor"),
                      ("qk_norm_rope", "Flux2KVParallelSelfAttnProcessor")):
        assert len(report[name].skipped) == 2 and all(cls in why for _, why in report[name].skipped), name
    out = run(model, inputs)
    assert report["qk_norm_rope (dual-stream)"].fused_calls == 0
    assert report["gated_residual"].fused_calls == len(report["gated_residual"].places)
    assert float((out.float() - reference.float()).abs().max()) <= 0.05 * float(reference.float().abs().max())
    dd.disable(model)
    assert isinstance(model.transformer_blocks[0].attn.processor, transformer_flux2.Flux2KVAttnProcessor)


def test_kv_extract_step_with_per_token_modulation_takes_the_model_chain_per_call():
    """Klein KV's extract step with reference tokens blends a per-token [B, S, D] image modulation:
    its norm2 calls leave the fused residual + norm2 site for the gated residual and the adaLN chain
    (the text stream's per-batch ones still fuse), and the output is the model's."""
    model, inputs = tiny_flux2(guidance=False)
    for block in model.transformer_blocks:
        block.attn.set_processor(transformer_flux2.Flux2KVAttnProcessor())
    for block in model.single_transformer_blocks:
        block.attn.set_processor(transformer_flux2.Flux2KVParallelSelfAttnProcessor())
    inputs = dict(inputs, kv_cache_mode="extract", num_ref_tokens=3)
    reference = run(model, inputs)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = run(model, inputs)
    fused = report["adaln_modulate (residual + norm2)"]
    assert fused.fused_calls == len(model.transformer_blocks), fused.fused_calls  # the text streams
    assert report["adaln_modulate"].unfit, "the image stream's per-token norm2 falls back per call"
    assert out.shape == reference.shape
    assert float((out.float() - reference.float()).abs().max()) <= 0.05 * float(reference.float().abs().max())


def test_compile_fullgraph_traces_the_ops():
    """After one eager call verified the signatures, the whole tiny forward traces with fullgraph=True
    (a recording backend: no inductor compile) and the graph holds the seven ops."""
    model, inputs = tiny_flux2()
    dd.enable(model, CLOSE, allow_cpu=True)
    eager = run(model, inputs)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled = torch.compile(model, fullgraph=True, backend=recording)(**inputs)[0]
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, eager)
    ours = sorted({t for t in targets if t.startswith("ditops.")})
    assert ours == ["ditops.joint_qknorm_rope", "ditops.layernorm_modulate", "ditops.norm_scale_shift",
                    "ditops.qknorm_rope", "ditops.residual_gate_add", "ditops.rope_tables", "ditops.swiglu"], targets


# ---------------------------------------------------------------- GPU (torch.equal on CUDA)

needs_cuda = needs_cuda_mark(torch)
GPU_VARIANTS = {"dev": {}, "klein": dict(guidance=False), "fused_qkv": dict(fused_qkv=True),
                "long_text": dict(text=77)}


def on_cuda(model, inputs):
    return model.to("cuda"), {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in inputs.items()}


@needs_cuda
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("variant", sorted(GPU_VARIANTS))
def test_gpu_patched_equals_unpatched(variant, batch):
    model, inputs = on_cuda(*tiny_flux2(batch=batch, **GPU_VARIANTS[variant]))
    reference = run(model, inputs)
    report = dd.enable(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = run(model, inputs), run(model, inputs)
    print(report)
    assert torch.equal(first, reference) and torch.equal(second, reference)
    disabled = {s.name: s.reasons for s in report.sites if s.reasons}
    assert not disabled, disabled  # every mapped site verified bit-exact at first sight
    for site in report.sites:
        assert site.fused_calls == 2 * len(site.places), (site.name, site.fused_calls, dict(site.fallbacks))
    assert not [w for w in caught if "ditops" in str(w.message)], [str(w.message) for w in caught]
    dd.disable(model)
    assert torch.equal(run(model, inputs), reference)


@needs_cuda
def test_gpu_compile_fullgraph_runs_the_ops():
    """Under inductor (fullgraph) the sites stay the ditops custom ops in the graph inductor
    compiles, and the compiled forward gives the same bytes call after call. Inductor fuses the
    model's own glue with other roundings, which this tiny random model amplifies (compile alone,
    bf16: 1.27 from eager at a largest magnitude of 3.2, 40 % of the norm; float32: 4e-6), so the
    bound is compile's own: with ditops no further from eager than twice the unpatched model's
    compiled output (or the close tier's 5 % of eager's largest magnitude where that is larger)."""
    from torch._inductor.compile_fx import compile_fx
    model, inputs = on_cuda(*tiny_flux2())
    eager = run(model, inputs)

    def compiled_twice():
        targets = []

        def recording(gm, example_inputs):
            targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return compile_fx(gm, example_inputs)

        torch._dynamo.reset()
        try:
            with torch.no_grad():
                compiled = torch.compile(model, fullgraph=True, backend=recording)
                out, again = (compiled(**inputs)[0] for _ in range(2))
        finally:
            torch._dynamo.reset()
        return out, again, sorted({t for t in targets if t.startswith("ditops.")})

    plain, _, _ = compiled_twice()
    dd.enable(model)
    assert torch.equal(run(model, inputs), eager)  # the warm-up: first sight runs outside tracing
    out, again, ours = compiled_twice()
    diff, plain_diff = (float((o.float() - eager.float()).abs().max()) for o in (out, plain))
    print(f"flux2: max |compiled - eager| with ditops {diff:.3g}, without {plain_diff:.3g}")
    assert ours == ["ditops.joint_qknorm_rope", "ditops.layernorm_modulate", "ditops.norm_scale_shift",
                    "ditops.qknorm_rope", "ditops.residual_gate_add", "ditops.rope_tables", "ditops.swiglu"]
    assert torch.equal(out, again)
    assert diff <= max(2 * plain_diff, 0.05 * float(eager.float().abs().max()))


@needs_cuda
@pytest.mark.parametrize("with_ditops", [False, True], ids=["graph", "ditops+graph"])
def test_gpu_captured_equals_eager(with_ditops):
    """enable(cuda_graph=True) / capture(): the first call eager, the second captured, then replays on
    new inputs, torch.equal to the unpatched eager model."""
    model, _ = on_cuda(*tiny_flux2())
    steps = [on_cuda(model, tiny_flux2(seed=s)[1])[1] for s in range(4)]
    reference = [run(model, s) for s in steps]
    if with_ditops:
        state = dd.enable(model, cuda_graph=True).graphs[type(model).__name__]
    else:
        state = dd.capture(model)[type(model).__name__]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, s) for s in steps]
    assert not [str(w.message) for w in caught if "ditops" in str(w.message)]
    assert all(torch.equal(a, b) for a, b in zip(outs, reference))
    assert (state.graphs, state.captures, state.replays) == (1, 1, 2)  # eager, capture, 2 replays
    dd.disable(model)


@needs_cuda
def test_gpu_rope_tables_equal_the_module():
    """FLUX.2's real axes (32 x 4; theta 2000) on a one-block model of 128-wide heads: the patched
    pos_embed's tables torch.equal to Flux2PosEmbed.forward's for the 64 x 64 image ids, 512 text ids
    and large and negative positions, and the whole model torch.equal to the unpatched one."""
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=1,
        joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(32, 32, 32, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = randomize(model).to(torch.bfloat16)
    _, inputs = tiny_flux2()
    model, inputs = on_cuda(model, inputs)
    reference = run(model, inputs)
    cls = type(model.pos_embed)
    tables = [ids((1, 64, 64, 1)), ids((1, 1, 1, 512)),
              torch.stack([torch.linspace(-1e5, 1e5, 40), torch.linspace(1e4, -1e4, 40),
                           torch.arange(40.0) - 20.5, -torch.arange(40.0)], -1)]
    report = dd.enable(model, sites=["rope_tables"])
    for x in tables:
        x = x.to("cuda")
        got, want = model.pos_embed(x), cls.forward(model.pos_embed, x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(run(model, inputs), reference) and torch.equal(run(model, inputs), reference)
    rope = report["rope_tables (pos_embed)"]
    assert not rope.reasons and not rope.unfit and rope.fused_calls == len(tables) + 4, (rope.reasons, rope.unfit)
    dd.disable(model)
