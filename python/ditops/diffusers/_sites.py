"""The sites ditops serves in a diffusers transformer, and the per-call decision at each.

A site class (QK norm + RoPE, adaLN LayerNorm-modulate, gated residual, ...) is one `Site` per
enabled model: its static description (the op that runs there, its options, the model's chain it
must reproduce, or why the model's code runs instead), the places it serves, and its state. Each
call decides, in order:

  1. the site is active (an op is mapped and the site was selected), else the model's code;
  2. the call's tensors fit the op (dtype, shapes, strides, device), else the model's code for
     this call only (counted, one warning per reason);
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
            if torch.compiler.is_compiling() or _tracing_or_capturing(device):
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
            report = explain()
        except (Error, TypeError, RuntimeError) as e:  # the op (of this build) refuses the call
            why = f"the op refuses it: {e}"
        else:
            if report.chosen is None:
                why = "no implementation takes it: " + "; ".join(
                    f"{c['name']}: {c['reason']}" for c in report.candidates)
            elif self.exact and _contract(report.chosen) != "bit_exact":
                # the dispatcher's last resort (e.g. a close CPU reference): the model's own
                # chain is the better fallback in the bit-exact tier
                why = f"{report.chosen} would run, whose contract is {_contract(report.chosen)}, not bit_exact"
        if why:
            self.gate.mark_unfit(sig, why)
            self._fall_back(why)
            return reference()
        with self._lock:
            self.implementations[sig] = report.chosen
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
        keep = not (torch.compiler.is_compiling() or _tracing_or_capturing(device))
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


class QkNormRopeSite(Site):
    """Per-head RMSNorm of q and k, then RoPE, as one in-place qknorm_rope call per stream."""

    def __init__(self, *args, rounding: str | None = None, **kw):
        super().__init__(*args, **kw)
        self.rounding = rounding          # what the model's norm does: "once" / "twice"
        self.rope = RopeTable()

    def __call__(self, q, k, norm_q, norm_k, freqs, layout: str, start: int, reference, rows=None, identity=0):
        """q, k [B, S, H, D] (new tensors the op may write), their norm modules, the model's rotary
        tensors, the stream's first row in them and the number of rows the model's chain expects
        in them (default start + S). identity: the last tokens of each batch element are normalized
        and not rotated (an identity row of the cache: HunyuanVideo's text tokens; freqs None: all
        of them). Returns the normalized and rotated (q, k)."""
        why = self._fit(q, k, norm_q, norm_k, freqs, layout, start, rows, identity)
        B, S, Hq, D = q.shape if q.dim() == 4 else (0, 0, 0, 0)
        Hk = k.shape[2] if k.dim() == 4 else 0
        sig = None if why else (str(q.device), q.dtype, D, Hq, Hk, layout, self.rounding, bool(identity),
                                freqs is None)
        extra = {"norm_weight_rounding": self.rounding} if "norm_weight_rounding" in self.options else {}
        if self.rounding == "twice":  # diffusers' RMSNorm sums squares as x.float().pow(2).mean(-1)
            extra["norm_order"] = "aten_mean"
        if layout == "complex":  # Qwen-Image's complex64 product
            extra["rope_product"] = "complex"
        eps = None if why else norm_eps(norm_q)

        def views():
            return q.view(B * S, Hq, D), k.view(B * S, Hk, D)

        def table():
            return self.rope.get(freqs, layout, start, S - identity, B, q.device, identity, D)

        def fused():
            cache, positions = table()
            q3, k3 = views()
            ops.qknorm_rope(q3, k3, norm_q.weight, norm_k.weight, cache, positions,
                                         is_neox=False, eps=eps, rope_dim=D,
                                         cache_full_width=layout == "full_width", rounding="rounded",
                                         quality=self.quality, **extra)
            return q, k

        def explain():
            cache, positions = table()
            q3, k3 = views()
            return ditops.explain("qknorm_rope", q3, k3, norm_q.weight, norm_k.weight, cache, positions,
                                  is_neox=False, eps=eps, rope_dim=D,
                                  cache_full_width=layout == "full_width", rounding="rounded",
                                  quality=self.quality, **extra)

        return self.run(why, sig, q.device, fused, reference, explain)

    def _fit(self, q, k, norm_q, norm_k, freqs, layout, start, rows_expected, identity=0) -> str:
        if q.dim() != 4 or k.dim() != 4:
            return "q and k must be [batch, tokens, heads, head_dim]"
        if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype:
            return f"q/k are {q.dtype}/{k.dtype} (the op takes float16 or bfloat16)"
        D = q.shape[-1]
        if k.shape[-1] != D or q.shape[:2] != k.shape[:2]:
            return "q and k differ in batch, tokens or head_dim"
        wq, wk = norm_q.weight, norm_k.weight
        if wq.dtype != q.dtype or wk.dtype != q.dtype:
            return f"norm weights are {wq.dtype}/{wk.dtype}, activations {q.dtype}"
        if wq.shape != (D,) or wk.shape != (D,) or not (wq.is_contiguous() and wk.is_contiguous()):
            return "norm weights are not contiguous [head_dim]"
        if norm_eps(norm_q) != norm_eps(norm_k):
            return "q and k norms have different eps"
        if q.stride(-1) != 1 or k.stride(-1) != 1 or (q.shape[2] > 1 and k.shape[2] > 1
                                                       and q.stride(2) != k.stride(2)):
            return "q/k strides (unit last stride and one head stride needed)"
        if not (_token_rows(q) and _token_rows(k)):
            return "q or k batch and token dims do not flatten without a copy"
        if any(t.device != q.device for t in (k, wq, wk)):
            return "tensors on different devices"
        if identity and (layout != "full_width" or not 0 < identity <= q.shape[1]):
            return "identity rows need the full-width layout and at most the tokens"
        if freqs is None:
            return "" if identity == q.shape[1] else "no rotary tensors for the rotated tokens"
        parts = tuple(freqs) if isinstance(freqs, (tuple, list)) else (freqs,)
        if layout == "full_width":
            cos, sin = parts
            if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != sin.shape:
                return "cos/sin are not float32 of one shape"
            if cos.dim() != 2 or cos.shape[1] != D:
                return "cos/sin are not [positions, head_dim]"
            rows = cos.shape[0]
        else:
            (f,) = parts
            if f.dtype != torch.complex64 or f.dim() != 2 or f.shape[1] * 2 != D:
                return "rotary frequencies are not complex64 [positions, head_dim / 2]"
            rows = f.shape[0]
        if parts[0].device != q.device:
            return "rotary tensors on another device"
        if rows != (start + q.shape[1] - identity if rows_expected is None else rows_expected):
            return "the rotary rows do not match the tokens"
        return ""


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


class LayerNormModulateSite(Site):
    """norm(x) * (1 + scale[:, None]) + shift[:, None] with an affine-free LayerNorm."""

    def __call__(self, x, scale, shift, norm, reference):
        why = self._fit(x, scale, shift, norm)
        sig = None if why else (str(x.device), x.dtype, x.shape[-1], float(norm.eps))

        def rows():
            # A residual stream left transposed by a patch embedding: aten's layer_norm copies it
            # to rows first as well, so the values are the same.
            return x if x.stride(-1) == 1 else x.contiguous()

        def fused():
            return (ops.layernorm_modulate(rows(), scale, shift, eps=float(norm.eps), quality=self.quality),)

        def explain():
            return ditops.explain("layernorm_modulate", rows(), scale, shift, eps=float(norm.eps),
                                  quality=self.quality)

        return self.run(why, sig, x.device, fused, lambda: (reference(),), explain)[0]

    @staticmethod
    def _fit(x, scale, shift, norm) -> str:
        if x.dim() != 3 or x.dtype != torch.bfloat16:
            return f"x is {x.dtype} of rank {x.dim()} (the op takes bfloat16 [batch, tokens, dim])"
        B, _, D = x.shape
        for name, t in (("scale", scale), ("shift", shift)):
            if t.dtype != x.dtype or t.shape != (B, D) or t.stride(-1) != 1 or t.device != x.device:
                return f"{name} is not {x.dtype} [batch, dim] with a unit last stride on x's device"
        if tuple(norm.normalized_shape) != (D,):
            return "the norm's shape is not x's last dim"
        return affine_free_layer_norm(norm)


# ---------------------------------------------------------------- gated residual


def _transposed(x) -> bool:
    """x [B, T, D] stored as [B, D, T]: the residual_gate_add layout of a residual stream that a
    patch embedding's flatten(2).transpose(1, 2) left transposed (HunyuanVideo, SANA)."""
    return x.dim() == 3 and x.stride(1) == 1 and x.stride(2) == x.shape[1] and \
        x.stride(0) == x.shape[1] * x.shape[2]


class GatedResidualSite(Site):
    """residual + update * gate, the product rounded to the dtype before the sum."""

    def __call__(self, residual, update, gate, reference):
        why = self._fit(residual, update, gate)
        sig = None if why else (str(residual.device), residual.dtype, residual.dim(),
                                tuple(n == 1 for n in gate.shape[:-1]), not residual.is_contiguous())

        def fused():
            # A [B, 1, D] gate sliced from the modulation rows is strided; the op takes a dense
            # gate, and B * D elements are a negligible copy.
            return (ops.residual_gate_add(residual, update, gate.contiguous(),
                                                        quality=self.quality),)

        def explain():
            return ditops.explain("residual_gate_add", residual, update, gate.contiguous(),
                                  quality=self.quality)

        return self.run(why, sig, residual.device, fused, lambda: (reference(),), explain)[0]

    @staticmethod
    def _fit(residual, update, gate) -> str:
        if residual.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"residual is {residual.dtype}"
        if update.dtype != residual.dtype or gate.dtype != residual.dtype:
            return f"mixed dtypes ({residual.dtype}, {update.dtype}, {gate.dtype})"
        if update.shape != residual.shape or gate.dim() != residual.dim() or residual.dim() < 2:
            return "update or gate shape does not match residual"
        if gate.shape[-1] != residual.shape[-1] or any(
                g not in (1, r) for g, r in zip(gate.shape, residual.shape)):
            return "gate does not broadcast over residual"
        if not update.is_contiguous():
            return "update is not contiguous"
        if not (residual.is_contiguous() or _transposed(residual)):
            return "residual is neither contiguous nor [B, T, D] stored as [B, D, T]"
        if update.device != residual.device or gate.device != residual.device:
            return "tensors on different devices"
        return ""


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


class CrossHeadQkNormRopeSite(Site):
    """RMSNorm of q and k over the whole projected row (all heads: torch.nn.RMSNorm(heads *
    head_dim), Wan's and LTX-2's rms_norm_across_heads), then RoPE per head, as one in-place
    cross_head_qknorm_rope call. Its CUDA kernel is bit_exact against that eager chain where the
    norm runs PyTorch's fused row kernel (16-bit rows, a weight in their dtype or none, 8-byte
    aligned rows, N % 4 == 0): every other call runs the model's code."""

    def __call__(self, q, k, norm_q, norm_k, rope: str, head_dim: int, tables, reference, why: str = ""):
        """q [B, S, Nq], k [B, Sk, Nk]: the projections, tensors nothing else reads (the op writes
        them); their norm modules; the RoPE form (interleaved, split, none), the width of the
        heads it rotates within, and the tables as the op reads them, (q_cos, q_sin, k_cos, k_sin)
        ([1|B, tokens, 1|heads, head_dim/2] float32 views; k's None: k takes q's; all None for
        rope none). reference(): the model's (q, k). why: the model module's reason this call
        does not map (its tables are not the op's). Returns the normalized and rotated (q, k)."""
        why = why or self._fit(q, k, norm_q, norm_k, rope, head_dim, tables)
        sig = None if why else (str(q.device), q.dtype, q.shape[-1], k.shape[-1], head_dim, rope,
                                norm_q.weight is not None, norm_k.weight is not None, float(norm_q.eps))

        def arguments():
            return ((q, k, norm_q.weight, norm_k.weight) + tuple(tables),
                    dict(head_dim=head_dim, eps=float(norm_q.eps), rope=rope, rounding="rounded",
                         quality=self.quality))

        def fused():
            args, kwargs = arguments()
            ops.cross_head_qknorm_rope(*args, **kwargs)
            return q, k

        def explain():
            args, kwargs = arguments()
            return ditops.explain("cross_head_qknorm_rope", *args, **kwargs)

        return self.run(why, sig, q.device, fused, reference, explain)

    @staticmethod
    def _fit(q, k, norm_q, norm_k, rope, head_dim, tables) -> str:
        if q.dim() != 3 or k.dim() != 3:
            return "q and k must be [batch, tokens, heads * head_dim]"
        if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype:
            return f"q/k are {q.dtype}/{k.dtype} (the op takes float16 or bfloat16)"
        (B, S, Nq), (Bk, Sk, Nk) = q.shape, k.shape
        if Bk != B:
            return f"q and k differ in batch ({B}, {Bk})"
        why = cross_head_norm(norm_q, Nq) or cross_head_norm(norm_k, Nk)
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
            if not w.is_contiguous() or w.device != q.device:
                return "norm weight is not contiguous on q's device"
        if head_dim % 8 or not 8 <= head_dim <= 512 or Nq % head_dim or Nk % head_dim:
            return f"head_dim {head_dim} (a multiple of 8 up to 512 that divides {Nq} and {Nk})"
        if Nq > 8192 or Nk > 8192:
            return f"rows of {max(Nq, Nk)} elements (the op's rows stop at 8192)"
        why = _row_layout(q, "q") or _row_layout(k, "k")
        if why:
            return why
        if k.device != q.device:
            return "q and k on different devices"
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return "autograd records q or k (the op writes them in place and has no backward)"
        if rope not in ("interleaved", "split", "none"):
            return f"RoPE form {rope!r}"
        q_cos, q_sin, k_cos, k_sin = tables
        if rope == "none":
            return "" if all(t is None for t in tables) else "rotary tables given with rope none"
        if k_cos is None and (k_sin is not None or Sk != S):
            return "k takes q's rotary tables but has other tokens"
        for name, cos, sin, x in (("q", q_cos, q_sin, q), ("k", k_cos, k_sin, k)):
            if cos is None and name == "k":
                continue
            if cos is None or sin is None:
                return f"{name} has no rotary tables"
            heads = x.shape[2] // head_dim
            if cos.dtype != torch.float32 or sin.dtype != torch.float32:
                return f"{name}'s rotary tables are {cos.dtype}/{sin.dtype} (the op takes float32)"
            if cos.dim() != 4 or cos.shape != sin.shape or cos.shape[0] not in (1, B) or cos.shape[1] != x.shape[1] \
                    or cos.shape[2] not in (1, heads) or cos.shape[3] != head_dim // 2:
                return (f"{name}'s rotary tables are {tuple(cos.shape)}, not [1|{B}, {x.shape[1]}, 1|{heads}, "
                        f"{head_dim // 2}]")
            if cos.device != q.device or sin.device != q.device:
                return f"{name}'s rotary tables on another device"
        return ""


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
