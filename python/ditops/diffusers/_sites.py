"""The sites ditops serves in a diffusers transformer, and the per-call decision at each.

A site class (QK norm + RoPE, adaLN LayerNorm-modulate, gated residual, ...) is one `Site` per
enabled model, a `MappedSite` whose `Mapping` states its op call beside the model's chain: its
static description (the op that runs there, its options, the model's chain it
must reproduce, or why the model's code runs instead), the places it serves, and its state. Each
call decides, in order:

  1. the site is active (an op is mapped and the site was selected), else the model's code;
  2. the call fits the mapping (what its signature and op call need, and the model's chain's own
     rules: the mapping's fit), else the model's code for this call only (counted, one warning per
     reason); what only the op's matcher decides (dtypes, shapes, strides) it decides at 4, once
     per signature;
  3. the signature's state: verified -> the op; disabled -> the model's code; unverified -> the
     first-sight check, never while tracing (torch.compile) or capturing a CUDA graph: there an
     unverified signature takes the model's code, so run one eager call before compiling;
  4. first sight: the dispatcher must take the call (ditops.explain; in the exact tier with an
     implementation whose contract is bit_exact: a close CPU reference is no better a fallback
     than the model's own chain), then the model's chain and the op both run. In the exact tier (the default) the outputs must be torch.equal:
     equal -> verified, else a RuntimeWarning, the signature is disabled and the model's values
     are returned. In the tiers that admit close implementations (lossless, high) the difference is recorded in the report
     and the op's values are kept.

Sites may be called from several threads at once (a model called by several threads): each
site's counters and signature states change under its lock, a signature disabled by any
first-sight check stays disabled (two first sights of one signature cannot end verified when one
saw a difference), and the rotary table cache is per thread.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

import ditops
from ditops import Error
# Signature states: verified (the op runs), disabled (first sight failed: warned), unfit (the
# dispatcher has no implementation for it that may run here); one not seen yet is unverified.
# Kept by ditops._gate, the mechanism ditops.torch's self-check shares; read as _sites.*.
from ditops._gate import DISABLED, UNFIT, VERIFIED, Gate  # noqa: F401
from ditops.torch import _token_rows, _tracing_or_capturing

# The custom ops the sites call (a module attribute: tests substitute a namespace that perturbs
# or fails them to drive the fallback paths).
ops = torch.ops.ditops

# The core's tiers (docs/quality.md): exact, the default, admits only bit_exact implementations.
TIERS = ("exact", "lossless", "high")


def strict_tier() -> str:
    """The tier that admits only bit_exact implementations (the default)."""
    return "exact"


def effective_quality(quality) -> str:
    """The tier a call runs in: quality, else DITOPS_QUALITY, else the strict default. Raises for a
    name the core does not know."""
    name = quality if quality is not None else (os.environ.get("DITOPS_QUALITY") or strict_tier())
    name = str(name).strip().lower()
    if name not in TIERS:
        raise Error(f"ditops.diffusers: unknown quality {name!r} (expected {', '.join(TIERS)}; the default, "
                    "bit-exact tier is 'exact')")
    return name


_CONTRACTS: dict = {}


def _contract(implementation: str) -> str:
    """bit_exact or close, as the registry states it for the implementation."""
    if not _CONTRACTS:
        # one update of a complete dict: a thread never reads a partly filled table
        _CONTRACTS.update({k["name"]: k["contract"] for k in ditops.list_kernels()})
    return _CONTRACTS.get(implementation, "unknown")


def op_options(op: str) -> dict:
    """The options the compiled op table declares for `op`: name -> choices (or [])."""
    for entry in ditops.op_table():
        if entry["name"] == op:
            return {o["name"]: list(o["choices"]) for o in entry["options"]}
    return {}


def op_tensor_dtypes(op: str, tensor: str) -> str:
    """The dtype rule the compiled op table declares for one tensor of `op` ("bf16|f16",
    "=residual|f32", ...), or "" when the op or the tensor is not there."""
    for entry in ditops.op_table():
        if entry["name"] == op:
            return next((t["dtypes"] for t in entry["tensors"] if t["name"] == tensor), "")
    return ""


class Site:
    """One site class of one enabled model: what runs there, where, and what happened."""

    def __init__(self, name: str, *, op: str | None, chain: str, why: str = "", options=None,
                 note: str = "", classes=None):
        self.name = name
        # the site classes (enable's sites=) that must all be selected for it to run: a row named
        # "class (detail)" belongs to its class; a fused site names each class it serves
        self.classes = tuple(classes) if classes else (name.split(" ", 1)[0],)
        self.op = op                      # the ditops op that runs here; None: the model's code
        self.options = dict(options or {})
        self.chain = chain                # the model's own chain at this site
        self.why = why                    # why the model's code runs here (op None)
        self.note = note                  # what the first-sight check has to decide
        self.places: list[str] = []
        # a fused site's places and, for each, the (site, place) pairs that serve it where this one
        # does not run (hand_back)
        self.parts: list[tuple[str, list]] = []
        self.skipped: list[tuple[str, str]] = []   # places left to the model's code, and why
        self.selected = True
        self.quality = None               # the tier passed to the op (enable sets it)
        self.exact = True                 # first sight requires torch.equal
        self.gate = Gate()                # states, reasons (disabled), unfit: first sight's results
        self.differences: dict = {}       # signature -> (differing elements, max |difference|)
        self.implementations: dict = {}   # signature -> the implementation the dispatcher chose
        self.fused_calls = 0
        self.model_calls = 0
        self.fallbacks: Counter = Counter()   # reason -> calls that ran the model's code
        self._warned: set = set()
        self._lock = self.gate.lock            # the counters above and the gate's states

    # the gate's dicts under the names the report and callers read
    states = property(lambda self: self.gate.states)    # signature -> VERIFIED / DISABLED / UNFIT
    reasons = property(lambda self: self.gate.reasons)  # disabled signature -> why
    unfit = property(lambda self: self.gate.unfit)      # unfit signature -> why

    # ------------------------------------------------------------ description
    @property
    def active(self) -> bool:
        return self.op is not None and self.selected

    def runs(self) -> str:
        """What runs at this site, in words."""
        if self.op is None:
            return "the model's code"
        if not self.selected:
            return "the model's code (site not selected)"
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return self.op + (f" ({opts})" if opts else "")

    def as_dict(self) -> dict:
        with self._lock:  # other threads' first sights add signatures
            return self._as_dict()

    def _as_dict(self) -> dict:
        return {"site": self.name, "places": len(self.places), "op": self.op if self.active else None,
                "skipped": [list(s) for s in self.skipped],
                "options": dict(self.options), "chain": self.chain, "why": self.why, "note": self.note,
                "verified": sum(1 for s in self.states.values() if s == VERIFIED),
                "disabled": {str(k): v for k, v in self.reasons.items()},
                "unfit": {str(k): v for k, v in self.unfit.items()},
                "differences": {str(k): v for k, v in self.differences.items()},
                "implementations": {str(k): v for k, v in self.implementations.items()},
                "fused_calls": self.fused_calls, "model_calls": self.model_calls,
                "fallbacks": dict(self.fallbacks)}

    def fuse(self, place: str, parts) -> None:
        """place is served by this fused site; parts: the (site, place) pairs that serve it
        instead where this site does not run (not selected, no op, or hand_back)."""
        self.places.append(place)
        self.parts.append((place, list(parts)))

    def give(self, place: str, fused: "Site", parts) -> None:
        """place (one of this site's) moves to another fused site, served by parts where that one
        does not run; this site's own parts for it are dropped, not handed back."""
        self.places.remove(place)
        self.parts = [(own, p) for own, p in self.parts if own != place]
        fused.fuse(place, parts)

    def hand_back(self, place: str | None = None) -> None:
        """place (None: every place) is served by the sites this one fuses: their places again."""
        keep = []
        for own, parts in self.parts:
            if place is not None and own != place:
                keep.append((own, parts))
                continue
            self.places.remove(own)
            for site, part in parts:
                site.places.append(part)
        self.parts = keep

    def reset(self) -> None:
        """Forget the first-sight results and the counters."""
        with self._lock:
            self.gate.reset()
            self.differences.clear()
            self.implementations.clear()
            self.fused_calls = self.model_calls = 0
            self.fallbacks.clear()
            self._warned.clear()

    # ------------------------------------------------------------ the decision
    def _count_model_call(self):
        with self._lock:
            self.model_calls += 1

    def _fall_back(self, why: str):
        if torch.compiler.is_compiling():
            return
        with self._lock:
            self.model_calls += 1
            self.fallbacks[why] += 1
            first = why not in self._warned
            self._warned.add(why)
        if first:
            warnings.warn(f"ditops.diffusers: {self.name} runs the model's code for a call: {why}",
                          RuntimeWarning, stacklevel=4)

    def _disable(self, sig, why: str) -> None:
        """sig disabled for good (one warning), its call counted as the model's."""
        self._count_model_call()  # before the warning, which may raise (warnings as errors)
        self.gate.disable(sig, why, f"ditops.diffusers: disabling {self.op} at {self.name} for {sig}: "
                          f"{why}; the model's code runs there", stacklevel=4)  # the site's caller

    def run(self, why_not: str, sig, device, fused, reference, explain):
        """Outputs (a tuple of tensors) of the op or of the model's chain, as decided above.
        fused(): the op's outputs; reference(): the model's chain; explain(): the dispatcher's
        DispatchReport for the call (runs nothing)."""
        if not self.active:
            if not torch.compiler.is_compiling():
                self._count_model_call()
            return reference()
        if why_not:
            self._fall_back(why_not)
            return reference()
        state = self.gate.state(sig)
        if state == VERIFIED:
            if _tracing_or_capturing(device):  # torch.compile's trace too
                return fused()
            try:
                out = fused()
            except Error as e:  # a later call the first sight did not foresee: this call only
                self._fall_back(f"the op failed: {e}")
                return reference()
            with self._lock:
                self.fused_calls += 1
            return out
        if state == DISABLED:
            if not torch.compiler.is_compiling():
                self._count_model_call()
            return reference()
        if state == UNFIT:
            self._fall_back(self.unfit[sig])
            return reference()
        if _tracing_or_capturing(device):
            return reference()
        return self._first_sight(sig, fused, reference, explain)

    def _first_sight(self, sig, fused, reference, explain):
        why = ""
        try:
            report = explain() if explain is not None else None  # None: torch's own ops (LayoutSite)
        except (Error, TypeError, RuntimeError) as e:  # the op (of this build) refuses the call
            why = f"the op refuses it: {e}"
        else:
            if report is not None and report.chosen is None:
                why = "no implementation takes it: " + "; ".join(
                    f"{c['name']}: {c['reason']}" for c in report.candidates)
            elif report is not None and self.exact and _contract(report.chosen) != "bit_exact":
                # the dispatcher's last resort (e.g. a close CPU reference): the model's own
                # chain is the better fallback in the bit-exact tier
                why = f"{report.chosen} would run, whose contract is {_contract(report.chosen)}, not bit_exact"
        if why:
            self.gate.mark_unfit(sig, why)
            self._fall_back(why)
            return reference()
        with self._lock:
            self.implementations[sig] = report.chosen if report is not None else self.op
        ref = reference()
        try:
            out = fused()
        except (Error, RuntimeError) as e:
            self._disable(sig, f"the op failed: {e}")
            return ref
        differing, largest = 0, 0.0
        for a, b in zip(out, ref):
            if not torch.equal(a, b):
                diff = a.double() - b.double()
                both_nan = torch.isnan(a) & torch.isnan(b)
                differ = (diff != 0) & ~both_nan  # NaN in both places is agreement
                differing += int(differ.sum())
                if bool((differ & ~torch.isfinite(diff)).any()):  # NaN or inf on one side only
                    largest = float("inf")
                elif bool(differ.any()):
                    largest = max(largest, float(diff[differ].abs().max()))
        with self._lock:
            seen = self.differences.get(sig, (0, 0.0))
            self.differences[sig] = (max(seen[0], differing), max(seen[1], largest))
        if differing and self.exact:
            total = sum(t.numel() for t in ref)
            self._disable(sig, f"{differing} of {total} elements differ from the model's chain "
                               f"(max |difference| {largest:.3g})")
            return ref
        if not self.gate.verify(sig):  # another thread's first sight of it differed
            self._count_model_call()
            return ref
        with self._lock:
            self.fused_calls += 1
        return out


# ---------------------------------------------------------------- per-head QK RMSNorm + RoPE

class RopeTable:
    """The model's rotary embedding as a qknorm_rope cache, with positions per stream.

    The model passes the same cos/sin (or complex) tensors to every block of a forward, so in
    plain eager mode the cache is built once per forward and reused (strong references: the
    tensors stay alive, so identity means the same values). Under torch.compile or CUDA-graph
    capture it is built inside the traced code, where a Python-side cache would go stale.

    One cache per thread (a forward runs in one thread): two threads' forwards with different
    rotary tensors never read each other's table, and neither evicts the other's."""

    def __init__(self):
        self._local = threading.local()   # .slot = (rotary tensors, their cache, positions by key)

    @staticmethod
    def build(freqs, layout: str) -> torch.Tensor:
        if layout == "full_width":  # (cos [S, D], sin [S, D]), one value per channel
            cos, sin = freqs
            return torch.cat([cos, sin], -1)
        if layout == "complex":  # complex64 [S, D/2]: compact cos | sin
            pairs = torch.view_as_real(freqs)
            return torch.cat([pairs[..., 0], pairs[..., 1]], -1)
        raise ValueError(f"unknown rope layout {layout!r}")

    def get(self, freqs, layout: str, start: int, tokens: int, batch: int, device, identity: int = 0,
            head_dim: int = 0):
        """(cache, positions [batch * (tokens + identity)]): each batch element's tokens at rows
        [start, start + tokens), then `identity` tokens at an appended identity row (cos 1, sin 0:
        the rotation leaves them as they are; full_width only; freqs None: that row alone)."""
        keep = not _tracing_or_capturing(device)  # neither traced nor captured
        parts = () if freqs is None else tuple(freqs) if isinstance(freqs, (tuple, list)) else (freqs,)
        slot_name = "slot_identity" if identity else "slot"
        slot = getattr(self._local, slot_name, None) if keep else None
        # the same rotary tensors (identity: the same values and device); no tensors: the device
        if slot is not None and len(parts) == len(slot[0]) and all(a is b for a, b in zip(parts, slot[0])) \
                and (parts or slot[1].device == device):
            cache, known = slot[1], slot[2]
        else:
            built = self.build_with_identity(freqs, head_dim, device) if identity else self.build(freqs, layout)
            cache, known = built, {}
            if keep:
                setattr(self._local, slot_name, (parts, cache, known))
        pos_key = (start, tokens, identity, batch, str(device))
        positions = known.get(pos_key)
        if positions is None:
            positions = torch.arange(start, start + tokens, device=device)
            if identity:
                row = cache.shape[0] - 1
                positions = torch.cat([positions, torch.full((identity,), row, device=device, dtype=positions.dtype)])
            if batch > 1:
                positions = positions.repeat(batch)
            if keep:
                known[pos_key] = positions
        return cache, positions

    @classmethod
    def build_with_identity(cls, freqs, head_dim: int, device) -> torch.Tensor:
        """The full-width cache of freqs (or none) with one identity row appended: [ones | zeros]."""
        identity = torch.cat([torch.ones(1, head_dim, device=device), torch.zeros(1, head_dim, device=device)], -1)
        if freqs is None:
            return identity
        return torch.cat([cls.build(freqs, "full_width"), identity], 0)


def rms_norm_rounding(norm) -> tuple[str | None, str]:
    """How a per-head QK norm module rounds, as qknorm_rope's norm_weight_rounding names it:
    "once" (torch.nn.RMSNorm: F.rms_norm), "twice" (diffusers' RMSNorm: the normalized value cast
    to the weight's dtype, then multiplied by the weight), or None with the reason."""
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
    if norm is None:
        return None, "no QK norm"
    if type(norm) is torch.nn.RMSNorm:
        if norm.weight is None:
            return None, "torch.nn.RMSNorm without a weight"
        if norm.eps is None:
            return None, "torch.nn.RMSNorm with eps=None (the dtype's epsilon)"
        return "once", ""
    if type(norm) is DiffusersRMSNorm:
        if norm.weight is None:
            return None, "diffusers RMSNorm without a weight"
        if norm.bias is not None:
            return None, "diffusers RMSNorm with a bias"
        return "twice", ""
    return None, f"QK norm is {type(norm).__name__}"


def norm_eps(norm) -> float:
    return float(norm.eps)


def qk_norm_rope_mapping(rounding: str, options: dict) -> Mapping:
    """Per-head RMSNorm of q and k, then RoPE, as one in-place qknorm_rope call per stream.

    The site is called as site(chain, q, k, norm_q, norm_k, freqs, layout, start, rows, identity):
    q, k [B, S, H, D] (new tensors the op may write), their norm modules, the model's rotary
    tensors (layout full_width: (cos, sin) [rows, D] float32; complex: complex64 [rows, D / 2]),
    the stream's first row in them and the number of rows the model's chain expects in them (None:
    start + S). identity: the last tokens of each batch element are normalized and not rotated (an
    identity row of the cache: HunyuanVideo's text tokens; freqs None: all of them). rounding: what
    the model's norms do ("once" / "twice"); options: the site's op options."""
    rope = RopeTable()  # the site's rotary cache, per thread
    extra = {"norm_weight_rounding": rounding} if "norm_weight_rounding" in options else {}
    if rounding == "twice":  # diffusers' RMSNorm sums squares as x.float().pow(2).mean(-1)
        extra["norm_order"] = "aten_mean"

    def fit(q, k, norm_q, norm_k, freqs, layout, start, rows_expected, identity) -> str:
        # what the views, the cache and one eps need; dtypes, weights and strides are the matcher's
        if q.dim() != 4 or k.dim() != 4:
            return "q and k must be [batch, tokens, heads, head_dim]"
        D = q.shape[-1]
        if k.shape[-1] != D or q.shape[:2] != k.shape[:2]:
            return "q and k differ in batch, tokens or head_dim"
        if norm_eps(norm_q) != norm_eps(norm_k):
            return "q and k norms have different eps"
        if not (_token_rows(q) and _token_rows(k)):
            return "q or k batch and token dims do not flatten without a copy"
        if any(t.device != q.device for t in (k, norm_q.weight, norm_k.weight)):
            return "tensors on different devices"
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return "autograd records q or k (the op writes them in place and has no backward)"
        if identity and (layout != "full_width" or not 0 < identity <= q.shape[1]):
            return "identity rows need the full-width layout and at most the tokens"
        if freqs is None:
            return "" if identity == q.shape[1] else "no rotary tensors for the rotated tokens"
        parts = tuple(freqs) if isinstance(freqs, (tuple, list)) else (freqs,)
        if layout == "full_width":
            if len(parts) != 2:
                return "the rotary embedding is not (cos, sin)"
            cos, sin = parts
            if cos.shape != sin.shape:
                return "cos/sin are not of one shape"
            if cos.dim() != 2 or cos.shape[1] != D:
                return "cos/sin are not [positions, head_dim]"
            rows = cos.shape[0]
        else:
            (f,) = parts
            if not f.is_complex() or f.dim() != 2 or f.shape[1] * 2 != D:
                return "rotary frequencies are not complex [positions, head_dim / 2]"
            rows = f.shape[0]
        if any(p.device != q.device for p in parts):
            return "rotary tensors on another device"
        # the positions the op reads are the rows the model's chain takes
        if rows != (start + q.shape[1] - identity if rows_expected is None else rows_expected):
            return "the rotary rows do not match the tokens"
        return ""

    def signature(q, k, norm_q, norm_k, freqs, layout, start, rows_expected, identity):
        wq, wk = norm_q.weight, norm_k.weight
        heads = q.shape[2] > 1 and k.shape[2] > 1
        parts = () if freqs is None else tuple(freqs) if isinstance(freqs, (tuple, list)) else (freqs,)
        return (str(q.device), q.dtype, k.dtype, q.shape[-1], q.shape[2], k.shape[2], layout, rounding,
                bool(identity), freqs is None, tuple(p.dtype for p in parts),
                (wq.dtype, tuple(wq.shape), wq.is_contiguous()), (wk.dtype, tuple(wk.shape), wk.is_contiguous()),
                q.stride(-1) == 1, k.stride(-1) == 1, not heads or q.stride(2) == k.stride(2), float(norm_q.eps))

    def call(q, k, norm_q, norm_k, freqs, layout, start, rows_expected, identity):
        B, S, Hq, D = q.shape
        cache, positions = rope.get(freqs, layout, start, S - identity, B, q.device, identity, D)
        kwargs = dict(is_neox=False, eps=norm_eps(norm_q), rope_dim=D, cache_full_width=layout == "full_width",
                      rounding="rounded", **extra)
        if layout == "complex":  # Qwen-Image's complex64 product
            kwargs["rope_product"] = "complex"
        return OpCall("qknorm_rope", (q.view(B * S, Hq, D), k.view(B * S, k.shape[2], D), norm_q.weight,
                                      norm_k.weight, cache, positions), kwargs, lambda _: (q, k))

    return Mapping(op="qknorm_rope", options=dict(options), fit=fit, signature=signature, call=call)


# ---------------------------------------------------------------- adaLN LayerNorm-modulate

def affine_free_layer_norm(norm) -> str:
    """'' when `norm` is a torch LayerNorm over the last dim without weight and bias."""
    if type(norm) is not torch.nn.LayerNorm:  # FP32LayerNorm (a subclass) upcasts: another chain
        return f"the norm is {type(norm).__name__}"
    if norm.weight is not None or norm.bias is not None:
        return "the LayerNorm has an affine weight or bias"
    if len(norm.normalized_shape) != 1:
        return "the LayerNorm normalizes more than the last dim"
    return ""


def _layernorm_modulate_fit(x, scale, shift, norm) -> str:
    # the chain's own rules (an affine-free LayerNorm over x's last dim, one dtype: a mixed one
    # promotes); shapes, dtypes and strides are the matcher's
    if x.dim() < 1:
        return "x is a scalar"
    if scale.dtype != x.dtype or shift.dtype != x.dtype:
        return f"mixed dtypes ({x.dtype}, {scale.dtype}, {shift.dtype}: the chain promotes)"
    if scale.device != x.device or shift.device != x.device:
        return "tensors on different devices"
    if tuple(norm.normalized_shape) != (x.shape[-1],):
        return "the norm's shape is not x's last dim"
    return affine_free_layer_norm(norm)


def _layernorm_modulate_signature(x, scale, shift, norm):
    rows = (x.shape[0], x.shape[-1])
    return (str(x.device), x.dtype, x.dim(), x.shape[-1], float(norm.eps),
            tuple(scale.shape) == rows, scale.stride(-1) == 1, tuple(shift.shape) == rows, shift.stride(-1) == 1)


def _rows(x):
    # A residual stream left transposed by a patch embedding: aten's layer_norm copies it to rows
    # first as well, so the values are the same.
    return x if x.stride(-1) == 1 else x.contiguous()


def layernorm_modulate_mapping() -> Mapping:
    """norm(x) * (1 + scale[:, None]) + shift[:, None] with an affine-free LayerNorm, called as
    site(chain, x, scale, shift, norm): x [B, T, D], scale and shift [B, D]."""
    return Mapping(op="layernorm_modulate", fit=_layernorm_modulate_fit, signature=_layernorm_modulate_signature,
                   call=lambda x, scale, shift, norm: OpCall("layernorm_modulate", (_rows(x), scale, shift),
                                                             dict(eps=float(norm.eps)), lambda out: out))


# ---------------------------------------------------------------- gated residual


def _transposed(x) -> bool:
    """x [B, T, D] stored as [B, D, T]: the residual_gate_add layout of a residual stream that a
    patch embedding's flatten(2).transpose(1, 2) left transposed (HunyuanVideo, SANA)."""
    return x.dim() == 3 and x.stride(1) == 1 and x.stride(2) == x.shape[1] and \
        x.stride(0) == x.shape[1] * x.shape[2]


def _residual_gate_add_fit(residual, update, gate) -> str:
    # one dtype: a mixed chain promotes (Wan's float32 gate is another chain, wan.py's mapping);
    # ranks, shapes, broadcasts and layouts are the matcher's
    if update.dtype != residual.dtype or gate.dtype != residual.dtype:
        return f"mixed dtypes ({residual.dtype}, {update.dtype}, {gate.dtype})"
    if update.device != residual.device or gate.device != residual.device:
        return "tensors on different devices"
    return ""


def _residual_gate_add_signature(residual, update, gate):
    # the layout and broadcast classes the matcher decides on
    layout = "contiguous" if residual.is_contiguous() else "transposed" if _transposed(residual) else "strided"
    return (str(residual.device), residual.dtype, residual.dim(), tuple(update.shape) == tuple(residual.shape),
            update.is_contiguous(), layout, gate.dim(),
            tuple((g == 1, g == r) for g, r in zip(gate.shape, residual.shape)))


def residual_gate_add_mapping() -> Mapping:
    """residual + update * gate, the product rounded to the dtype before the sum, called as
    site(chain, residual, update, gate)."""
    # A [B, 1, D] gate sliced from the modulation rows is strided; the op takes a dense gate, and
    # B * D elements are a negligible copy.
    return Mapping(op="residual_gate_add", fit=_residual_gate_add_fit, signature=_residual_gate_add_signature,
                   call=lambda residual, update, gate: OpCall("residual_gate_add",
                                                              (residual, update, gate.contiguous()), {},
                                                              lambda out: out))


# ---------------------------------------------------------------- cross-head QK RMSNorm + RoPE


def cross_head_norm(norm, width: int) -> str:
    """'' when `norm` is what cross_head_qknorm_rope reproduces over a projected row of `width`
    elements: torch.nn.RMSNorm(width) (F.rms_norm) with an eps, a weight or none; else the reason."""
    if type(norm) is not torch.nn.RMSNorm:
        return f"the QK norm is {type(norm).__name__}, not torch.nn.RMSNorm"
    if tuple(norm.normalized_shape) != (width,):
        return f"the QK norm's shape is {tuple(norm.normalized_shape)}, not the row ({width},)"
    if norm.eps is None:
        return "torch.nn.RMSNorm with eps=None (the dtype's epsilon)"
    return ""


def _row_layout(x, name: str) -> str:
    """'' when x [B, S, N] has 8-byte-aligned rows that do not overlap (a chunk of a fused
    projection qualifies): where PyTorch's RMSNorm runs its vectorized row kernel, whose order the
    op reproduces, and where the op's 8-byte loads apply."""
    B, S, N = x.shape
    size = x.element_size()
    if x.stride(2) != 1:
        return f"{name}'s last stride is {x.stride(2)}, not 1"
    # The pointer is not traceable; a compiled graph runs the op, which refuses a misaligned row itself.
    misaligned = not torch.compiler.is_compiling() and x.data_ptr() % 8
    if misaligned or (S > 1 and x.stride(1) * size % 8) or (B > 1 and x.stride(0) * size % 8):
        return f"{name}'s rows are not 8-byte aligned"
    span = N  # each row's extent, then each batch's, in the order of the strides
    for stride, n in sorted((x.stride(i), x.shape[i]) for i in (0, 1) if x.shape[i] > 1):
        if stride < span:
            return f"{name}'s rows overlap"
        span += stride * (n - 1)
    return ""


def _table_class(t, want):
    """What the matcher reads of one rotary table against its [1|B, S, 1|H, D/2]: None when absent."""
    if t is None:
        return None
    if t.dim() != len(want):
        return (t.dtype, t.dim())
    return (t.dtype, tuple((n == 1, n == w) for n, w in zip(t.shape, want)))


def cross_head_qk_mapping(form: str) -> Mapping:
    """RMSNorm of q and k over the whole projected row (all heads: torch.nn.RMSNorm(heads *
    head_dim), Wan's and LTX-2's rms_norm_across_heads), then RoPE per head, as one in-place
    cross_head_qknorm_rope call. Its CUDA kernel is bit_exact against that eager chain where the
    norm runs PyTorch's fused row kernel (16-bit rows, a weight in their dtype or none, 8-byte
    aligned rows, N % 4 == 0): every other call runs the model's code.

    The site is called as site(chain, q, k, norm_q, norm_k, rope, head_dim, tables, unmapped): q
    [B, S, Nq], k [B, Sk, Nk]: the projections, tensors nothing else reads (the op writes them);
    their norm modules; the RoPE form (interleaved, split, none), the width of the heads it rotates
    within, and the tables as the op reads them, (q_cos, q_sin, k_cos, k_sin) ([1|B, tokens,
    1|heads, head_dim/2] float32 views; k's None: k takes q's; all None for rope none). unmapped:
    the model module's reason this call does not map (its tables are not the op's), or ''."""

    def fit(q, k, norm_q, norm_k, rope, head_dim, tables, unmapped) -> str:
        # the chain's own rules (the norms PyTorch runs as one row kernel, one eps) and what the
        # call needs; dtypes, widths, head_dim and the tables' shapes are the matcher's
        if unmapped:
            return unmapped
        if q.dim() != 3 or k.dim() != 3:
            return "q and k must be [batch, tokens, heads * head_dim]"
        why = cross_head_norm(norm_q, q.shape[-1]) or cross_head_norm(norm_k, k.shape[-1])
        if why:
            return why
        if float(norm_q.eps) != float(norm_k.eps):
            return "q and k norms have different eps"
        for w in (norm_q.weight, norm_k.weight):
            if w is None:
                continue
            if w.dtype != q.dtype:
                # PyTorch decomposes RMSNorm with a weight of another dtype (pow, mean, rsqrt, mul)
                return f"norm weight is {w.dtype} with {q.dtype} activations (PyTorch's decomposed RMSNorm)"
            if w.device != q.device:
                return "norm weight is not on q's device"
        why = _row_layout(q, "q") or _row_layout(k, "k")
        if why:
            return why
        if k.device != q.device or any(t is not None and t.device != q.device for t in tables):
            return "q, k and the rotary tables on different devices"
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return "autograd records q or k (the op writes them in place and has no backward)"
        return ""

    def signature(q, k, norm_q, norm_k, rope, head_dim, tables, unmapped):
        (B, S, Nq), (Bk, Sk, Nk) = q.shape, k.shape
        q_cos, q_sin, k_cos, k_sin = tables
        half = head_dim // 2
        q_want, k_want = (B, S, Nq // max(head_dim, 1), half), (B, Sk, Nk // max(head_dim, 1), half)
        return (str(q.device), q.dtype, k.dtype, Nq, Nk, B == Bk, S == Sk, head_dim, rope, float(norm_q.eps),
                tuple(None if w is None else (w.dtype, w.is_contiguous()) for w in (norm_q.weight, norm_k.weight)),
                _table_class(q_cos, q_want), _table_class(q_sin, q_want),
                _table_class(k_cos, k_want), _table_class(k_sin, k_want))

    def call(q, k, norm_q, norm_k, rope, head_dim, tables, unmapped):
        return OpCall("cross_head_qknorm_rope", (q, k, norm_q.weight, norm_k.weight) + tuple(tables),
                      dict(head_dim=head_dim, eps=float(norm_q.eps), rope=rope, rounding="rounded"),
                      lambda _: (q, k))

    return Mapping(op="cross_head_qknorm_rope", options={"rope": form}, fit=fit, signature=signature, call=call)


# ---------------------------------------------------------------- a site with its op mapping beside the chain


class OpCall(NamedTuple):
    """One op call of a mapped site: ops.<op>(*args, **kwargs), and the site's output from its
    result."""
    op: str
    args: tuple
    kwargs: dict
    output: Callable


@dataclass(frozen=True)
class Mapping:
    """How a site's calls map to an op: fit(*tensors) -> '' or why a call does not fit,
    signature(*tensors) -> the first-sight key of a fitting call, call(*tensors) -> OpCall.
    op None: the model's chain runs (why says why)."""
    op: str | None = None
    why: str = ""
    options: dict = field(default_factory=dict)
    fit: Callable | None = None
    signature: Callable | None = None
    call: Callable | None = None


class MappedSite(Site):
    """A site whose op call is one small function beside the model's chain (a Mapping), so a model
    module states both side by side and switching a site to a new op changes only its mapping.
    outputs > 1: the chain and the mapping's output give that many tensors (a tuple), each
    compared at first sight (a gated residual with the next norm: the new residual and the norm)."""

    def __init__(self, name: str, *, mapping: Mapping, chain: str, note: str = "", classes=None, outputs: int = 1):
        super().__init__(name, op=mapping.op, chain=chain, why=mapping.why, options=mapping.options, note=note,
                         classes=classes)
        self.mapping = mapping
        self.outputs = outputs

    def __call__(self, chain, *tensors):
        """chain(*tensors): the model's output at this site; the op's where it runs."""
        one = self.outputs == 1

        def reference():
            out = chain(*tensors)
            return (out,) if one else tuple(out)

        if not self.active:
            out = self.run("", None, None, None, reference, None)
            return out[0] if one else out
        m = self.mapping
        why = m.fit(*tensors)
        sig = None if why else m.signature(*tensors)

        def fused():
            c = m.call(*tensors)
            out = c.output(getattr(ops, c.op)(*c.args, quality=self.quality, **c.kwargs))
            return (out,) if one else tuple(out)

        def explain():
            c = m.call(*tensors)
            return ditops.explain(c.op, *c.args, quality=self.quality, **c.kwargs)

        out = self.run(why, sig, tensors[0].device, fused, reference, explain)
        return out[0] if one else out


# ---------------------------------------------------------------- layouts of the model's own ops

class LayoutSite(Site):
    """A site where the model's own torch ops run on operands in another memory layout and no
    ditops kernel runs: e.g. the patch embedding's Conv3d on channels-last input, whose output is
    already the token rows the blocks read, where the model's channels-first output is transposed
    and copied. Whether cuDNN's engine for the other layout gives the same values is not promised,
    so the first sight of each signature compares both with torch.equal, as for an op. Serves the
    device types it names (CUDA: on the CPU the layouts choose other kernels and save nothing);
    elsewhere the model's code runs, counted, without a warning."""

    def __init__(self, name: str, *, runs: str, chain: str, note: str = "", classes=None,
                 device_types=("cuda",)):
        super().__init__(name, op=runs, chain=chain, note=note, classes=classes)
        self.device_types = tuple(device_types)

    def __call__(self, chain, layout, signature, *tensors):
        """chain(*tensors): the model's output; layout(*tensors): the same ops in the other layout;
        signature(*tensors): the first-sight key. tensors[0] is a tensor on the call's device."""
        device = tensors[0].device
        if self.active and device.type not in self.device_types:
            if not torch.compiler.is_compiling():
                self._count_model_call()
            return chain(*tensors)
        sig = signature(*tensors) if self.active else None
        return self.run("", sig, device, lambda: (layout(*tensors),), lambda: (chain(*tensors),), None)[0]


def patch_tokens_chain(x, conv):
    """The models' patch embedding: Conv3d, then [B, C, T, H, W] -> [B, T*H*W, C] as a view."""
    return conv(x).flatten(2).transpose(1, 2)


def patch_tokens_channels_last(x, conv):
    """The same convolution on channels-last-3d input: cuDNN writes [B, T, H, W, C] (its NHWC
    engine without the layout conversions around it), so the token view is already rows."""
    return conv(x.contiguous(memory_format=torch.channels_last_3d)).flatten(2).transpose(1, 2).contiguous()


def patch_embedding_site(name="conv_layout (patch embedding)"):
    return LayoutSite(
        name, runs="torch Conv3d on channels-last-3d input",
        chain="Conv3d on the model's channels-first latents, flatten(2).transpose(1, 2), copied to rows by the "
              "first norm (or .contiguous())",
        note="cuDNN's engine for either layout decides the values: the first sight compares them")


def patch_tokens(site: LayoutSite, conv, x):
    """conv's token rows [B, N, C] through site: channels-last where its first sight verified it."""
    return site(patch_tokens_chain, patch_tokens_channels_last,
                lambda x_, conv_: (str(x_.device), x_.dtype, tuple(x_.shape), x_.stride(), conv_.weight.dtype,
                                   tuple(conv_.weight.shape), conv_.bias is not None),
                x, conv)
