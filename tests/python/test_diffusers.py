"""ditops.diffusers on tiny random models built from each supported class (no hub access):
the sites plan/enable find (counts from the config), exact restoration by disable, refusals that
change nothing, the fallback paths (a first-sight mismatch, a failing op, a call that does not
fit: the model's values bit for bit), torch.compile(fullgraph=True) tracing the ops, and on the
CPU reference backend the patched model against the unpatched one; the cross-head QK sites of Wan
and LTX-2 (per-call fallbacks with their reasons, fused projections, LTX-2's perturbed and gated
attention) and the mapped sites. GPU tests (torch.equal on CUDA) skip without a device. Skipped
without PyTorch or diffusers."""
import json
import types
import warnings

import pytest

from conftest import diffusers_or_skip, needs_cuda_mark

torch, diffusers = diffusers_or_skip()
import ditops  # noqa: E402
import ditops.diffusers as dd  # noqa: E402
from ditops.diffusers import _common, _sites, qwenimage  # noqa: E402
from ditops.diffusers.bench import cast_like_from_pretrained  # noqa: E402
from ditops.diffusers._patching import only_ditops_hooks  # noqa: E402


HEAD_DIM = 64  # qknorm_rope's smallest head dim
STRICT = "exact"  # the bit-exact default tier
CLOSE = "high"  # a tier that admits every close implementation


# ---------------------------------------------------------------- tiny models

def randomize(model, seed=0):
    """Every weight random: norm weights around 1 (where diffusers' RMSNorm and F.rms_norm part
    ways), modulation tables, linear layers."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                torch.nn.init.normal_(p, mean=1.0, std=0.3, generator=gen)
            elif name.endswith("scale_shift_table"):
                torch.nn.init.normal_(p, std=0.3, generator=gen)
            else:
                torch.nn.init.normal_(p, std=0.05, generator=gen)
    return model


def tiny_flux(dtype=torch.bfloat16, batch=1):
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=HEAD_DIM,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(8, 28, 28))
    model = randomize(model).to(dtype)
    gen = torch.Generator().manual_seed(1)
    grid = torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij")
    inputs = dict(hidden_states=torch.randn(batch, 16, 8, generator=gen).to(dtype),
                  encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype),
                  pooled_projections=torch.randn(batch, 16, generator=gen).to(dtype),
                  timestep=torch.full((batch,), 0.5).to(dtype), img_ids=torch.stack(grid, -1).reshape(-1, 3),
                  txt_ids=torch.zeros(8, 3), return_dict=False)
    cfg = model.config
    L, N = cfg.num_layers, cfg.num_single_layers
    # each double block's two attention residuals and their norm2 modulations: the fused site
    counts = {"qk_norm_rope": N, "qk_norm_rope (dual-stream)": L, "adaln_modulate": 2 * L + N + 1,
              "gated_residual": 2 * L + N, "adaln_modulate (residual + norm2)": 2 * L,
              "gelu_tanh (single block cat)": N, "rope_tables (pos_embed)": 1}
    return model, inputs, counts


def tiny_qwen(dtype=torch.bfloat16, batch=1):
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=HEAD_DIM,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(8, 28, 28))
    model = randomize(model).to(dtype)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(batch, 16, 16, generator=gen).to(dtype),
                  encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype),
                  timestep=torch.full((batch,), 0.5).to(dtype), img_shapes=[(1, 4, 4)] * batch,
                  return_dict=False)
    L = model.config.num_layers
    counts = {"qk_norm_rope": 2 * L, "adaln_modulate": 2 * L + 1, "gated_residual": 2 * L,
              "adaln_modulate (residual + norm2)": 2 * L}
    return model, inputs, counts


def tiny_wan(dtype=torch.bfloat16, batch=1, per_token_timestep=False, fused_qkv=False, cast="from_pretrained"):
    """Wan 2.1 layout (cross_attn_norm: an affine norm2); per_token_timestep: Wan 2.2 TI2V's
    timestep per latent token (per-token modulation); fused_qkv: fuse_qkv_projections (q and k
    are chunks of to_qkv's output); cast "to": model.to(dtype), rotary tables included."""
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32, cross_attn_norm=True)
    model = randomize(model)
    if cast == "to":
        with warnings.catch_warnings():  # "modules that should be kept in float32"
            warnings.simplefilter("ignore")
            model = model.to(dtype)
    else:
        model = cast_like_from_pretrained(model, dtype)
    if fused_qkv:
        model.fuse_qkv_projections()
    gen = torch.Generator().manual_seed(1)
    tokens = 2 * 4 * 4  # the latent grid after (1, 2, 2) patches
    timestep = torch.full((batch, tokens), 500.0) if per_token_timestep else torch.full((batch,), 500.0)
    inputs = dict(hidden_states=torch.randn(batch, 4, 2, 8, 8, generator=gen).to(dtype), timestep=timestep,
                  encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype), return_dict=False)
    L = model.config.num_layers
    # norm2 and norm3 each with the residual before it in one call: norm2's own site and the attn1
    # residual have no place left (they serve those places where the fused sites do not run);
    # adaln_modulate: each block's norm1 and the model's norm_out
    counts = {"qk_norm_rope (self-attn)": L, "qk_norm_rope (text cross-attn)": L, "adaln_modulate": L + 1,
              "adaln_modulate (norm2)": 0, "gated_residual": L, "adaln_modulate (residual + norm2)": L,
              "adaln_modulate (residual + norm3)": L, "conv_layout (patch embedding)": 1}
    return model, inputs, counts


def tiny_ltx2(dtype=torch.bfloat16, batch=1, rope_type="split", variant=None):
    """LTX-2 with real head dims (video 128, audio 64) at 2 heads each; rope_type split or
    interleaved. variant "gated_stg": gated attention, cross-attention modulation (LTX-2.3) and the
    perturbed processor with spatio-temporal guidance in block 0."""
    extra = {}
    if variant == "gated_stg":
        extra = dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                     perturbed_attn=True)
    model = diffusers.LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128, cross_attention_dim=256,
        audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=64,
        audio_cross_attention_dim=128, num_layers=2, caption_channels=32, rope_type=rope_type, **extra)
    model = cast_like_from_pretrained(randomize(model), dtype)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(batch, 2 * 4 * 4, 8, generator=gen).to(dtype),
                  audio_hidden_states=torch.randn(batch, 8, 8, generator=gen).to(dtype),
                  encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype),
                  audio_encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype),
                  timestep=torch.full((batch,), 500.0), num_frames=2, height=4, width=4, audio_num_frames=8,
                  return_dict=False)
    if variant == "gated_stg":
        # batch 1: block 0 all perturbed (attention skipped); batch 2: one element perturbed
        mask = [0.0] if batch == 1 else [0.0, 1.0]
        inputs.update(sigma=torch.full((batch,), 0.5), spatio_temporal_guidance_blocks=[0],
                      perturbation_mask=torch.tensor(mask).to(dtype))
    L = model.config.num_layers
    # per block and stream: norm1 and the v2a modulation alone, the feed-forward's residual alone;
    # the other residuals with the norm after them (gated, or the text cross-attention's plain add
    # without cross_attn_mod)
    mod = variant == "gated_stg"
    counts = {"qk_norm_rope (video self-attn)": L, "qk_norm_rope (audio self-attn)": L,
              "qk_norm_rope (a2v/v2a cross-attn)": 2 * L, "qk_norm_rope (text cross-attn)": 2 * L,
              "adaln_modulate": 4 * L, "adaln_modulate (norm2, no modulation)": 0, "gated_residual": 2 * L,
              "adaln_modulate (gated residual + norm)": (6 if mod else 4) * L,
              "adaln_modulate (residual + norm)": (0 if mod else 2) * L,
              "adaln_modulate (norm_out)": 2,
              "rope_tables (rope)": 1, "rope_tables (audio_rope)": 1, "rope_tables (cross_attn_rope)": 1,
              "rope_tables (cross_attn_audio_rope)": 1}
    return model, inputs, counts


def tiny_hunyuan(dtype=torch.bfloat16, batch=1):
    model = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=HEAD_DIM, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(8, 28, 28), guidance_embeds=True)
    model = randomize(model).to(dtype)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(batch, 4, 2, 8, 8, generator=gen).to(dtype),
                  timestep=torch.full((batch,), 500.0).to(dtype),
                  encoder_hidden_states=torch.randn(batch, 8, 32, generator=gen).to(dtype),
                  encoder_attention_mask=torch.ones(batch, 8),
                  pooled_projections=torch.randn(batch, 16, generator=gen).to(dtype),
                  guidance=torch.full((batch,), 3.5).to(dtype), return_dict=False)
    L, N = model.config.num_layers, model.config.num_single_layers
    # the double blocks' QK of both streams in one dual-stream call: the per-stream sites serve them
    # only where that site is not mapped
    counts = {"qk_norm_rope": 0, "qk_norm_rope (text stream)": 0, "qk_norm_rope (single blocks)": N,
              "qk_norm_rope (dual-stream)": L, "adaln_modulate": 2 * L + N + 1, "gated_residual": 2 * L + N,
              "adaln_modulate (residual + norm2)": 2 * L, "gelu_tanh (single block cat)": N,
              "conv_layout (patch embedding)": 1}
    return model, inputs, counts


TINY = {"flux": tiny_flux, "qwen": tiny_qwen, "wan": tiny_wan, "hunyuan": tiny_hunyuan, "ltx2": tiny_ltx2}

# The layout sites run torch's own ops (no ditops op): what the report names.
CONV_LAYOUT = "torch Conv3d on channels-last-3d input"


def op_sites(report):
    """The report's sites that call a ditops op (not the layout sites, which serve CUDA only)."""
    return [s for s in report.sites if not isinstance(s, _sites.LayoutSite)]

# The op each site class runs: fixed here, not read from the op table under test (the test below
# checks that the table declares the options these mappings need).
OPS = {
    "flux": {"qk_norm_rope": "qknorm_rope", "qk_norm_rope (dual-stream)": "joint_qknorm_rope",
             "adaln_modulate": "layernorm_modulate", "gated_residual": "residual_gate_add",
             "adaln_modulate (residual + norm2)": "norm_scale_shift",
             "gelu_tanh (single block cat)": "gelu_tanh", "rope_tables (pos_embed)": "rope_tables"},
    "qwen": {"qk_norm_rope": "qknorm_rope", "adaln_modulate": "layernorm_modulate",
             "gated_residual": "residual_gate_add", "adaln_modulate (residual + norm2)": "norm_scale_shift"},
    "wan": {"qk_norm_rope (self-attn)": "cross_head_qknorm_rope",
            "qk_norm_rope (text cross-attn)": "cross_head_qknorm_rope",
            "adaln_modulate": "norm_scale_shift", "adaln_modulate (norm2)": "norm_scale_shift",
            "gated_residual": "residual_gate_add", "adaln_modulate (residual + norm2)": "norm_scale_shift",
            "adaln_modulate (residual + norm3)": "norm_scale_shift", "conv_layout (patch embedding)": CONV_LAYOUT},
    "hunyuan": {"qk_norm_rope": "qknorm_rope", "qk_norm_rope (text stream)": "qknorm_rope",
                "qk_norm_rope (single blocks)": "qknorm_rope", "qk_norm_rope (dual-stream)": "joint_qknorm_rope",
                "adaln_modulate": "layernorm_modulate", "gated_residual": "residual_gate_add",
                "adaln_modulate (residual + norm2)": "norm_scale_shift",
                "gelu_tanh (single block cat)": "gelu_tanh", "conv_layout (patch embedding)": CONV_LAYOUT},
    "ltx2": {"qk_norm_rope (video self-attn)": "cross_head_qknorm_rope",
             "qk_norm_rope (audio self-attn)": "cross_head_qknorm_rope",
             "qk_norm_rope (a2v/v2a cross-attn)": "cross_head_qknorm_rope",
             "qk_norm_rope (text cross-attn)": "cross_head_qknorm_rope",
             "adaln_modulate": "norm_scale_shift", "adaln_modulate (norm2, no modulation)": "norm_scale_shift",
             "gated_residual": "residual_gate_add", "adaln_modulate (gated residual + norm)": "norm_scale_shift",
             "adaln_modulate (residual + norm)": "norm_scale_shift", "adaln_modulate (norm_out)": "layernorm_modulate",
             **{f"rope_tables ({m})": "fractional_rope_tables"
                for m in ("rope", "audio_rope", "cross_attn_rope", "cross_attn_audio_rope")}},
}


# Sites that run the model's code under torch.compile: LTX-2's output layers hand their result
# from norm_out to proj_out through per-thread state, which a traced graph does not hold (and
# Inductor fuses those lines itself).
MODEL_CODE_UNDER_COMPILE = {"adaln_modulate (norm_out)"}


def compiled_ops(name):
    """The ditops ops a compiled forward of tiny model `name` holds, sorted."""
    return sorted({"ditops." + op for site, op in OPS[name].items()
                   if op and op != CONV_LAYOUT and site not in MODEL_CODE_UNDER_COMPILE})


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    """(name, model, inputs, counts, the unpatched output) built once per model."""
    model, inputs, counts = TINY[request.param]()
    return request.param, model, inputs, counts, run(model, inputs)


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


def run(model, inputs):
    """Every output of the forward (LTX-2: video and audio) in one flat tensor."""
    with torch.no_grad():
        return torch.cat([out.flatten() for out in model(**inputs)])


def snapshot(model):
    """Every module's attributes and registered children, parameters and buffers, by identity."""
    shot = {}
    for name, module in model.named_modules():
        shot[name] = ({k: v for k, v in module.__dict__.items()},
                      {k: dict(getattr(module, k)) for k in ("_parameters", "_buffers", "_modules")})
    return shot


def assert_same(before, after):
    assert before.keys() == after.keys()
    for name in before:
        attrs_b, regs_b = before[name]
        attrs_a, regs_a = after[name]
        assert attrs_b.keys() == attrs_a.keys(), (name, attrs_b.keys() ^ attrs_a.keys())
        for key in attrs_b:
            assert attrs_b[key] is attrs_a[key], (name, key)
        for kind in regs_b:
            assert regs_b[kind].keys() == regs_a[kind].keys(), (name, kind)
            for key in regs_b[kind]:
                assert regs_b[kind][key] is regs_a[kind][key], (name, kind, key)


class Perturbing:
    """Stands in for torch.ops.ditops: one element of each op's result made NaN, or an Error, so
    every first sight fails."""

    def __init__(self, fail=False):
        self.fail = fail
        self.calls = 0

    def __getattr__(self, name):
        real = getattr(torch.ops.ditops, name)

        def op(*args, **kwargs):
            self.calls += 1
            if self.fail:
                raise ditops.Error(f"{name}: simulated launch failure")
            out = real(*args, **kwargs)
            if out is None:  # an in-place op: its first written tensor (qknorm_rope's q, swiglu's out)
                tensors = [t for t in next(o for o in ditops.op_table() if o["name"] == name)["tensors"]
                           if not t["keyword"] and t["role"] != "out"]  # the positional ones
                first = args[next(i for i, t in enumerate(tensors) if t["role"] == "inout")]
            else:
                first = out[0] if isinstance(out, (tuple, list)) else out
            first[(0,) * first.dim()] = float("nan")
            return out
        return op


class SiteCalls:
    """Records every call a site ran its op for (first sights and verified calls): the op's output,
    the model's chain on the same inputs (computed before the op, which may write q and k in
    place) and the op call's inputs. Install with monkeypatch; check() holds each call to the
    bound of the contract that applies (CONTRACT_BOUNDS)."""

    def __init__(self, monkeypatch):
        self.calls = []   # (site name, op, (op outputs), (model outputs), (args, kwargs))
        self.differing = set()  # (site name, signature) of each call whose op outputs differ from the model's
        self._last = None
        real_ops, real_run = _sites.ops, _sites.Site.run
        recorder = self

        class Recording:
            def __getattr__(self, name):
                op = getattr(real_ops, name)

                def call(*args, **kwargs):
                    recorder._last = (name, _cloned(args), _cloned(kwargs))
                    return op(*args, **kwargs)
                return call

        def run(site, why_not, sig, device, fused, reference, explain):
            if why_not or not site.active or site.states.get(sig) in (_sites.DISABLED, _sites.UNFIT):
                return real_run(site, why_not, sig, device, fused, reference, explain)
            seen = {}

            def op():
                out = fused()
                seen["op"] = _cloned(tuple(out))
                return out

            def model():
                out = reference()
                seen["model"] = _cloned(tuple(out))
                return out
            if site.states.get(sig) == _sites.VERIFIED:  # the model's chain too, before the op
                model()
            recorder._last = None
            out = real_run(site, why_not, sig, device, op, model if "model" not in seen else reference, explain)
            if "op" in seen and recorder._last is not None:
                name, args, kwargs = recorder._last
                recorder.calls.append((site.name, name, seen["op"], seen["model"], (args, kwargs)))
                if not all(torch.equal(a, b) for a, b in zip(seen["op"], seen["model"])):
                    recorder.differing.add((site.name, sig))
            return out
        monkeypatch.setattr(_sites, "ops", Recording())
        monkeypatch.setattr(_sites.Site, "run", run)

    def clear(self):
        self.calls.clear()
        self.differing.clear()

    def all_equal(self) -> bool:
        return all(torch.equal(a, b) for _, _, ours, theirs, _ in self.calls for a, b in zip(ours, theirs))

    def check(self):
        """Every recorded call within its op's bound (CONTRACT_BOUNDS) of the model's chain."""
        assert self.calls, "no site ran its op"
        for site, op, ours, theirs, (args, kwargs) in self.calls:
            for index, (a, b) in enumerate(zip(ours, theirs)):
                assert a.shape == b.shape and a.dtype == b.dtype, (site, op, a.shape, b.shape)
                bound = torch.as_tensor(CONTRACT_BOUNDS[op](b, args, kwargs, index=index),
                                        dtype=torch.float64).expand(b.shape)
                d = (a.double() - b.double()).abs()
                both_nan = torch.isnan(a) & torch.isnan(b)
                beyond = (d > bound) & ~both_nan | (torch.isnan(a) ^ torch.isnan(b))
                if bool(beyond.any()):
                    i = int(torch.nonzero(beyond.flatten())[0])
                    raise AssertionError(f"{site} ({op}): {int(beyond.sum())} of {d.numel()} elements beyond the "
                                         f"bound; first at {i}: {float(a.flatten()[i])} vs the model's "
                                         f"{float(b.flatten()[i])}, bound {float(bound.flatten()[i]):.3g}")


def _cloned(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_cloned(v) for v in value)
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    return value


def _ulp(dtype, magnitude):
    """One ulp of `dtype` at |magnitude| (float64 tensor), the smallest normal's below it."""
    bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    tiny = torch.finfo(dtype).tiny
    _, exponent = torch.frexp(magnitude.abs().clamp_min(tiny))
    return torch.ldexp(torch.ones_like(magnitude), exponent - 1 - bits)


def _equal_bound(b, args, kwargs, index=0):
    return 0.0  # an elementwise chain: the op's rounding steps are the model's, torch.equal


def _qk_bound(b, args, kwargs, index=0):
    """The norm's statistics summed in another order than CPU PyTorch's (whose vectorized order
    depends on the CPU): the normalized value within 1 ulp of the dtype (the contracts' "rstd within
    an fp32 ulp"); RoPE keeps each pair's norm, so every normalized value of a row is at most sqrt(2)
    times the row's largest output, and the rotation plus its rounding carry the ulp to at most 4
    ulps of that largest output."""
    row = b.double().abs().amax(dim=-1, keepdim=True)
    return 4 * _ulp(b.dtype, row)


def _modulation_bound(b, args, kwargs, index=0):
    """norm(x) [* weight + bias] * (1 + scale) + shift: the normalized value within 1 ulp of the
    dtype (as in _qk_bound), carried through the modulation and its roundings: |d| <= 2 ulp-units
    of (|norm(x) * (1 + scale)| + |out|) (layernorm_modulate's contract: 2^-6 for bfloat16). With a
    residual (norm_scale_shift's residual form) the norm is of v = residual + x * gate, and the new
    residual itself (index 0: the sites' pairs are (residual_out, y)) is an elementwise chain: equal."""
    x, scale = args[0].double(), args[1]
    if kwargs.get("residual") is not None:
        if index == 0:
            return 0.0
        gate = kwargs.get("gate")
        x = kwargs["residual"].double() + x * (gate.double() if gate is not None else 1.0)
    if kwargs.get("norm", "layer") == "rms":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(kwargs.get("eps", 1e-6)))
    else:
        y = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=float(kwargs.get("eps", 1e-6)))
    if kwargs.get("weight") is not None:
        y = y * kwargs["weight"].double()
    if kwargs.get("bias") is not None:
        y = y + kwargs["bias"].double()
    if scale is not None:
        s = scale.double()
        y = y * (1 + (s[:, None] if s.dim() == 2 and y.dim() == 3 else s))
    return 2 * _ulp(b.dtype, torch.ones((), dtype=torch.float64)) * (y.abs() + b.double().abs())


def _rope_tables_bound(b, args, kwargs, index=0):
    """The C library's double pow, cos and sin against CPU PyTorch's (both within an ulp of a double):
    one float32 ulp of the table value, compared at 2^-10 below it (rope_tables.reference's contract)."""
    return _ulp(torch.float32, b.double().abs().clamp_min(2.0 ** -10))


def _gelu_tanh_bound(b, args, kwargs, index=0):
    """CPU PyTorch's tanh against the reference's (double rounded to fp32; each within a few fp32
    ulps): one ulp of the dtype at the value, plus 0.5 |x| times 16 fp32 ulps of 1 where 1 + tanh
    cancels. b: the single block's cat buffer [..., D + N], x (args[0]) its last N columns' input;
    the first D columns are a copy."""
    x = args[0].double().abs()
    slack = torch.zeros(b.shape, dtype=torch.float64)
    slack[..., b.shape[-1] - x.shape[-1]:] = 0.5 * x.reshape(*b.shape[:-1], x.shape[-1]) * 2.0 ** -19
    return _ulp(b.dtype, b.double().abs()) + slack


def _fractional_rope_tables_bound(b, args, kwargs, index=0):
    """The reference's cos and sin (double, rounded) against CPU PyTorch's float32 ones (each within
    an ulp): two float32 ulps of the table value, compared at 2^-10 below it."""
    return 2 * _ulp(torch.float32, b.double().abs().clamp_min(2.0 ** -10))


# The bound each op's CPU reference keeps to the model's chain on the CPU, whatever its contract's
# oracle (eager PyTorch on CUDA, or the documented order).
# joint_qknorm_rope: qknorm_rope's per-head routine on the joint rows (its v a copy, well inside).
CONTRACT_BOUNDS = {"residual_gate_add": _equal_bound, "qknorm_rope": _qk_bound, "cross_head_qknorm_rope": _qk_bound,
                   "joint_qknorm_rope": _qk_bound, "layernorm_modulate": _modulation_bound,
                   "norm_scale_shift": _modulation_bound, "rope_tables": _rope_tables_bound,
                   "gelu_tanh": _gelu_tanh_bound, "fractional_rope_tables": _fractional_rope_tables_bound}


# ---------------------------------------------------------------- plan and report


def test_plan_finds_the_sites_and_changes_nothing(tiny):
    name, model, _, counts, _ = tiny
    before = snapshot(model)
    report = dd.plan(model)
    assert_same(before, snapshot(model))
    assert not report.patched
    assert {s.name: len(s.places) for s in report.sites} == counts
    assert {s.name: s.op for s in report.sites} == OPS[name]
    for site in report.sites:
        assert site.chain
        assert site.op is not None or site.why, site.name  # the model's code always says why
    json.dumps(report.as_dict())
    text = str(report)
    for site in report.sites:
        assert site.name in text


def test_the_op_table_declares_the_options_the_mappings_use():
    """The options OPS' mappings need, declared by this build's op table (what the expectations
    above take as given)."""
    assert {"once", "twice"} <= set(_sites.op_options("qknorm_rope")["norm_weight_rounding"])
    assert "complex" in _sites.op_options("qknorm_rope")["rope_product"]
    assert "aten_mean" in _sites.op_options("qknorm_rope")["norm_order"]
    nss = _sites.op_options("norm_scale_shift")
    assert "aten_mean" in nss["norm_order"] and "rms" in nss["norm"] and "float32" in nss["numerics"]
    assert "f32" in _sites.op_tensor_dtypes("residual_gate_add", "gate").split("|")


def test_qwen_qk_site_maps_the_complex_product():
    """Qwen-Image's QK site runs qknorm_rope with the twice-rounding norm and the complex product."""
    model, _, _ = tiny_qwen()
    site = dd.plan(model)["qk_norm_rope"]
    assert site.op == "qknorm_rope" and site.options == {"norm_weight_rounding": "twice"}


def test_twice_rounding_option_maps_the_sites_once_the_op_has_it(monkeypatch):
    """With qknorm_rope's norm_weight_rounding option, diffusers' RMSNorm sites map to it with
    'twice'; Qwen-Image's complex RoPE only with probe=True where the op has no complex product."""
    real = _sites.op_options

    def without_complex(op):
        options = dict(real(op), norm_weight_rounding=["once", "twice"]) if op == "qknorm_rope" else real(op)
        options.pop("rope_product", None)
        return options
    monkeypatch.setattr(_common, "op_options", without_complex)
    monkeypatch.setattr(qwenimage, "op_options", without_complex)
    hunyuan, _, _ = tiny_hunyuan()
    site = dd.plan(hunyuan)["qk_norm_rope"]
    assert site.op == "qknorm_rope" and site.options == {"norm_weight_rounding": "twice"}
    flux, _, _ = tiny_flux()
    assert dd.plan(flux)["qk_norm_rope"].options == {"norm_weight_rounding": "once"}
    qwen, _, _ = tiny_qwen()
    assert dd.plan(qwen)["qk_norm_rope"].op is None and "probe=True" in dd.plan(qwen)["qk_norm_rope"].why
    probed = dd.plan(qwen, probe=True)["qk_norm_rope"]
    assert probed.op == "qknorm_rope" and "complex64" in probed.note


# ---------------------------------------------------------------- enable / disable


@pytest.mark.filterwarnings("ignore:ditops.diffusers:RuntimeWarning")  # CPU: the close reference is not used
def test_enable_disable_restores_exactly(tiny):
    name, model, inputs, counts, reference = tiny
    before = snapshot(model)
    state = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    report = dd.enable(model, allow_cpu=True)
    assert report.patched and dd.enabled(model) is report
    assert {s.name: len(s.places) for s in report.sites} == counts
    changed = [n for n, m in model.named_modules() if "forward" in m.__dict__ or
               type(getattr(m, "processor", None)).__module__.startswith("ditops")]
    assert changed, "enable changed nothing"
    run(model, inputs)
    assert dd.disable(model) is report and not report.patched
    assert dd.enabled(model) is None
    assert_same(before, snapshot(model))
    after = model.state_dict()
    assert after.keys() == state.keys()
    for key, (ptr, value) in state.items():
        assert after[key].data_ptr() == ptr and torch.equal(after[key], value), key
    assert torch.equal(run(model, inputs), reference)


def test_cpu_reference_backend_against_the_unpatched_model(tiny, monkeypatch):
    """The ops' CPU reference in place of the model's CPU chains, in the strict tier (first sight
    decides) and a close tier (the ops' values kept). Every call that ran an op is compared with
    the model's chain on the same inputs within CONTRACT_BOUNDS (the references follow the CUDA
    chains' order, not CPU PyTorch's); the output equals the unpatched one wherever every such call
    did. Strict tier: a site whose reference is close is unfit ("not bit_exact") and runs the model's
    code; the others run their op (a norm site may be disabled at first sight, within the bound, by
    CPU PyTorch's reduction order; the gated residual never is). Close tier: every site runs its op."""
    name, model, inputs, _, reference = tiny
    contracts = {k["name"]: k["contract"] for k in ditops.list_kernels()}
    calls = SiteCalls(monkeypatch)
    for quality in (STRICT, CLOSE):
        calls.clear()
        report = dd.enable(model, quality, allow_cpu=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = run(model, inputs)
        dd.disable(model)
        diff = float((out.float() - reference.float()).abs().max())
        fused = {s.name: s.fused_calls for s in op_sites(report) if s.active}
        print(f"{name} {quality}: max |patched - unpatched| = {diff:.3g}, fused calls {fused}")
        calls.check()
        if calls.all_equal():
            assert torch.equal(out, reference)
        for site in (s for s in op_sites(report) if s.active and s.places):  # placeless: a fused site serves them
            contract = contracts[f"{site.op}.reference"]
            if quality == CLOSE:
                assert site.fused_calls > 0 and not site.reasons and not site.unfit, site.name
                continue
            if contract == "close":
                assert site.fused_calls == 0 and site.unfit, site.name
                assert all("not bit_exact" in why for why in site.unfit.values()), (site.name, site.unfit)
                continue
            assert not site.unfit, (site.name, site.unfit)
            assert site.fused_calls > 0 or site.reasons, site.name
            # disabled only by a difference (recorded: within the bound above), never a failing op
            assert all("differ from the model's chain" in why for why in site.reasons.values()), site.reasons
            # ... and that difference is real: the op's outputs for that signature, as recorded here,
            # are not the model's (a site disabled with nothing differing would pass the line above)
            for sig, why in site.reasons.items():
                assert (site.name, sig) in calls.differing, (site.name, sig, why)
            if site.op == "residual_gate_add":
                assert not site.reasons, (site.name, site.reasons)
            for sig, state in site.states.items():
                if state == _sites.VERIFIED:
                    assert site.differences[sig][0] == 0, (site.name, sig)
                    assert _sites._contract(site.implementations[sig]) == "bit_exact"


def test_layout_site_checks_at_first_sight_and_serves_its_devices_only():
    """A layout site runs torch's ops in another layout where its first sight found them equal,
    the model's chain (with one warning) where not, and the model's chain without a check or a
    warning on devices it does not serve."""
    x = torch.randn(2, 3, 4, 6, 6, dtype=torch.float64)
    conv = torch.nn.Conv3d(3, 5, kernel_size=(1, 2, 2), stride=(1, 2, 2)).double()
    rows = _sites.patch_tokens_channels_last(x, conv)
    chain = _sites.patch_tokens_chain(x, conv)
    assert rows.shape == chain.shape == (2, 4 * 3 * 3, 5) and rows.is_contiguous() and not chain.is_contiguous()
    torch.testing.assert_close(rows, chain)  # the token order: the CPU's kernels need not agree in bits

    def sig(t):
        return (t.dtype, tuple(t.shape))

    t = torch.arange(12.0)
    site = _sites.LayoutSite("conv_layout (test)", runs="doubling by addition", chain="x * 2", device_types=("cpu",))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            assert torch.equal(site(lambda v: v * 2, lambda v: v + v, sig, t), t * 2)
    assert site.states == {sig(t): _sites.VERIFIED} and site.fused_calls == 2 and site.model_calls == 0
    assert site.implementations == {sig(t): "doubling by addition"}

    wrong = _sites.LayoutSite("conv_layout (test)", runs="off by one", chain="x * 2", device_types=("cpu",))
    with pytest.warns(RuntimeWarning, match="disabling off by one at conv_layout"):
        assert torch.equal(wrong(lambda v: v * 2, lambda v: v * 2 + 1, sig, t), t * 2)
    assert torch.equal(wrong(lambda v: v * 2, lambda v: v * 2 + 1, sig, t), t * 2)
    assert wrong.states == {sig(t): _sites.DISABLED} and wrong.fused_calls == 0 and wrong.model_calls == 2
    assert "12 of 12 elements differ" in wrong.reasons[sig(t)]

    cuda_only = _sites.LayoutSite("conv_layout (test)", runs="never here", chain="x * 2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert torch.equal(cuda_only(lambda v: v * 2, lambda v: 1 / 0, sig, t), t * 2)
    assert cuda_only.states == {} and cuda_only.model_calls == 1 and not cuda_only.fallbacks


@pytest.mark.parametrize("fail", [False, True], ids=["mismatch", "op_error"])
def test_first_sight_failure_falls_back_to_the_model_values(tiny, monkeypatch, fail):
    name, model, inputs, _, reference = tiny
    ops = Perturbing(fail)
    monkeypatch.setattr(_sites, "ops", ops)
    # as on a GPU, where every implementation that takes these calls is bit_exact (on the CPU,
    # layernorm_modulate's reference is close and the strict tier would not call it)
    monkeypatch.setattr(_sites, "_contract", lambda implementation: "bit_exact")
    report = dd.enable(model, allow_cpu=True)
    active = [s for s in op_sites(report) if s.active and s.places]
    with pytest.warns(RuntimeWarning, match="disabling") as caught:
        out = run(model, inputs)
    assert torch.equal(out, reference)
    assert ops.calls > 0
    for site in active:
        assert site.reasons and site.fused_calls == 0, site.name
        assert ("simulated launch failure" if fail else "differ from the model's chain") in \
            next(iter(site.reasons.values()))
    warned = " ".join(str(w.message) for w in caught)
    assert all(f"at {site.name} for" in warned for site in active), warned
    if fail:
        return
    calls = ops.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # decided: no new warnings, no op calls
        assert torch.equal(run(model, inputs), reference)
    assert ops.calls == calls


def test_calls_that_do_not_fit_fall_back_per_call():
    """FLUX in float32: qknorm_rope (16-bit only) and layernorm_modulate (bf16 only) do not fit,
    residual_gate_add takes float32: each call decides, the output is the model's."""
    model, inputs, _ = tiny_flux(torch.float32)
    reference = run(model, inputs)
    report = dd.enable(model, allow_cpu=True)
    with pytest.warns(RuntimeWarning, match="runs the model's code for a call"):
        out = run(model, inputs)
    assert torch.equal(out, reference)
    qk, adaln, residual = report["qk_norm_rope"], report["adaln_modulate"], report["gated_residual"]
    assert qk.fused_calls == 0 and sum(qk.fallbacks.values()) == len(qk.places)
    assert adaln.fused_calls == 0 and sum(adaln.fallbacks.values()) == len(adaln.places)
    assert residual.fused_calls == len(residual.places) and not residual.fallbacks
    assert any("q.dtype must be bf16 or f16 but is f32" in why for why in qk.fallbacks)  # the op's matcher


def test_decisions_are_made_once_per_signature(monkeypatch):
    """After the first forward every signature is decided: later calls ask the dispatcher
    nothing (on the CPU the strict tier finds layernorm_modulate's close reference unfit)."""
    model, inputs, _ = tiny_flux()
    report = dd.enable(model, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run(model, inputs)
    assert report["adaln_modulate"].unfit and report["qk_norm_rope"].implementations
    asked = []
    monkeypatch.setattr(ditops, "explain", lambda *a, **k: asked.append(a[0]))
    run(model, inputs)
    assert asked == []
    assert report["adaln_modulate"].model_calls == 2 * len(report["adaln_modulate"].places)


def test_site_selection_leaves_the_others_to_the_model():
    model, inputs, _ = tiny_flux()
    reference = run(model, inputs)
    report = dd.enable(model, allow_cpu=True, sites=["gated_residual"])
    assert torch.equal(run(model, inputs), reference)
    assert report["gated_residual"].fused_calls == len(report["gated_residual"].places)
    for name in ("qk_norm_rope", "adaln_modulate"):
        assert report[name].fused_calls == 0 and report[name].model_calls == len(report[name].places)
        assert "not selected" in report[name].runs()


def test_processor_keeps_the_attention_backend_of_the_original():
    model, _, _ = tiny_flux()
    attn = model.transformer_blocks[0].attn
    original = attn.processor
    dd.enable(model, allow_cpu=True)
    assert attn.processor is not original
    attn.set_attention_backend("native")
    assert original._attention_backend == attn.processor._attention_backend
    dd.disable(model)
    assert attn.processor is original


def test_pipeline_and_compiled_wrapper():
    model, inputs, counts = tiny_flux()
    pipe = types.SimpleNamespace(transformer=model, vae=None)
    report = dd.enable(pipe, allow_cpu=True)
    assert all(p.startswith("transformer.") for s in report.sites for p in s.places)
    assert dd.enabled(model) is report
    dd.disable(pipe)
    assert dd.enabled(model) is None
    compiled = torch.compile(model)  # the wrapper: its _orig_mod is planned (nothing compiled here)
    assert {s.name: len(s.places) for s in dd.plan(compiled).sites} == counts


# ---------------------------------------------------------------- cross-head QK sites (Wan, LTX-2)


def test_cross_head_sites_describe_the_op_and_the_model_code():
    wan, _, _ = tiny_wan()
    report = dd.plan(wan)
    assert report["qk_norm_rope (self-attn)"].options == {"rope": "interleaved"}
    assert report["qk_norm_rope (text cross-attn)"].options == {"rope": "none"}
    assert "across heads" in report["qk_norm_rope (self-attn)"].chain
    # norm2 and the gated residuals run the float32-chain ops (wan.mappings(): the op table has them)
    assert report["adaln_modulate (norm2)"].op == "norm_scale_shift" and report["gated_residual"].op == "residual_gate_add"
    assert "FP32LayerNorm" in report["adaln_modulate (norm2)"].chain
    for rope in ("split", "interleaved"):
        ltx, _, _ = tiny_ltx2(rope_type=rope)
        report = dd.plan(ltx)
        assert report["qk_norm_rope (video self-attn)"].options == {"rope": rope}
        assert report["qk_norm_rope (text cross-attn)"].options == {"rope": "none"}
        assert rope in report["qk_norm_rope (a2v/v2a cross-attn)"].chain
        adaln = report["adaln_modulate"]
        assert "mean(-1)" in adaln.chain
        assert (adaln.op, adaln.options) == ("norm_scale_shift", {"norm": "rms", "norm_order": "aten_mean"})
        places = report["qk_norm_rope (a2v/v2a cross-attn)"].places
        assert places[:2] == ["transformer_blocks.0.audio_to_video_attn (video q, audio k)",
                              "transformer_blocks.0.video_to_audio_attn (audio q, video k)"]


def assert_calls_within_contracts(calls, out, reference):
    """Every call that ran an op within its bound of the model's chain (SiteCalls.check: a wrong
    table, head split or RoPE form moves values by O(1)), and the output the unpatched one where
    every such call was equal to it."""
    calls.check()
    if calls.all_equal():
        assert torch.equal(out, reference)


def _cross_head_call(**change):
    """The arguments of one fitting cross-head call (Wan-like: 2 heads of 64, tables [1, S, 1, 32]),
    with the named parts replaced."""
    gen = torch.Generator().manual_seed(5)
    B, S, N, D = 2, 6, 128, 64
    norm = torch.nn.RMSNorm(N, eps=1e-6).to(torch.bfloat16)
    call = dict(q=torch.randn(B, S, N, generator=gen).bfloat16(), k=torch.randn(B, S, N, generator=gen).bfloat16(),
                norm_q=norm, norm_k=norm, rope="interleaved", head_dim=D,
                tables=(torch.randn(1, S, 1, D // 2, generator=gen), torch.randn(1, S, 1, D // 2, generator=gen),
                        None, None))
    call.update(change)
    return call


def _cross_head_decision(q, k, norm_q, norm_k, rope, head_dim, tables):
    """Why the cross-head site runs the model's code for one call: its mapping's fit, else the op's
    matcher at first sight ('' where the op runs, in a close tier)."""
    site = _sites.MappedSite("qk_norm_rope (test)", mapping=_sites.cross_head_qk_mapping(rope), chain="the norms",
                             outputs=2)
    site.quality, site.exact = CLOSE, False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        site(lambda q, k, *_: (q.clone(), k.clone()), q, k, norm_q, norm_k, rope, head_dim, tables, "")
    return next(iter(site.fallbacks), "")


def test_cross_head_site_names_why_a_call_does_not_fit():
    fit = _cross_head_decision
    assert fit(**_cross_head_call()) == ""
    no_weight = torch.nn.RMSNorm(128, eps=1e-6, elementwise_affine=False)
    assert fit(**_cross_head_call(norm_q=no_weight, norm_k=no_weight)) == ""  # LTX-2's configurable norms
    text_k = torch.randn(2, 9, 128).bfloat16()
    assert fit(**_cross_head_call(k=text_k, rope="none", tables=(None,) * 4)) == ""  # another token count
    qkv = torch.randn(2, 6, 3 * 128).bfloat16()  # fused projections: chunks of one output
    assert fit(**_cross_head_call(q=qkv[..., :128], k=qkv[..., 128:256])) == ""
    base = _cross_head_call()
    q_grad = base["q"].clone().requires_grad_()
    cases = {
        "torch.float32 with torch.bfloat16 activations": dict(norm_q=torch.nn.RMSNorm(128, eps=1e-6)),
        "eps=None": dict(norm_k=torch.nn.RMSNorm(128).bfloat16()),
        "not the row (128,)": dict(norm_q=torch.nn.RMSNorm(64, eps=1e-6).bfloat16()),
        "not torch.nn.RMSNorm": dict(norm_q=diffusers.models.normalization.RMSNorm(128, eps=1e-6)),
        "8-byte aligned": dict(q=torch.randn(2 * 6 * 128 + 1).bfloat16()[1:].view(2, 6, 128)),
        "rows overlap": dict(q=torch.randn(128).bfloat16().expand(2, 6, 128)),
        # the op's matcher, at first sight
        "k has 9 tokens and q 6": dict(k=text_k),
        "q_cos.dtype must be f32 but is bf16": dict(tables=tuple(t.bfloat16() if t is not None else None
                                                                for t in base["tables"])),
        "q_cos.shape[3] must be 32 (head_dim / 2) but is 16": dict(tables=(torch.zeros(1, 6, 1, 16),
                                                                           torch.zeros(1, 6, 1, 16), None, None)),
        "multiple of head_dim=48": dict(head_dim=48),
        "k.shape[0] must equal B=2": dict(k=torch.randn(1, 6, 128).bfloat16()),
        "q.dtype must be bf16 or f16 but is f32": dict(q=base["q"].float(), k=base["k"].float(),
                                                       norm_q=torch.nn.RMSNorm(128, eps=1e-6),
                                                       norm_k=torch.nn.RMSNorm(128, eps=1e-6)),
    }
    for expected, change in cases.items():
        why = fit(**_cross_head_call(**change))
        assert expected in why, (expected, why)
    with torch.enable_grad():
        assert "autograd" in fit(**_cross_head_call(q=q_grad))
    with torch.no_grad():
        assert fit(**_cross_head_call(q=q_grad)) == ""


def test_wan_cross_head_falls_back_per_call_with_reasons(monkeypatch):
    """model.to(bfloat16) casts Wan's rotary tables too (from_pretrained keeps them float32): the
    self-attention's RoPE then runs in bfloat16, not the op's chain, and every such call is the
    model's; a float32 QK weight at one place falls back there only; a norm without eps is left
    unpatched at plan time."""
    model, inputs, _ = tiny_wan(cast="to")
    reference = run(model, inputs)
    calls = SiteCalls(monkeypatch)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    with pytest.warns(RuntimeWarning, match="runs the model's code for a call"):
        out = run(model, inputs)
    self_qk, cross_qk = report["qk_norm_rope (self-attn)"], report["qk_norm_rope (text cross-attn)"]
    assert self_qk.fused_calls == 0 and list(self_qk.fallbacks) == [  # the op's matcher, at first sight
        "the op refuses it: cross_head_qknorm_rope: q_cos.dtype must be f32 but is bf16"]
    assert cross_qk.fused_calls == len(cross_qk.places)
    assert_calls_within_contracts(calls, out, reference)
    dd.disable(model)

    model, inputs, _ = tiny_wan()
    model.blocks[0].attn1.norm_q.float()
    eps_free = torch.nn.RMSNorm(model.blocks[1].attn2.norm_k.normalized_shape).bfloat16()
    model.blocks[1].attn2.norm_k = eps_free
    reference = run(model, inputs)
    report = dd.enable(model, STRICT, allow_cpu=True)
    assert type(model.blocks[1].attn2.processor) is diffusers.models.transformers.transformer_wan.WanAttnProcessor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs), reference)
    self_qk, cross_qk = report["qk_norm_rope (self-attn)"], report["qk_norm_rope (text cross-attn)"]
    assert cross_qk.skipped == [("blocks.1.attn2", "torch.nn.RMSNorm with eps=None (the dtype's epsilon)")]
    assert self_qk.fallbacks["norm weight is torch.float32 with torch.bfloat16 activations (PyTorch's "
                             "decomposed RMSNorm)"] == 1
    dd.disable(model)
    model.blocks[0].attn1.norm_q.bfloat16()
    dd.enable(model, CLOSE, allow_cpu=True)
    run(model, inputs)
    assert report is not dd.enabled(model) and dd.enabled(model)["qk_norm_rope (self-attn)"].fused_calls == 2


@pytest.mark.parametrize("per_token_timestep,fused_qkv", [(False, True), (True, False)], ids=["fused_qkv", "ti2v"])
def test_wan_forms_run_the_op_on_the_cpu_reference(per_token_timestep, fused_qkv, monkeypatch):
    """Fused projections (q and k strided chunks of to_qkv's output, written in place) and Wan 2.2
    TI2V's per-token modulation: every mapped site runs in the close tier (the CPU reference), the
    strict tier gives the unpatched output bit for bit."""
    model, inputs, _ = tiny_wan(per_token_timestep=per_token_timestep, fused_qkv=fused_qkv)
    reference = run(model, inputs)
    calls = SiteCalls(monkeypatch)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    out = run(model, inputs)
    for site in op_sites(report):
        if site.active:
            assert site.fused_calls == len(site.places) and not site.fallbacks, site.name
    assert_calls_within_contracts(calls, out, reference)
    dd.disable(model)
    dd.enable(model, STRICT, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs), reference)


@pytest.mark.parametrize("rope_type,variant", [("interleaved", None), ("split", "gated_stg")])
def test_ltx2_forms_run_the_op_on_the_cpu_reference(rope_type, variant, monkeypatch):
    """LTX-2's interleaved tables (read every other column), and gated attention with the perturbed
    processor (spatio-temporal guidance: an all-perturbed block skips the QK part) and the
    cross-attention modulation's extra gated residuals: the processors are swapped for ours and
    back, the close tier runs every mapped site, the strict tier gives the unpatched output."""
    model, inputs, counts = tiny_ltx2(rope_type=rope_type, batch=2, variant=variant)
    reference = run(model, inputs)
    before = snapshot(model)
    calls = SiteCalls(monkeypatch)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    assert {s.name: len(s.places) for s in report.sites} == counts
    expected = "LTX2PerturbedAttnProcessorDitops" if variant else "LTX2AttnProcessorDitops"
    assert type(model.transformer_blocks[0].attn1.processor).__name__ == expected
    out = run(model, inputs)
    for site in op_sites(report):
        if site.active:
            assert site.fused_calls == len(site.places) and not site.fallbacks, site.name
    assert_calls_within_contracts(calls, out, reference)
    dd.disable(model)
    assert_same(before, snapshot(model))
    inputs_all = dict(inputs, perturbation_mask=torch.zeros(2).bfloat16()) if variant else inputs
    reference_all = run(model, inputs_all)
    # The adaLN site's mean order is CUDA's reduction; CPU PyTorch adds the squares in another
    # order, so on the CPU a first sight may pass on one input and not on the next: the QK and
    # residual sites only.
    report = dd.enable(model, STRICT, allow_cpu=True, sites=["qk_norm_rope", "gated_residual"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs_all), reference_all)
    if variant:  # block 0's self-attentions skipped: one QK call each, from block 1
        assert report["qk_norm_rope (video self-attn)"].model_calls == 1


def test_ltx2_output_layers_hand_the_modulated_norm_to_proj_out(monkeypatch):
    """norm_out / audio_norm_out and the forward's modulation after them through the adaLN site:
    proj_out's Linear gets the modulated norm of norm_out's input (LayerNorm, then * (1 + scale) +
    shift with the model's scale_shift_table and the time embedding's second output), not what the
    forward's own modulation made of norm_out's stand-in. Strict tier (the CPU reference is close:
    the chain, exactly), close tier (the reference, within bf16 rounding). Outside a forward,
    norm_out is the LayerNorm; a forward that does not read as diffusers 0.42.1's keeps its code."""
    from ditops.diffusers import ltx2
    model, inputs, _ = tiny_ltx2()
    seen = {}

    def keep(name):
        def hook(module, args, out):
            seen[name] = (args[0], out[1]) if name.endswith("time_embed") else args[0]
        return hook

    for name in ("time_embed", "audio_time_embed", "norm_out", "audio_norm_out"):
        getattr(model, name).register_forward_hook(keep(name))
    linear_in = {}
    linear_forward = torch.nn.Linear.forward

    def recording(self, x):
        for name in ("proj_out", "audio_proj_out"):
            if self is getattr(model, name):
                linear_in[name] = x
        return linear_forward(self, x)

    monkeypatch.setattr(torch.nn.Linear, "forward", recording)

    def expected(stream):
        prefix = "" if stream == "video" else "audio_"
        x = seen[f"{prefix}norm_out"]
        embedded = seen[f"{prefix}time_embed"][1].view(x.shape[0], -1, x.shape[-1])
        values = getattr(model, f"{prefix}scale_shift_table")[None, None] + embedded[:, :, None]
        shift, scale = values[:, :, 0], values[:, :, 1]
        return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale) + shift

    for quality in (STRICT, CLOSE):
        report = dd.enable(model, quality, allow_cpu=True, sites=["adaln_modulate"])
        site = report["adaln_modulate (norm_out)"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            run(model, inputs)
        for stream, proj in (("video", "proj_out"), ("audio", "audio_proj_out")):
            got, want = linear_in[proj], expected(stream)
            assert got.shape == want.shape and got.shape[1] > 1, (proj, got.shape)
            if quality == STRICT:
                assert torch.equal(got, want), proj
            else:
                torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -7)
        assert (site.fused_calls, site.model_calls) == ((0, 2) if quality == STRICT else (2, 0))
        x = torch.randn(1, 4, model.norm_out.normalized_shape[0]).to(torch.bfloat16)
        assert torch.equal(model.norm_out(x), torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-6))
        dd.disable(model)
    lines = ltx2.OUTPUT_LAYERS["audio"]
    monkeypatch.setitem(ltx2.OUTPUT_LAYERS, "audio", (*lines[:4], (*lines[4][:3], "audio_hidden_states = 2")))
    report = dd.plan(model)
    assert [p for p, _ in report["adaln_modulate (norm_out)"].skipped] == ["audio_norm_out"]


def test_ltx2_norms_without_weight_and_a_user_processor(monkeypatch):
    """QK norms without a weight (torch.nn.RMSNorm(elementwise_affine=False)) are the op's chain
    without a weight; a processor object the user set is replaced (its class is the model's) and
    put back by disable; one of the user's own class is left as it is."""
    model, inputs, _ = tiny_ltx2()
    for block in model.transformer_blocks:
        for name in ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"):
            attn = getattr(block, name)
            for norm in ("norm_q", "norm_k"):
                old = getattr(attn, norm)
                setattr(attn, norm, torch.nn.RMSNorm(old.normalized_shape, eps=old.eps, elementwise_affine=False))
    mine = diffusers.models.transformers.transformer_ltx2.LTX2AudioVideoAttnProcessor()
    model.transformer_blocks[1].audio_attn1.set_processor(mine)
    reference = run(model, inputs)
    calls = SiteCalls(monkeypatch)
    report = dd.enable(model, CLOSE, allow_cpu=True)
    out = run(model, inputs)
    assert model.transformer_blocks[1].audio_attn1.processor.original is mine
    audio = report["qk_norm_rope (audio self-attn)"]
    assert audio.skipped == [] and audio.fused_calls == 2
    for site in report.sites:
        if site.op == "cross_head_qknorm_rope":
            assert site.fused_calls > 0 and not site.fallbacks, site.name
    assert_calls_within_contracts(calls, out, reference)
    dd.disable(model)
    assert model.transformer_blocks[1].audio_attn1.processor is mine

    class MyProcessor(diffusers.models.transformers.transformer_ltx2.LTX2AudioVideoAttnProcessor):
        pass
    model.transformer_blocks[1].audio_attn1.set_processor(MyProcessor())
    report = dd.plan(model)
    assert report["qk_norm_rope (audio self-attn)"].skipped == [
        ("transformer_blocks.1.audio_attn1", "processor is MyProcessor, not LTX2AudioVideoAttnProcessor or "
                                             "LTX2PerturbedAttnProcessor")]


# ---------------------------------------------------------------- mapped sites (Wan's float32 chains)


def test_mapped_site_runs_its_mapping_under_the_first_sight_check():
    gen = torch.Generator().manual_seed(9)
    x, u = (torch.randn(2, 3, 8, generator=gen) for _ in range(2))
    g = torch.randn(2, 1, 8, generator=gen)

    def chain(x, u, g):
        return x + u * g

    mapping = _sites.Mapping(op="residual_gate_add", fit=lambda x, u, g: "" if g.is_contiguous() else "strided gate",
                             signature=lambda x, u, g: (x.dtype,),
                             call=lambda x, u, g: _sites.OpCall("residual_gate_add", (x, u, g), {}, lambda out: out))
    site = _sites.MappedSite("gated_residual (test)", mapping=mapping, chain="x + u * g")
    site.quality = STRICT
    assert torch.equal(site(chain, x, u, g), chain(x, u, g)) and site.fused_calls == 1
    assert torch.equal(site(chain, x, u, g), chain(x, u, g)) and site.fused_calls == 2
    with pytest.warns(RuntimeWarning, match="strided gate"):
        site(chain, x, u, g.expand(2, 3, 8))
    assert site.fallbacks == {"strided gate": 1}

    def other_chain(x, u, g):
        return x + u * g * 2
    other = _sites.MappedSite("gated_residual (test)", mapping=mapping, chain="x + 2 u g")
    other.quality = STRICT
    with pytest.warns(RuntimeWarning, match="disabling residual_gate_add"):
        assert torch.equal(other(other_chain, x, u, g), other_chain(x, u, g))
    assert other.fused_calls == 0 and other.reasons

    off = _sites.MappedSite("gated_residual (test)", mapping=_sites.Mapping(why="no op yet"), chain="x + u * g")
    assert off.op is None and off.why == "no op yet" and "the model's code" in off.runs()
    assert torch.equal(off(chain, x, u, g), chain(x, u, g)) and off.model_calls == 1


def test_wan_site_switches_on_by_its_mapping(monkeypatch):
    """The gated residual's mapping switched to residual_gate_add on float32 copies (the model's
    chain exactly: x.float() + rne32(update * gate), then one rounding): the site runs it and the
    output stays the model's."""
    from ditops.diffusers import wan

    def fit(x, update, gate):
        return "" if gate.dtype == torch.float32 and update.shape == x.shape else "not the float32-gate form"

    mapping = _sites.Mapping(
        op="residual_gate_add", fit=fit, signature=lambda x, update, gate: (str(x.device), x.dtype, gate.shape[1] == 1),
        call=lambda x, update, gate: _sites.OpCall("residual_gate_add", (x.float(), update.float(), gate.contiguous()),
                                                   {}, lambda out: out.type_as(x)))
    real = wan.mappings
    monkeypatch.setattr(wan, "mappings", lambda: dict(real(), residual=mapping))
    model, inputs, _ = tiny_wan()
    reference = run(model, inputs)
    report = dd.enable(model, STRICT, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs), reference)
    residual = report["gated_residual"]
    assert residual.op == "residual_gate_add" and residual.fused_calls == len(residual.places)


def test_wan_float32_chain_mappings(monkeypatch):
    """adaLN, norm2 and the residuals map to norm_scale_shift's float32 numerics and
    residual_gate_add's float32 gate (issue 34 §2) on 16-bit x itself, and to the float32-copy or
    the model's code where an op table lacks them; each mapping's fit takes Wan's own tensors
    (strided modulation chunks, per-token TI2V rows) and names what it refuses; on the CPU
    reference (bit_exact, the strict tier) every such site runs its op, with the model's output."""
    from ditops.diffusers import wan
    assert wan.mappings() == {"adaln": wan.ADALN_FLOAT32, "norm2": wan.NORM2_FLOAT32,
                              "residual": wan.RESIDUAL_FLOAT32_GATE, "residual_norm2": wan.RESIDUAL_NORM2_FLOAT32,
                              "add_norm3": wan.ADD_NORM3_FLOAT32}
    declared = _sites.op_options("norm_scale_shift")
    with monkeypatch.context() as m:  # an op table without them
        m.setattr(wan, "op_options", lambda op: dict(declared, numerics=["eager", "sglang"]))
        m.setattr(wan, "op_tensor_dtypes", lambda op, tensor: "=residual")
        assert wan.mappings() == {"adaln": wan.ADALN_ON_FLOAT32_COPY, "norm2": wan.NORM2_MODEL_CODE,
                                  "residual": wan.RESIDUAL_MODEL_CODE, "residual_norm2": wan.FUSED_MODEL_CODE,
                                  "add_norm3": wan.FUSED_MODEL_CODE}
    model, inputs, _ = tiny_wan(per_token_timestep=True)
    report = dd.plan(model)
    assert report["adaln_modulate"].options["numerics"] == "float32"
    assert report["adaln_modulate (norm2)"].op == "norm_scale_shift"
    assert report["gated_residual"].op == "residual_gate_add"

    block = model.blocks[0]
    B, S, D = 2, 32, 128
    x, update = torch.randn(B, S, D).bfloat16(), torch.randn(B, S, D).bfloat16()
    table = torch.randn(B, 6, D)  # (scale_shift_table + temb.float()) of Wan 2.1
    shift, scale, gate = table.chunk(6, dim=1)[:3]
    per_token = torch.randn(B, S, 6, D).chunk(6, dim=2)  # Wan 2.2 TI2V
    t_shift, t_scale, t_gate = (c.squeeze(2) for c in per_token[:3])
    assert wan.ADALN_FLOAT32.fit(x, block.norm1, scale, shift) == ""
    assert wan.ADALN_FLOAT32.fit(x, block.norm1, t_scale, t_shift) == ""
    assert wan.NORM2_FLOAT32.fit(x, block.norm2) == ""
    assert wan.RESIDUAL_FLOAT32_GATE.fit(x, update, gate) == ""
    assert wan.RESIDUAL_FLOAT32_GATE.fit(x, update, t_gate) == ""
    assert "affine weight" in wan.ADALN_FLOAT32.fit(x, block.norm2, scale, shift)
    assert "not float32" in wan.ADALN_FLOAT32.fit(x, block.norm1, scale.bfloat16(), shift)
    assert "dim 10240" in wan.ADALN_FLOAT32.fit(torch.zeros(1, 2, 10240).bfloat16(), block.norm1, scale, shift)
    assert "16-bit" in wan.RESIDUAL_FLOAT32_GATE.fit(x.float(), update.float(), gate)
    assert "gate is not float32" in wan.RESIDUAL_FLOAT32_GATE.fit(x, update, gate.bfloat16())
    call = wan.NORM2_FLOAT32.call(x, block.norm2)
    assert call.op == "norm_scale_shift" and call.args == (x, None, None)
    assert call.kwargs["weight"] is block.norm2.weight and call.kwargs["numerics"] == "float32"
    call = wan.RESIDUAL_FLOAT32_GATE.call(x, update, gate)
    assert call.args[2] is gate  # the strided chunk itself, no copy

    reference = run(model, inputs)
    report = dd.enable(model, STRICT, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = run(model, inputs)
    assert torch.equal(out, reference)
    for name in ("adaln_modulate", "adaln_modulate (norm2)", "gated_residual"):
        site = report[name]
        assert site.fused_calls == len(site.places) and not site.fallbacks and not site.reasons, name


# ---------------------------------------------------------------- a residual and the next norm in one pass

# Wan's sites of norm_scale_shift's residual form (issue 44).
WAN_FUSED = ("adaln_modulate (residual + norm2)", "adaln_modulate (residual + norm3)")


def assert_runs_verified(site, forwards):
    """site ran its op at every place of each forward, every signature verified at first sight
    (torch.equal to the model's chain), nothing on the model's code."""
    assert site.op == "norm_scale_shift" and site.places, site.name
    assert site.fused_calls == forwards * len(site.places) and site.model_calls == 0, (site.name, site.fused_calls)
    assert not site.fallbacks and not site.reasons and not site.unfit, site.name
    assert site.states and all(state == _sites.VERIFIED for state in site.states.values()), site.states
    assert all(n == 0 for n, _ in site.differences.values()), site.differences


@pytest.mark.parametrize("form", ["wan21", "ti2v", "batch2"])
def test_wan_residual_norm_sites_equal_the_model(form, monkeypatch):
    """attn1's gated residual with norm2 (affine) and attn2's residual add with norm3 and its
    modulation (each one norm_scale_shift call in the residual form, float32 numerics: the new
    residual and the norm of its rounded value, both compared at first sight): on the CPU reference
    (bit_exact: the strict tier runs it) each is verified and runs at every place, with random norm
    weights, biases and modulation tables; the output is the unpatched model's bit for bit, over
    two forwards; the op takes the attention output as x, the stream as the residual and the
    float32 gate chunk in place."""
    kwargs = {"wan21": {}, "ti2v": dict(per_token_timestep=True), "batch2": dict(batch=2)}[form]
    model, inputs, counts = tiny_wan(**kwargs)
    with torch.no_grad():  # random biases and modulation tables
        assert float(model.blocks[0].norm2.bias.abs().max()) > 0
        assert float(model.blocks[0].scale_shift_table.abs().max()) > 0
    reference = run(model, inputs)
    calls = SiteCalls(monkeypatch)
    report = dd.enable(model, STRICT, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the QK sites: a close CPU reference, unfit
        first, second = run(model, inputs), run(model, inputs)
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert only_ditops_hooks(model)  # the model's forward through ditops's hook (norm_out), as the blocks'
    adaln = report["adaln_modulate"]
    assert adaln.places[-1] == "norm_out" and adaln.fused_calls == 2 * len(adaln.places)  # norm_out's too
    for name in WAN_FUSED:
        assert_runs_verified(report[name], forwards=2)
        assert len(report[name].places) == counts[name]
        assert set(report[name].implementations.values()) == {"norm_scale_shift.reference"}
    assert report["adaln_modulate (norm2)"].fused_calls == report["adaln_modulate (norm2)"].model_calls == 0
    assert report["gated_residual"].fused_calls == 2 * len(report["gated_residual"].places)  # the ffn's
    text = str(report)
    for name in WAN_FUSED:
        assert f"{name} " in text and "residual=gated" in text and "residual=add" in text
    calls.check()
    by_site = {}
    for site, op, ours, theirs, (args, kw) in calls.calls:
        by_site.setdefault(site, []).append((ours, theirs, args, kw))
    for name in WAN_FUSED:  # the residual form: (residual_out, y), x the attention output
        ours, theirs, args, kw = by_site[name][0]
        assert len(ours) == 2 and kw["residual"] is not None and kw["numerics"] == "float32"
        assert args[0].shape == kw["residual"].shape and args[0].dtype == torch.bfloat16
    _, _, args, kw = by_site["adaln_modulate (residual + norm2)"][0]
    assert kw["gate"].dtype == torch.float32 and kw["weight"] is not None and kw["bias"] is not None
    assert args[1] is None and args[2] is None  # norm2: no modulation
    _, _, args, kw = by_site["adaln_modulate (residual + norm3)"][0]
    assert kw.get("gate") is None and args[1].dtype == torch.float32  # the add, then the modulation
    dd.disable(model)
    assert "forward" not in model.__dict__ and "_diffusers_hook" not in model.__dict__
    assert "forward" not in model.__dict__ and "_diffusers_hook" not in model.__dict__
    assert torch.equal(run(model, inputs), reference)


def test_wan_fused_sites_need_their_classes_and_hand_their_places_back(monkeypatch):
    """The residual + norm2 site serves two site classes: selected only with both; otherwise, and
    where the op table has no residual form, its places go back to gated_residual and the norm2
    site, which serve them (the residual + norm3 site's to adaln_modulate), with the model's output."""
    from ditops.diffusers import wan
    model, inputs, _ = tiny_wan()
    L = model.config.num_layers
    reference = run(model, inputs)
    report = dd.plan(model, sites=["adaln_modulate"])
    fused = report["adaln_modulate (residual + norm2)"]
    assert fused.classes == ("adaln_modulate", "gated_residual") and not fused.active and fused.places == []
    assert len(report["adaln_modulate (norm2)"].places) == L and len(report["gated_residual"].places) == 2 * L
    assert len(report["adaln_modulate (residual + norm3)"].places) == L and report["adaln_modulate"].places == [
        "blocks.0.norm1", "blocks.1.norm1", "norm_out"]
    report = dd.enable(model, STRICT, allow_cpu=True, sites=["adaln_modulate"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs), reference)
    assert report["adaln_modulate (norm2)"].fused_calls == L and fused.fused_calls == 0
    assert report["gated_residual"].fused_calls == 0 and report["gated_residual"].model_calls == 2 * L
    assert report["adaln_modulate (residual + norm3)"].fused_calls == L
    dd.disable(model)

    report = dd.plan(model, sites=["gated_residual"])
    assert not report["adaln_modulate (residual + norm3)"].places and len(report["adaln_modulate"].places) == 2 * L + 1

    monkeypatch.setattr(wan, "_residual_form", lambda: False)  # an op table without the residual form
    report = dd.enable(model, STRICT, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(run(model, inputs), reference)
    for name in WAN_FUSED:
        assert report[name].op is None and "residual form" in report[name].why and not report[name].places
    assert {n: report[n].fused_calls for n in ("adaln_modulate", "adaln_modulate (norm2)", "gated_residual")} == {
        "adaln_modulate": 2 * L + 1, "adaln_modulate (norm2)": L, "gated_residual": 2 * L}


def test_wan_residual_norm_mappings_fit_wans_tensors():
    """The residual-form mappings take Wan's own tensors (16-bit stream and attention output,
    float32 gate / scale / shift chunks of [B, 6, D] or TI2V's [B, S, 6, D], norm2's float32 affine)
    and name what they refuse."""
    from ditops.diffusers import wan
    model, _, _ = tiny_wan()
    block = model.blocks[0]
    B, S, D = 2, 32, 128
    gen = torch.Generator().manual_seed(3)  # the same inputs whichever tests ran before
    x, update = (torch.randn(B, S, D, generator=gen).bfloat16() for _ in range(2))
    shift, scale, gate = torch.randn(B, 6, D, generator=gen).chunk(6, dim=1)[:3]
    t_shift, t_scale, t_gate = (c.squeeze(2) for c in torch.randn(B, S, 6, D, generator=gen).chunk(6, dim=2)[:3])
    r2, a3 = wan.RESIDUAL_NORM2_FLOAT32, wan.ADD_NORM3_FLOAT32
    assert r2.fit(x, update, gate, block.norm2) == "" and r2.fit(x, update, t_gate, block.norm2) == ""
    assert a3.fit(x, update, block.norm3, scale, shift) == "" and a3.fit(x, update, block.norm3, t_scale, t_shift) == ""
    assert "16-bit" in r2.fit(x.float(), update.float(), gate, block.norm2)
    assert "update is not a contiguous" in r2.fit(x, update.transpose(1, 2).contiguous().transpose(1, 2), gate,
                                                  block.norm2)
    assert "gate is not float32" in r2.fit(x, update, gate.bfloat16(), block.norm2)
    assert "affine weight" in a3.fit(x, update, block.norm2, scale, shift)
    assert "not an FP32LayerNorm" in r2.fit(x, update, gate, torch.nn.LayerNorm(D))
    call = r2.call(x, update, gate, block.norm2)
    assert call.args == (update, None, None) and call.kwargs["residual"] is x and call.kwargs["gate"] is gate
    assert call.kwargs["weight"] is block.norm2.weight and call.kwargs["bias"] is block.norm2.bias
    call = a3.call(x, update, block.norm3, scale, shift)
    assert call.args == (update, scale, shift) and call.kwargs["residual"] is x and "gate" not in call.kwargs
    # the op's outputs in the chain's order, (new residual, y): the residual exactly; y within a
    # rounding step where CPU PyTorch's LayerNorm sums in another order than the reference's (CUDA's),
    # plus that order's float32 error, absolute where x - mean cancels (a y near 0): 2^-20 is eight
    # float32 ulps at 1 through a weight or 1 + scale of a few units (over 1500 random input sets
    # the excess over one rounding step stayed below 2.1e-7)
    with torch.no_grad():
        for mapping, args, chain in ((r2, (x, update, gate, block.norm2), wan.residual_norm2_chain),
                                     (a3, (x, update, block.norm3, scale, shift), wan.add_norm3_chain)):
            c = mapping.call(*args)
            residual_out, y = c.output(getattr(torch.ops.ditops, c.op)(*c.args, **c.kwargs))
            want_residual, want_y = chain(*args)
            assert torch.equal(residual_out, want_residual)
            bound = _ulp(y.dtype, want_y.double()) + 2.0 ** -20
            assert bool(((y.double() - want_y.double()).abs() <= bound).all())


def tiny_flux_pipeline():
    """A tiny FLUX.1 pipeline on the CPU: random transformer and VAE, no text encoders or
    tokenizers (prompt embeddings are passed in)."""
    pytest.importorskip("transformers", reason="FluxPipeline needs transformers (no text encoder is built)")
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(8, 28, 28))
    transformer = randomize(transformer).to(torch.bfloat16)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5035).to(torch.bfloat16)
    pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_pipeline_example_with_tiny_components(monkeypatch):
    """docs/diffusers.md's pipeline example ("A pipeline, end to end") with tiny random components
    (weights cannot be fetched here), on the CPU (allow_cpu: the ops' CPU reference) and prompt
    embeddings in place of the text encoders: enable, a warm-up call, a timed call, the report,
    disable. Every site call that ran an op is within its bound of the model's chain (SiteCalls);
    the images are the pipeline's own wherever every such call equalled it, and after disable."""
    import time
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pipe = tiny_flux_pipeline()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, 8, 32, generator=gen).bfloat16()
    pooled = torch.randn(1, 16, generator=gen).bfloat16()

    def generate():
        return pipe(prompt_embeds=prompt, pooled_prompt_embeds=pooled, height=32, width=32, num_inference_steps=2,
                    guidance_scale=3.5, output_type="pt", generator=torch.Generator().manual_seed(0)).images

    reference = generate()
    calls = SiteCalls(monkeypatch)
    report = dd.enable(pipe, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU: layernorm_modulate's close reference is unfit
        warm = generate()  # first sight of each signature
        start = time.perf_counter()
        image = generate()
        seconds = time.perf_counter() - start
    print(f"{seconds:.3f} s\n{report}")
    assert report.patched and all(p.startswith("transformer.") for s in report.sites for p in s.places)
    assert report["gated_residual"].fused_calls > 0 and report["qk_norm_rope"].fused_calls > 0
    calls.check()
    if calls.all_equal():
        assert torch.equal(warm, reference) and torch.equal(image, reference)
    dd.disable(pipe)
    assert torch.equal(generate(), reference)


def test_an_unknown_diffusers_version_refuses_the_sites_not_the_capture(monkeypatch):
    """Outside the tested range enable and plan change nothing and say so; capture, which reads
    none of the model's code, still installs (docs/diffusers.md)."""
    model, inputs, _ = tiny_flux()
    reference = run(model, inputs)
    monkeypatch.setattr(diffusers, "__version__", "0.43.0")
    for call in (lambda: dd.enable(model, allow_cpu=True), lambda: dd.plan(model)):
        with pytest.raises(dd.UnsupportedError, match=r"diffusers 0\.43\.0 is outside the tested range "
                                                      r">=0\.42\.1,<0\.43.*install diffusers>=0\.42\.1,<0\.43"):
            call()
    assert dd.enabled(model) is None
    dd.capture(model)
    try:
        assert dd.captured(model) is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # on the CPU it runs eagerly
            assert torch.equal(run(model, inputs), reference) and torch.equal(run(model, inputs), reference)
    finally:
        assert dd.release(model)


# ---------------------------------------------------------------- refusals


def test_refusals_change_nothing(monkeypatch):
    model, _, _ = tiny_flux()
    before = snapshot(model)
    with pytest.raises(dd.UnsupportedError, match="on the CPU"):
        dd.enable(model)
    assert_same(before, snapshot(model))
    with pytest.raises(dd.UnsupportedError, match="not supported"):
        dd.enable(torch.nn.Linear(4, 4), allow_cpu=True)
    with pytest.raises(dd.UnsupportedError, match="neither a model nor a pipeline"):
        dd.enable(object())
    with pytest.raises(dd.UnsupportedError, match="unknown site classes"):
        dd.enable(model, allow_cpu=True, sites=["rope"])
    with pytest.raises(ditops.Error, match="unknown quality"):
        dd.enable(model, "bogus", allow_cpu=True)

    class MyFlux(diffusers.FluxTransformer2DModel):
        pass
    with pytest.raises(dd.UnsupportedError, match="not supported"):
        dd.plan(MyFlux.__new__(MyFlux))

    for version in ("0.43.0", "0.41.0", "0.43.0.dev0", "1.0.0"):
        monkeypatch.setattr(diffusers, "__version__", version)
        with pytest.raises(dd.UnsupportedError, match="outside the tested range"):
            dd.enable(model, allow_cpu=True)
        assert_same(before, snapshot(model))
    monkeypatch.setattr(diffusers, "__version__", "0.42.1")

    dd.enable(model, allow_cpu=True)
    with pytest.raises(dd.UnsupportedError, match="already enabled"):
        dd.enable(model, allow_cpu=True)
    dd.disable(model)
    assert dd.disable(model) is None
    assert_same(before, snapshot(model))


def test_unsupported_errors_are_value_errors():
    assert issubclass(dd.UnsupportedError, ValueError) and issubclass(dd.UnsupportedError, ditops.Error)


# ---------------------------------------------------------------- the single blocks' joint stream


def test_joint_rows_reuses_a_split_buffer_and_copies_otherwise():
    """A single block's streams that are the two halves of one buffer (the previous single block's
    split output) join without a copy; any other pair is torch.cat's fresh tensor, equal either way."""
    joint = torch.randn(2, 7, 16).bfloat16()
    text, image = joint[:, :3], joint[:, 3:]
    got = _common.joint_rows(text, image)
    assert got.data_ptr() == joint.data_ptr() and got.stride() == joint.stride() and torch.equal(got, joint)
    for first, second in [(text.clone(), image), (image, text),  # not one buffer; the wrong order
                          (joint[:, :3, :8], joint[:, 3:, :8]),   # column slices: rows not adjacent
                          (joint[:1, :3], joint[1:, 3:])]:        # different batches
        want = torch.cat([first, second], dim=1) if first.shape[0] == second.shape[0] else None
        if want is None:
            with pytest.raises(RuntimeError):
                _common.joint_rows(first, second)
            continue
        got = _common.joint_rows(first, second)
        assert torch.equal(got, want) and got.data_ptr() != joint.data_ptr()


@pytest.mark.parametrize("name", ["flux", "hunyuan"])
def test_single_blocks_join_token_halves_without_a_copy(monkeypatch, name):
    """Each of two adjacent halves of one buffer that a single block concatenates is that buffer:
    FLUX.1's streams from the previous single block (one join a block); HunyuanVideo's streams, the
    norm output's halves in the attention and the attention output's halves after it (three). Only
    the first single block's stream join copies, and the forward equals the unpatched model's."""
    model, inputs, _ = TINY[name]()
    reference = run(model, inputs)
    dd.enable(model, allow_cpu=True)
    joined = []
    real = _common.joint_rows

    def counting(first, second):
        out = real(first, second)
        joined.append(out.data_ptr() in (first.data_ptr(), second.data_ptr()))
        return out

    monkeypatch.setattr(_common, "joint_rows", counting)
    try:
        assert torch.equal(run(model, inputs), reference)
    finally:
        dd.disable(model)
    joins = {"flux": 1, "hunyuan": 3}[name] * model.config.num_single_layers
    assert joined == [False] + [True] * (joins - 1), joined


# ---------------------------------------------------------------- torch.compile


def test_verified_sites_compile_fullgraph_into_the_ops():
    """After one eager call verified the signatures, a block traces with fullgraph=True and the
    graph holds the ditops custom ops (a recording backend: no inductor compile)."""
    model, inputs, _ = tiny_flux()
    dd.enable(model, CLOSE, allow_cpu=True)  # the close tier: layernorm_modulate's CPU reference runs too
    run(model, inputs)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    block = model.single_transformer_blocks[0]
    gen = torch.Generator().manual_seed(3)
    hidden, context = (torch.randn(1, n, 128, generator=gen).bfloat16() for n in (16, 8))
    temb = torch.randn(1, 128, generator=gen).bfloat16()
    rotary = model.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]]))
    torch._dynamo.reset()
    with torch.no_grad():
        eager = block(hidden, context, temb, rotary)
        compiled = torch.compile(block, fullgraph=True, backend=recording)(hidden, context, temb, rotary)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    ours = sorted(t for t in targets if t.startswith("ditops."))
    assert ours == ["ditops.gelu_tanh", "ditops.layernorm_modulate", "ditops.qknorm_rope", "ditops.residual_gate_add"], targets


@pytest.mark.parametrize("name", ["wan", "ltx2"])
def test_cross_head_sites_compile_fullgraph_into_the_ops(name):
    """A whole tiny Wan / LTX-2 forward traces with fullgraph=True after one eager call verified
    the signatures (a recording backend): the graph holds the cross-head op and the sites' others,
    and runs to the eager values."""
    model, inputs, _ = TINY[name]()
    dd.enable(model, CLOSE, allow_cpu=True)
    eager = run(model, inputs)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled = torch.compile(model, fullgraph=True, backend=recording)(**inputs)
    finally:
        torch._dynamo.reset()
    assert torch.equal(torch.cat([o.flatten() for o in compiled]), eager)
    ours = sorted({t for t in targets if t.startswith("ditops.")})
    others = ["ditops.norm_scale_shift", "ditops.residual_gate_add"]
    if name == "ltx2":  # the rope modules' tables
        others.append("ditops.fractional_rope_tables")
    assert ours == sorted(["ditops.cross_head_qknorm_rope", *others]), targets


# ---------------------------------------------------------------- FLUX.1's RoPE tables (pos_embed)


def flux1_joint_ids(text, H, W):
    """FLUX.1's joint ids: `text` rows of zeros, then (0, h, w) over an H x W latent grid."""
    grid = torch.meshgrid(torch.zeros(1), torch.arange(float(H)), torch.arange(float(W)), indexing="ij")
    return torch.cat([torch.zeros(text, 3), torch.stack(grid, -1).reshape(-1, 3)])


def test_flux_rope_tables_site_at_pos_embed():
    """FLUX.1's pos_embed (FluxPosEmbed) is the rope_tables site: planned with the module's chain and
    patched by enable. Close tier (the op's CPU reference): the tables within a float32 ulp of the
    module's own forward (2^-10 below it) and the model's output within the CPU tests' bound of the
    unpatched one. Exact tier: on the CPU the reference is close, so the site is unfit and the
    module's own code runs (the output is the unpatched one)."""
    model, inputs, _ = tiny_flux()
    reference = run(model, inputs)
    site = dd.plan(model)["rope_tables (pos_embed)"]
    assert site.op == "rope_tables" and site.places == ["pos_embed (txt_ids + img_ids)"]
    assert "FluxPosEmbed.forward" in site.chain and "float64" in site.chain
    ids = flux1_joint_ids(8, 9, 11)
    ids[3:6, 1] = torch.tensor([1e4, -1e4, -77.5])  # large and negative positions
    cls = type(model.pos_embed)
    want = cls.forward(model.pos_embed, ids)

    report = dd.enable(model, CLOSE, allow_cpu=True, sites=["rope_tables"])
    assert "forward" in model.pos_embed.__dict__
    got = model.pos_embed(ids)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert bool(((a.double() - b.double()).abs() <= _rope_tables_bound(b, (), {})).all())
    out = run(model, inputs)
    rope = report["rope_tables (pos_embed)"]
    assert rope.fused_calls == 2 and not rope.reasons and not rope.unfit  # the ids above, then the model's
    diff = float((out.float() - reference.float()).abs().max())
    print(f"flux rope_tables high: max |patched - unpatched| = {diff:.3g}")
    assert diff <= 0.05 * float(reference.float().abs().max())
    dd.disable(model)
    assert "forward" not in model.pos_embed.__dict__

    report = dd.enable(model, STRICT, allow_cpu=True, sites=["rope_tables"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = run(model, inputs)
    rope = report["rope_tables (pos_embed)"]
    assert rope.fused_calls == 0 and rope.unfit, (rope.fused_calls, rope.unfit)
    assert all("not bit_exact" in why for why in rope.unfit.values()), rope.unfit
    assert torch.equal(out, reference)
    dd.disable(model)


def test_flux_rope_tables_site_leaves_other_pos_embeds_to_the_model():
    """A pos_embed that is not FluxPosEmbed itself, or ids of more columns than axes_dim, run the
    model's code (the site says why)."""
    model, inputs, _ = tiny_flux()
    reference = run(model, inputs)

    class OtherPosEmbed(type(model.pos_embed)):
        pass

    original = model.pos_embed
    model.pos_embed = OtherPosEmbed(theta=original.theta, axes_dim=original.axes_dim)
    site = dd.plan(model)["rope_tables (pos_embed)"]
    assert site.op is None and "OtherPosEmbed" in site.why
    model.pos_embed = original
    report = dd.enable(model, CLOSE, allow_cpu=True, sites=["rope_tables"])
    wide = torch.zeros(4, 4)
    with pytest.warns(RuntimeWarning, match="runs the model's code for a call"):
        with pytest.raises(IndexError):  # the model's own code: FluxPosEmbed has 3 widths for 4 columns
            model.pos_embed(wide)
    assert any("4 columns" in why for why in report["rope_tables (pos_embed)"].fallbacks)
    dd.disable(model)
    assert torch.equal(run(model, inputs), reference)


# ---------------------------------------------------------------- GPU (torch.equal on CUDA)

needs_cuda = needs_cuda_mark(torch)


# The GPU test's models: every tiny model, and the forms whose chains differ in layout or tables.
GPU_MODELS = dict(TINY, **{
    "wan_ti2v": lambda batch: tiny_wan(batch=batch, per_token_timestep=True),
    "wan_fused_qkv": lambda batch: tiny_wan(batch=batch, fused_qkv=True),
    "ltx2_interleaved": lambda batch: tiny_ltx2(batch=batch, rope_type="interleaved"),
    "ltx2_gated_stg": lambda batch: tiny_ltx2(batch=batch, variant="gated_stg"),
})


@needs_cuda
@pytest.mark.parametrize("name", sorted(GPU_MODELS))
@pytest.mark.parametrize("batch", [1, 2])
def test_gpu_patched_equals_unpatched(name, batch):
    model, inputs, _ = GPU_MODELS[name](batch=batch)
    model = model.to("cuda")
    inputs = {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in inputs.items()}
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
        if site.active and site.places:
            assert site.fused_calls > 0, site.name
    if name.startswith("wan"):  # issue 44's rows: residual + norm2 / norm3 in one call, on a device implementation
        for site_name in WAN_FUSED:
            site = report[site_name]
            assert_runs_verified(site, forwards=2)
            assert not any(i.endswith(".reference") for i in site.implementations.values()), site.implementations
    assert not [w for w in caught if "ditops" in str(w.message)], [str(w.message) for w in caught]
    dd.disable(model)
    assert torch.equal(run(model, inputs), reference)


def _compiled_output(model, inputs, backend):
    """The whole forward under torch.compile(fullgraph=True) with `backend` wrapped to record the
    graph Dynamo hands it: (the flattened output of two calls, the ditops ops in that graph)."""
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return backend(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording)
    try:
        with torch.no_grad():
            out, again = (torch.cat([o.flatten() for o in compiled(**inputs)]) for _ in range(2))
    finally:
        torch._dynamo.reset()
    return out, again, sorted({t for t in targets if t.startswith("ditops.")})


def _cuda_tiny(name):
    model, inputs, _ = TINY[name]()
    model = model.to("cuda")
    return model, {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in inputs.items()}


@needs_cuda
@pytest.mark.parametrize("name", ["flux", "qwen", "wan", "ltx2"])
def test_gpu_compile_fullgraph_equals_eager(name):
    """torch.compile(fullgraph=True) through AOTAutograd (functionalization, the ops' fake
    implementations and mutation schemas) with the traced ATen graph run as it is (backend
    aot_eager): the glue runs eager's kernels and each site its op, so the output is torch.equal to
    the eager forward with ditops, which is the unpatched model's."""
    model, inputs = _cuda_tiny(name)
    unpatched = run(model, inputs)
    dd.enable(model)
    eager = run(model, inputs)  # the warm-up: first sight runs outside tracing
    assert torch.equal(eager, unpatched)
    out, again, ours = _compiled_output(model, inputs, torch._dynamo.lookup_backend("aot_eager"))
    assert ours == compiled_ops(name), ours
    assert torch.equal(out, eager) and torch.equal(again, eager)


@needs_cuda
@pytest.mark.parametrize("name", ["flux", "qwen", "wan", "ltx2"])
def test_gpu_compile_inductor_keeps_the_sites_as_ops(name):
    """Under inductor (torch.compile's default backend, fullgraph) the sites stay the ditops
    custom ops (opaque to inductor), and the compiled forward is deterministic. What compile
    changes is the glue: inductor fuses the model's own code into its kernels with other
    reductions and roundings, so the output is eager's neither with nor without ditops (FLUX.1-dev
    at full depth: 235767 elements differ from eager, H200 report at bda4c1e). The tiny random
    models amplify those roundings (tiny FLUX.2 in bf16: compile alone is 40 % of the output's norm
    from eager, in float32 1e-6), so the bound is compile's own: with ditops the compiled output is
    no further from eager than twice the unpatched model's compiled output is (or 5 % of eager's
    largest magnitude, the close tier's bound, where that is larger); both differences printed."""
    from torch._inductor.compile_fx import compile_fx
    model, inputs = _cuda_tiny(name)
    eager = run(model, inputs)
    plain, _, _ = _compiled_output(model, inputs, compile_fx)
    dd.enable(model)
    assert torch.equal(run(model, inputs), eager)  # the warm-up: first sight runs outside tracing
    out, again, ours = _compiled_output(model, inputs, compile_fx)
    assert ours == compiled_ops(name), ours
    assert torch.equal(out, again)
    diff, plain_diff = (float((o.float() - eager.float()).abs().max()) for o in (out, plain))
    print(f"{name}: max |compiled - eager| with ditops {diff:.3g} ({int((out != eager).sum())} of {out.numel()} "
          f"elements differ), without {plain_diff:.3g}")
    assert diff <= max(2 * plain_diff, 0.05 * float(eager.float().abs().max()))


@needs_cuda
def test_gpu_flux_rope_tables_equal_the_module():
    """FLUX.1's real axes (16, 56, 56; theta 10000) on a one-block model of 128-wide heads: the patched
    pos_embed's tables torch.equal to FluxPosEmbed.forward's for the 1024 x 1024 joint ids (512 text
    rows, a 64 x 64 grid), a 64 x 72 grid and large and negative positions, and the whole model
    torch.equal to the unpatched one (the site verified at first sight, then run)."""
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=1,
        joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(16, 56, 56))
    model = randomize(model).to(torch.bfloat16).to("cuda")
    gen = torch.Generator().manual_seed(2)
    inputs = dict(hidden_states=torch.randn(1, 16, 8, generator=gen).to(torch.bfloat16),
                  encoder_hidden_states=torch.randn(1, 8, 32, generator=gen).to(torch.bfloat16),
                  pooled_projections=torch.randn(1, 16, generator=gen).to(torch.bfloat16),
                  timestep=torch.full((1,), 0.5).to(torch.bfloat16), img_ids=flux1_joint_ids(0, 4, 4),
                  txt_ids=torch.zeros(8, 3), return_dict=False)
    inputs = {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in inputs.items()}
    reference = run(model, inputs)
    cls = type(model.pos_embed)
    large = flux1_joint_ids(4, 3, 3)
    large[:, 1] = torch.linspace(-1e5, 1e5, large.shape[0])
    tables = [flux1_joint_ids(512, 64, 64), flux1_joint_ids(512, 64, 72), large]
    report = dd.enable(model, sites=["rope_tables"])
    for ids in tables:
        ids = ids.to("cuda")
        got, want = model.pos_embed(ids), cls.forward(model.pos_embed, ids)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        half = ids.to(torch.bfloat16)  # a pipeline's ids: ids.float() inside, as the module converts them
        assert torch.equal(model.pos_embed(half)[0], cls.forward(model.pos_embed, half)[0])
    assert torch.equal(run(model, inputs), reference) and torch.equal(run(model, inputs), reference)
    rope = report["rope_tables (pos_embed)"]
    assert not rope.reasons and not rope.unfit and rope.fused_calls == 2 * len(tables) + 2, (rope.reasons, rope.unfit)
    dd.disable(model)
