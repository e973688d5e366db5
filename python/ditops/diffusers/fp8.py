"""FP8 block linears in a diffusers transformer (issue 43): enable(model_or_pipe, fp8=True).

Every nn.Linear of the transformer blocks becomes an Fp8Linear: e4m3 weights quantized once per
output channel at enable, the activation quantized per token at each call, one torch._scaled_mm
with bf16 out. The recipe is torchao 0.18's Float8DynamicActivationFloat8WeightConfig(
granularity=PerRow()) on its "torch" kernel path (no mslk package: quant_primitives'
_choose_scale_float8 / _quantize_affine_float8, float8_tensor's _float8_addmm_impl,
float8/inference's addmm_float8_unwrapped_inference), for a row y of the model's bf16:

    amax = y.abs().amax(-1, keepdim=True)                    # bf16, exact
    s    = (amax / 448.0).to(float32)                        # the quotient rounded to bf16 (ATen)
    s    = where(s == 0, 1.0, s)                             # ours: an all-zero row
    q    = (y.float() / s).clamp(-448, 448).to(float8_e4m3fn)
    out  = torch._scaled_mm(q [M, K], q_w.t() [K, N], scale_a=s [M, 1], scale_b=s_w.t() [1, N],
                            bias=bias, out_dtype=bfloat16, use_fast_accum=True)

with q_w, s_w the same chain over each row of W [N, K]. Where it differs from torchao: a row whose
scale is 0 (all zeros) takes s = 1 (q = 0, the GEMM gives the bias) where torchao divides 0 by 0
(a NaN row). Both keep a linear whose in or out features are not multiples of 16 in bf16
(torch._scaled_mm needs them). torchao's quantize_ takes every nn.Linear of the model by default;
here the blocks' linears, minus Fp8Config.skip.

Numeric contract: the FP8 forward equals, bit for bit, the model's own code with every block
linear swapped for that chain (plain_chain() below; no producer, no site), on CUDA. The producer
ops (one pass that already reads the row: the adaLN LayerNorm-modulate, GELU(tanh) or FLUX.2's
SwiGLU of the FF-up output, the single blocks' cat(attn, gelu(mlp)) or cat(attn, swiglu(mlp)), a
linear's bf16 input) run where the op table
lists them and their first sight per signature is bit-equal to the chain (the sites' mechanism,
_sites.Site, always in the strict tier); otherwise the chain runs. So the numbers never depend on
whether a producer ran. How far the chain moves the output from bf16 is measured in the bench
(python -m ditops.diffusers.bench --model flux --variants eager,fp8,...), never called exact.

Memory: an Fp8Linear holds the e4m3 weight and its float32 scales on the device; the bf16 weight
goes to the CPU (host memory, the size of the bf16 block weights), and disable() puts it back,
the same Parameter objects and values, with the same nn.Linear objects in their places.

LoRA: fuse and unload it before enable (pipe.fuse_lora(); pipe.unload_lora_weights()); the fused
weights are what gets quantized. A model with peft layers is refused, and loading, fusing or
unfusing a LoRA while FP8 is enabled raises, saying how (disable, load, fuse, enable).
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

import ditops
from ditops import Error

from . import _sites
from ._sites import MappedSite, Mapping, OpCall, Site

# The custom ops the producer sites call (a module attribute: tests substitute a namespace).
ops = torch.ops.ditops

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max

# The block lists whose nn.Linear modules become FP8, per model class (the transformer blocks;
# embedders, norm_out and proj_out stay bf16).
BLOCK_LISTS = {
    "FluxTransformer2DModel": ("transformer_blocks", "single_transformer_blocks"),
    "Flux2Transformer2DModel": ("transformer_blocks", "single_transformer_blocks"),
    "QwenImageTransformer2DModel": ("transformer_blocks",),
    "WanTransformer3DModel": ("blocks",),
    "HunyuanVideoTransformer3DModel": ("transformer_blocks", "single_transformer_blocks"),
    "LTX2VideoTransformer3DModel": ("transformer_blocks",),
}

# PeftAdapterMixin methods that would load, fuse or unfuse a LoRA into weights FP8 has quantized.
LORA_METHODS = ("load_lora_adapter", "add_adapter", "fuse_lora", "unfuse_lora", "enable_lora_hotswap")


# ---------------------------------------------------------------- the chain

# The recipe's one copy, the producer ops' oracle (python/ditops/eager/fp8_rowwise.py).
from ditops.eager.fp8_rowwise import fp8_rowwise_eager  # noqa: E402
from ditops.eager.swiglu import swiglu  # noqa: E402


def gelu_tanh(x):
    """diffusers' GELU(approximate="tanh") and nn.GELU(approximate="tanh"): one rounding."""
    return F.gelu(x, approximate="tanh")


# fp8_rowwise_quant's act choices the producer sites use: the model's activation (eager) and how
# the chain reads in a report. swiglu: FLUX.2's Flux2SwiGLU (x = [gate | up]).
ACTS = {
    "none": (lambda x: x, "{x}"),
    "gelu_tanh": (gelu_tanh, "F.gelu({x}, approximate='tanh')"),
    "swiglu": (swiglu, "F.silu({x}[..., :N]) * {x}[..., N:]"),
}


class Rowwise(NamedTuple):
    """An activation already in FP8: q e4m3 [..., K] and its per-row float32 scales s [..., 1].
    Model code that only passes it on to linears may read its shape and device."""
    q: torch.Tensor
    s: torch.Tensor

    @property
    def shape(self):
        return self.q.shape

    @property
    def device(self):
        return self.q.device

    def dim(self) -> int:
        return self.q.dim()


def rowwise_scaled_mm(q, s, weight, weight_scale, bias=None, use_fast_accum=True):
    """The recipe's GEMM on CUDA: torch._scaled_mm(q [M, K] row-major, weight.t() [K, N]
    column-major, scale_a=s [M, 1], scale_b=weight_scale.t() [1, N], bias, bf16 out), fast
    accumulation as torchao's default mm_config for rowwise scales."""
    return torch._scaled_mm(q, weight.t(), scale_a=s, scale_b=weight_scale.t(), bias=bias,
                            out_dtype=torch.bfloat16, use_fast_accum=use_fast_accum)


def cpu_stand_in_rowwise_mm(q, s, weight, weight_scale, bias=None, use_fast_accum=True):
    """NOT the recipe's GEMM: a CPU stand-in for tests (torch 2.11's CPU torch._scaled_mm takes
    per-tensor scales only). The dequantized operands' float32 product plus the bias, rounded to
    bf16 once; enable(..., allow_cpu=True) uses it."""
    out = (q.to(torch.float32) * s) @ (weight.to(torch.float32) * weight_scale).t()
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(torch.bfloat16)


# ---------------------------------------------------------------- the FP8 linear


class Fp8Linear(torch.nn.Module):
    """A bf16 nn.Linear as the recipe's FP8 GEMM: e4m3 weight [N, K] and float32 scales [N, 1]
    (buffers, quantized once here), the linear's own bias Parameter, and bf16 out. Takes a bf16
    input (quantized by `quantize`: a producer site or the chain) or a Rowwise pair (used as it
    is). model.to(dtype) moves it but keeps its e4m3 and float32 dtypes."""

    def __init__(self, linear: torch.nn.Linear, quantize=fp8_rowwise_eager, *, use_fast_accum: bool = True,
                 cpu_stand_in: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, s = fp8_rowwise_eager(linear.weight.detach())
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale", s)
        self.register_parameter("bias", linear.bias)
        self.quantize = quantize
        self.use_fast_accum = use_fast_accum
        self.cpu_stand_in = cpu_stand_in

    def forward(self, x):
        if isinstance(x, Rowwise):
            q, s = x.q, x.s
        else:
            if x.dtype != torch.bfloat16:
                raise Error(f"Fp8Linear: x is {x.dtype}; the FP8 path takes the model's bfloat16 activations")
            q, s = self.quantize(x)
        K = self.in_features
        if q.shape[-1] != K:
            raise Error(f"Fp8Linear: x's last dim is {q.shape[-1]}, expected in_features {K}")
        lead = q.shape[:-1]
        q2, s2 = q.reshape(-1, K).contiguous(), s.reshape(-1, 1).contiguous()
        if q2.is_cuda:
            out = rowwise_scaled_mm(q2, s2, self.weight, self.weight_scale, self.bias, self.use_fast_accum)
        elif self.cpu_stand_in:
            out = cpu_stand_in_rowwise_mm(q2, s2, self.weight, self.weight_scale, self.bias)
        else:
            raise Error("Fp8Linear: the FP8 GEMM runs on CUDA (torch 2.11's CPU torch._scaled_mm has no rowwise "
                        "scales); tests enable(..., allow_cpu=True) for a CPU stand-in")
        return out.reshape(*lead, self.out_features)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) / .half() would cast the e4m3 weight and its scales: only moves apply
        kept = {n: self._buffers[n] for n in ("weight", "weight_scale")}
        super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if new.dtype != old.dtype:
                self._buffers[name] = old.to(new.device)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, e4m3 rowwise")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Fp8Config:
    """enable(..., fp8=Fp8Config(...)); fp8=True is Fp8Config().

    skip: glob patterns (fnmatch) of linear paths kept in bf16, relative to the transformer or
      with a pipeline's "transformer." / "transformer_2." prefix: "transformer_blocks.0.*",
      "single_transformer_blocks.37.*", "*.norm*.linear" (FLUX's and HunyuanVideo's modulation
      linears), "*img_mod*" (Qwen-Image's).
    producers: run the fused producer ops where this build lists them (under the first-sight
      check); False: the chain everywhere (the same numbers).
    use_fast_accum: torch._scaled_mm's fast accumulation (torchao's default for rowwise scales).
    """
    skip: tuple = ()
    producers: bool = True
    use_fast_accum: bool = True


def config_of(fp8) -> Fp8Config | None:
    """The Fp8Config of enable's fp8 argument (None, False: no FP8)."""
    from . import UnsupportedError
    if fp8 is None or fp8 is False:
        return None
    if fp8 is True:
        return Fp8Config()
    if isinstance(fp8, dict):
        fp8 = Fp8Config(**fp8)
    if not isinstance(fp8, Fp8Config):
        raise UnsupportedError(f"ditops.diffusers: fp8 must be True, False, None, an Fp8Config or a dict of its "
                               f"fields, not {type(fp8).__name__}; nothing was changed")
    skip = (fp8.skip,) if isinstance(fp8.skip, str) else tuple(fp8.skip)
    if not all(isinstance(p, str) for p in skip):
        raise UnsupportedError(f"ditops.diffusers: Fp8Config.skip takes glob patterns (strings), not {skip!r}; "
                               "nothing was changed")
    return Fp8Config(skip=skip, producers=bool(fp8.producers), use_fast_accum=bool(fp8.use_fast_accum))


# ---------------------------------------------------------------- producer sites


def _op_entry(name: str):
    return next((e for e in ditops.op_table() if e["name"] == name), None)


def producer_why_not(op: str, act: str | None = None, prefix: bool = False) -> str:
    """'' when this build's op table lists the producer op (with the act choice and the prefix
    tensor asked for), else why not."""
    entry = _op_entry(op)
    if entry is None:
        return f"this build of ditops has no {op} op (the chain runs: the same numbers)"
    if act is not None:
        choices = next((list(o["choices"]) for o in entry["options"] if o["name"] == "act"), [])
        if act not in choices:
            return f"{op} has no act={act!r} in this build ({choices})"
    if prefix and not any(t["name"] == "prefix" for t in entry["tensors"]):
        return f"{op} has no prefix tensor in this build"
    return ""


class Fp8QuantSite(Site):
    """An activation quantized to a Rowwise pair: the producer op where this build has it and the
    first sight of the signature was bit-equal (e4m3 bytes and scales) to the chain, else the
    chain. Always the strict tier: a producer changes no number."""

    def __init__(self, name: str, *, op: str | None, chain: str, why: str = "", options=None):
        super().__init__(name, op=op, chain=chain, why=why, options=options)
        self.quality = _sites.strict_tier()
        self.exact = True

    def runs(self) -> str:
        if self.op is None or not self.selected:
            return "the chain: " + self.chain
        return super().runs()

    def _produce(self, why: str, sig, device, op_call, chain, explain):
        """The Rowwise pair of op_call() or chain() (each: (*leading, q, s)); with leading 16-bit
        outputs (a fused residual's new residual), (*leading, the pair). The first sight compares
        the e4m3 bytes, the scales and every leading output."""
        def fused():
            *leading, q, s = op_call()
            return (*leading, q.view(torch.uint8), s)

        def reference():
            *leading, q, s = chain()
            return (*leading, q.view(torch.uint8), s)

        *leading, q, s = self.run(why, sig, device, fused, reference, explain)
        pair = Rowwise(q.view(torch.float8_e4m3fn), s)
        return (*leading, pair) if leading else pair


def _bf16_rows(name: str, x) -> str:
    """'' where x is rows the op takes: last stride 1, the leading dims collapsing into one row
    stride (a contiguous activation, or a column slice of a fused projection)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() < 2:
        return f"{name} is not a bfloat16 tensor of rank >= 2"
    lead = [(n, st) for n, st in zip(x.shape[:-1], x.stride()[:-1]) if n != 1]
    if x.stride(-1) != 1 or any(a[1] != b[0] * b[1] for a, b in zip(lead, lead[1:])):
        return f"{name}'s rows do not have one stride (last stride 1)"
    if x.numel() == 0:
        return f"{name} is empty"
    return ""


class RowwiseQuantSite(Fp8QuantSite):
    """act(x) quantized per row: fp8_rowwise_quant(x, act=act) or the chain fp8_rowwise_eager(act(x)).
    act: a key of ACTS (swiglu: x = [gate | up], the pair has half of x's columns)."""

    prefix = False  # CatActQuantSite: cat([prefix, act(x)], -1)

    def __init__(self, name: str, *, act: str, producers: bool):
        why = producer_why_not("fp8_rowwise_quant", act, prefix=self.prefix) if producers else \
            "producers off (Fp8Config(producers=False)): the chain runs"
        y = ACTS[act][1].format(x="mlp" if self.prefix else "x")
        chain = f"fp8_rowwise_eager(torch.cat([attn, {y}], -1))" if self.prefix else f"fp8_rowwise_eager({y})"
        options = {"act": act, "prefix": "attention output"} if self.prefix else {"act": act}
        super().__init__(name, op=None if why else "fp8_rowwise_quant", chain=chain, why=why, options=options)
        self.act = act

    def __call__(self, x) -> Rowwise:
        return self._quantize(None, x)

    def _quantize(self, prefix, x) -> Rowwise:
        act = self.act
        why = _bf16_rows("x", x)
        if not why and prefix is not None:
            why = _bf16_rows("prefix", prefix)
            if not why and (prefix.shape[:-1] != x.shape[:-1] or prefix.device != x.device):
                why = "prefix and x differ in their leading dims or device"
        if not why and act == "swiglu" and x.shape[-1] % 2:
            why = f"x has {x.shape[-1]} columns (SwiGLU takes [gate | up]: an even count)"
        sig = None if why else (str(x.device), x.shape[-1], x.stride(-2),
                                None if prefix is None else (prefix.shape[-1], prefix.stride(-2)))

        def flat(t):
            return None if t is None else t.reshape(-1, t.shape[-1])

        def op_call():
            q, s = ops.fp8_rowwise_quant(flat(x), flat(prefix), act=act, quality=self.quality)
            return q.reshape(*x.shape[:-1], q.shape[-1]), s.reshape(*x.shape[:-1], 1)

        def chain():
            y = ACTS[act][0](x)
            return fp8_rowwise_eager(y if prefix is None else torch.cat([prefix, y], dim=-1))

        def explain():
            return ditops.explain("fp8_rowwise_quant", flat(x), flat(prefix), act=act, quality=self.quality)

        return self._produce(why, sig, x.device if isinstance(x, torch.Tensor) else None, op_call, chain, explain)


class CatActQuantSite(RowwiseQuantSite):
    """cat([prefix, act(x)], -1) quantized per row (the single blocks: attention output and MLP-up
    output into proj_out / to_out; FLUX's and HunyuanVideo's act gelu_tanh, FLUX.2's swiglu with x
    a column slice of the fused projection): fp8_rowwise_quant(x, prefix, act=act) or the chain."""

    prefix = True

    def __call__(self, prefix, x) -> Rowwise:
        return self._quantize(prefix, x)


def layernorm_modulate_fp8_mapping() -> Mapping:
    """The adaLN modulation quantized per token: layernorm_modulate_fp8_rowwise(x, scale, shift,
    eps), whose bf16 value is never written, with the bf16 site's fit and signature
    (_common.modulate's arguments); op None where this build does not list it."""
    op = "layernorm_modulate_fp8_rowwise"
    why = producer_why_not(op)
    if why:
        return Mapping(why=why)

    def call(x, scale, shift, norm):
        # x's rows as the bf16 site passes them (aten copies a transposed stream too)
        return OpCall(op, (_sites._rows(x), scale, shift), dict(eps=float(norm.eps)),
                      lambda out: (out[0].reshape(x.shape), out[1].reshape(*x.shape[:-1], 1)))

    bf16 = _sites.layernorm_modulate_mapping()
    return Mapping(op=op, fit=bf16.fit, signature=bf16.signature, call=call)


class MappedFp8Site(Fp8QuantSite):
    """A mapped site (an adaLN site: MappedSite(chain, *tensors)) whose 16-bit output feeds FP8
    linears only, as a Rowwise pair: `mapping`'s op call with the per-token e4m3 output
    (norm_scale_shift(..., rowwise_fp8=True): y never written) where this build lists it, else the
    chain: the bf16 site's value (its own op or the model's code, equal to the model's chain) then
    fp8_rowwise_eager. Called as the bf16 site is, so the model's block forward takes it in its
    place. A bf16 site of several outputs (the fused residual + norm2: the new residual, then the
    modulated norm) gives its leading outputs as they are and the pair of its last."""

    def __init__(self, name: str, bf16: MappedSite, mapping: Mapping, *, producers: bool):
        why = mapping.why if producers else "producers off (Fp8Config(producers=False)): the chain runs"
        last = "its last output" if bf16.outputs > 1 else ""
        super().__init__(name, op=None if why else mapping.op,
                         chain=f"fp8_rowwise_eager({last}{' of ' if last else ''}{bf16.name}: {bf16.chain})",
                         why=why, options=mapping.options)
        self.bf16, self.mapping = bf16, mapping

    def __call__(self, chain, *tensors):
        m = self.mapping
        why = m.fit(*tensors) if self.active else ""
        sig = None if why or not self.active else m.signature(*tensors)

        def op_call():
            c = m.call(*tensors)
            return c.output(getattr(ops, c.op)(*c.args, quality=self.quality, **c.kwargs))

        def explain():
            c = m.call(*tensors)
            return ditops.explain(c.op, *c.args, quality=self.quality, **c.kwargs)

        def reference():
            out = self.bf16(chain, *tensors)
            if self.bf16.outputs == 1:
                return fp8_rowwise_eager(out)
            return (*out[:-1], *fp8_rowwise_eager(out[-1]))

        return self._produce(why, sig, tensors[0].device, op_call, reference, explain)


# ---------------------------------------------------------------- what enable changes


class _ModuleSwap:
    """One nn.Linear (or plain-chain target) replaced by its Fp8Linear in the parent's _modules;
    the bf16 weight kept on the CPU meanwhile. restore() moves it back to the device the FP8
    weight is on and puts the same nn.Linear object back."""

    def __init__(self, path, parent, name, linear, make):
        self.path, self.parent, self.name, self.linear, self.make = path, parent, name, linear, make
        self.fp8 = None
        self.device_weight = None

    def apply(self):
        fp8 = self.make(self.linear)
        weight = self.linear.weight
        self.device_weight = weight.device
        weight.data = weight.data.to("cpu")  # the GPU copy is freed: the model holds e4m3 only
        self.parent._modules[self.name] = fp8
        self.fp8 = fp8

    def restore(self) -> str:
        if self.fp8 is None:
            return ""
        if self.parent._modules.get(self.name) is not self.fp8:
            # still give the weight back to the nn.Linear: it is the user's object
            self.linear.weight.data = self.linear.weight.data.to(self.device_weight)
            return f"{self.path} was replaced after enable; left as it is"
        weight = self.linear.weight
        weight.data = weight.data.to(self.fp8.weight.device)
        self.parent._modules[self.name] = self.linear
        self.fp8 = None
        return ""


class _AttributePatch:
    """An instance attribute (a method guard) set on a module; restore removes it."""

    def __init__(self, path, module, name, value):
        self.path, self.module, self.name, self.value = path, module, name, value
        self.had_own, self.own = False, None

    def apply(self):
        self.had_own = self.name in self.module.__dict__
        self.own = self.module.__dict__.get(self.name)
        self.module.__dict__[self.name] = self.value

    def restore(self) -> str:
        if self.module.__dict__.get(self.name) is not self.value:
            return f"{self.path}.{self.name} was replaced after enable; left as it is"
        if self.had_own:
            self.module.__dict__[self.name] = self.own
        else:
            del self.module.__dict__[self.name]
        return ""


def _lora_guard(model_name: str, method: str):
    def refuse(*args, **kwargs):
        from . import UnsupportedError
        verb = {"fuse_lora": "fused", "unfuse_lora": "unfused"}.get(method, "loaded")
        raise UnsupportedError(
            f"ditops.diffusers: FP8 is enabled on {model_name}: its block linears hold e4m3 weights quantized at "
            f"enable, so a LoRA cannot be {verb} now ({method}). To use a LoRA with FP8: "
            "ditops.diffusers.disable(pipe); pipe.load_lora_weights(...); pipe.fuse_lora(); "
            "pipe.unload_lora_weights(); ditops.diffusers.enable(pipe, fp8=...)")
    refuse.__name__ = method
    return refuse


def lora_refusal(path: str, model) -> str:
    """Why FP8 cannot quantize this model's weights as they are (peft LoRA layers in it), or ''."""
    for name, module in model.named_modules():
        if not any(c.__name__ == "BaseTunerLayer" for c in type(module).__mro__):
            continue
        where = f"{path}{name}" if name else path or "the model"
        active = list(getattr(module, "active_adapters", []) or [])
        merged = list(getattr(module, "merged_adapters", []) or [])
        if any(a not in merged for a in active) or not merged:
            return (f"ditops.diffusers: {where} holds LoRA adapter(s) {active or merged} loaded but not fused; "
                    "FP8 quantizes the linears' weights once, so fuse the LoRA first: pipe.fuse_lora(); "
                    "pipe.unload_lora_weights() (the fused weights stay); then enable(pipe, fp8=...). "
                    "Nothing was changed")
        return (f"ditops.diffusers: {where} has LoRA adapter(s) {merged} fused but their peft layers are still "
                "loaded; call pipe.unload_lora_weights() (or model.unload_lora()) after fuse_lora(): the fused "
                "weights stay, and enable(pipe, fp8=...) quantizes them. Nothing was changed")
    return ""


# ---------------------------------------------------------------- the plan


class Fp8Summary:
    """The FP8 part of the report: the linears in FP8, those kept in bf16 and why, the weight
    bytes on the device before and after (the block linears' weights and scales)."""

    def __init__(self, config: Fp8Config):
        self.config = config
        self.linears: list[str] = []
        self.kept: list[tuple[str, str]] = []
        self.bf16_bytes = 0
        self.fp8_bytes = 0

    def as_dict(self) -> dict:
        return {"config": {"skip": list(self.config.skip), "producers": self.config.producers,
                           "use_fast_accum": self.config.use_fast_accum},
                "linears": len(self.linears), "kept": [list(k) for k in self.kept],
                "bf16_weight_bytes": self.bf16_bytes, "fp8_weight_bytes": self.fp8_bytes}

    def __str__(self):
        mib = 1 << 20
        rows = [f"  fp8: {len(self.linears)} block linears as e4m3 rowwise GEMMs (weights {self.bf16_bytes / mib:.1f} "
                f"MiB bf16 -> {self.fp8_bytes / mib:.1f} MiB e4m3 + scales on the device; the bf16 weights wait on "
                f"the CPU for disable), {len(self.kept)} kept in bf16"]
        for path, why in self.kept[:5]:
            rows.append(f"    bf16 at {path}: {why}")
        if len(self.kept) > 5:
            rows.append(f"    ... and {len(self.kept) - 5} more")
        return "\n".join(rows)


class Context:
    """What a model mapping reads and adds while enable plans FP8 for one model."""

    def __init__(self, model, plan, config: Fp8Config, summary: Fp8Summary, cpu_stand_in: bool):
        self.model, self.plan, self.config, self.summary = model, plan, config, summary
        self.cpu_stand_in = cpu_stand_in
        self.fp8_ids: set = set()          # ids of the nn.Linear objects that become FP8
        producers = config.producers
        self.linear_input = RowwiseQuantSite("fp8_quant (linear input)", act="none", producers=producers)
        self.gelu = RowwiseQuantSite("fp8_quant (gelu ff)", act="gelu_tanh", producers=producers)
        self.cat_gelu = CatActQuantSite("fp8_quant (cat attn + gelu mlp)", act="gelu_tanh", producers=producers)
        self.swiglu = RowwiseQuantSite("fp8_quant (swiglu ff)", act="swiglu", producers=producers)
        self.cat_swiglu = CatActQuantSite("fp8_quant (cat attn + swiglu mlp)", act="swiglu", producers=producers)
        self._mapped = self._residual = None
        for site in (self.linear_input, self.gelu, self.cat_gelu, self.swiglu, self.cat_swiglu):
            plan.add_site(site)

    def site(self, name: str):
        """The sites plan's site of that name (the bf16 sites the FP8 forwards call)."""
        return next(s for s in self.plan.sites if s.name == name)

    def adaln(self, bf16: MappedSite) -> MappedFp8Site:
        """bf16's (layernorm_modulate's) output as a Rowwise pair: layernorm_modulate_fp8_rowwise or the chain."""
        return self.mapped_fp8(bf16, layernorm_modulate_fp8_mapping())

    def mapped_fp8(self, bf16: MappedSite, mapping: Mapping) -> MappedFp8Site:
        """bf16's output as a Rowwise pair for all its consumers (one site object per model):
        mapping's op with its FP8 output, or the chain."""
        if self._mapped is None:
            self._mapped = self.plan.add_site(MappedFp8Site("fp8_quant (adaLN)", bf16, mapping,
                                                            producers=self.config.producers))
        return self._mapped

    def residual_adaln(self, bf16: MappedSite) -> MappedFp8Site:
        """The fused gated residual + modulated norm2 (bf16: that site) whose norm feeds FP8 linears:
        (the new residual, a Rowwise pair) from norm_scale_shift(..., residual=, rowwise_fp8=True),
        or the chain: bf16's outputs, then fp8_rowwise_eager of the norm. One site per model."""
        if self._residual is None:
            from . import _common
            mapping = _common.RESIDUAL_ADALN_FP8 if _sites.op_tensor_dtypes("norm_scale_shift", "fp8_rowwise") else \
                Mapping(why="this build's norm_scale_shift has no fp8_rowwise output (the chain runs: the same numbers)")
            self._residual = self.plan.add_site(MappedFp8Site("fp8_quant (residual + adaLN)", bf16, mapping,
                                                              producers=self.config.producers))
        return self._residual

    def fp8(self, *modules) -> bool:
        """Every module is an nn.Linear that becomes FP8 (a consumer of a Rowwise pair)."""
        return all(m is not None and id(m) in self.fp8_ids for m in modules)

    def patch_forward(self, path, module, forward):
        self.plan.patch_forward(path, module, forward)


def select_linears(prefix, model, config: Fp8Config, summary: Fp8Summary | None = None):
    """[(path, parent, child name, nn.Linear)] of the block linears that become FP8; the others of
    the blocks go to summary.kept with the reason."""
    lists = BLOCK_LISTS[type(model).__name__]
    chosen = []
    for list_name in lists:
        blocks = getattr(model, list_name, None)
        if blocks is None:
            continue
        for parent_path, parent in blocks.named_modules(prefix=list_name):
            for name, child in parent._modules.items():
                if child is None:
                    continue
                path = f"{parent_path}.{name}"
                if not isinstance(child, torch.nn.Linear):
                    continue
                why = ""
                if any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(prefix + path, p) for p in config.skip):
                    why = "Fp8Config.skip"
                elif type(child) is not torch.nn.Linear:
                    why = f"{type(child).__name__} is not torch.nn.Linear"
                elif child.weight.dtype != torch.bfloat16:
                    why = f"weight is {child.weight.dtype} (the rowwise recipe takes bfloat16 weights)"
                elif child.in_features % 16 or child.out_features % 16:
                    why = (f"{child.in_features} -> {child.out_features} features (torch._scaled_mm needs multiples "
                           "of 16)")
                if why:
                    if summary is not None:
                        summary.kept.append((prefix + path, why))
                    continue
                chosen.append((path, parent, name, child))
    return chosen


def plan(prefix: str, model, plan_, config: Fp8Config, summary: Fp8Summary, cpu_stand_in: bool) -> None:
    """Add the FP8 changes of one model to its sites plan (applied after the sites' patches, so
    the FP8 forwards layer over the sites' and disable undoes them first). Raises UnsupportedError,
    with nothing changed, for a model holding peft LoRA layers."""
    from . import UnsupportedError
    from . import _fp8_models
    why = lora_refusal(prefix, model)
    if why:
        raise UnsupportedError(why)
    ctx = Context(model, plan_, config, summary, cpu_stand_in)
    linears = select_linears(prefix, model, config, summary)
    for path, parent, name, linear in linears:
        ctx.fp8_ids.add(id(linear))
        summary.linears.append(prefix + path)
        n, k = linear.weight.shape
        summary.bf16_bytes += n * k * 2
        summary.fp8_bytes += n * k + n * 4

        def make(lin, quant=ctx.linear_input):
            return Fp8Linear(lin, quant, use_fast_accum=config.use_fast_accum, cpu_stand_in=cpu_stand_in)
        plan_.patches.append(_ModuleSwap(prefix + path, parent, name, linear, make))
        ctx.linear_input.places.append(prefix + path)
    _fp8_models.map_feed_forwards(ctx)
    mapping = _fp8_models.MAPPINGS.get(type(model).__name__)
    if mapping is not None:
        mapping(ctx)
    # a producer site with no place in this model (Wan has no single-block cat) is not reported
    plan_.sites = [s for s in plan_.sites if not (isinstance(s, Fp8QuantSite) and not s.places)]
    for method in LORA_METHODS:
        if hasattr(model, method):
            plan_.patches.append(_AttributePatch(prefix or "the model", model, method,
                                                 _lora_guard(prefix.rstrip(".") or type(model).__name__, method)))


# ---------------------------------------------------------------- the plain chain (the oracle)


class PlainChain:
    """The model's own code with its block linears swapped for the recipe's plain-PyTorch chain
    (plain_chain()); restore() puts the bf16 linears back."""

    def __init__(self, model, swaps, summary):
        self.model, self.swaps, self.summary = model, swaps, summary

    def restore(self) -> None:
        for swap in reversed(self.swaps):
            why = swap.restore()
            if why:
                warnings.warn(f"ditops.diffusers.fp8: {why}", RuntimeWarning, stacklevel=2)
        self.swaps = []


def plain_chain(model, config: Fp8Config | bool = True, *, allow_cpu: bool = False) -> PlainChain:
    """Swap the block linears of a supported diffusers transformer (the same ones enable(fp8=config)
    takes) for Fp8Linears that quantize every input with fp8_rowwise_eager: no producer, no ditops
    site, the model's own code everywhere else. The chain the FP8 forward equals bit for bit, and
    the bench's FP8 baseline where torchao does not import. allow_cpu: the CPU stand-in GEMM."""
    from . import SUPPORTED_MODELS, UnsupportedError
    config = config_of(config) or Fp8Config()
    if type(model).__name__ not in SUPPORTED_MODELS:
        raise UnsupportedError(f"ditops.diffusers.fp8.plain_chain: {type(model).__name__} is not supported")
    why = lora_refusal("", model)
    if why:
        raise UnsupportedError(why)
    summary = Fp8Summary(config)
    swaps = []
    for path, parent, name, linear in select_linears("", model, config, summary):
        summary.linears.append(path)
        swaps.append(_ModuleSwap(path, parent, name, linear,
                                 lambda lin: Fp8Linear(lin, fp8_rowwise_eager, use_fast_accum=config.use_fast_accum,
                                                       cpu_stand_in=allow_cpu)))
    done = []
    try:
        for swap in swaps:
            swap.apply()
            done.append(swap)
    except BaseException:
        for swap in reversed(done):
            swap.restore()
        raise
    return PlainChain(model, swaps, summary)
