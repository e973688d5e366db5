"""ditops for PyTorch: every op as a torch.library custom op in the `ditops` namespace, and the
model-layer helper apply_qk_norm_rope with its layered gate.

Custom ops (opaque to torch.compile, fake implementations for tracing, mutated arguments
declared) run on the current torch stream, so they work under torch.compile(fullgraph=True) and
inside CUDA-graph capture and replay:

    import ditops.torch
    torch.ops.ditops.qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, is_neox=True)

The model-layer helper decides per call between the fused op and the unfused eager chain
(ditops.eager), in this order (docs/python.md):
  1. kill switch DITOPS_ENABLE_FUSED_QKNORM_ROPE (0/false/off/no/empty: off);
  2. platform, dtype, eps equality, weight dtype, layout (GQA allowed: head counts may differ);
  3. bit-exact self-check: the first call per signature runs both paths and compares them with
     torch.equal; a mismatch disables the fused path for that signature with a warning. It never
     runs while tracing or capturing a CUDA graph: an unverified signature takes the eager chain
     there;
  4. capability: the dispatcher would run a CUDA implementation for this signature.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections import namedtuple as _namedtuple

import torch

import ditops as _ditops
from . import Error, NoImplementation, _ENV_STREAM, _call, _codegen
from ._gate import Gate
from .eager import fallback_outputs, qknorm_rope_eager

_qknorm_rope_explain = _ditops._EXPLAIN["qknorm_rope"]

__all__ = ["apply_qk_norm_rope", "qk_norm_rope_gate", "fused_qknorm_rope_enabled", "reset_gates",
           "generated_source", "last_dispatch", "fallbacks", "Dispatch"]  # + every op of the table (torch.ops.ditops.<op>)

# ---------------------------------------------------------------- custom ops
# One per op of the table (ditops/op.h), derived by ditops._codegen: options are keyword-only
# arguments with the C++ names and defaults. In-place ops (qknorm_rope) mark their written
# tensors mutated (Tensor(a!)), return nothing and their fake does nothing. Ops with outputs are
# functional: the implementation allocates the outputs (the C++ facade writes into them) and
# returns them; the fake allocates the same shapes, dtypes and strides, so torch.compile plans
# memory and CUDA graphs capture the allocation. A schema returns a fixed number of tensors, so
# outputs a call does not produce are empty [0] tensors of their dtype (as aten does for outputs
# it skips) and reach the core as absent.
#
# Defined with torch.library.Library + register_fake rather than the custom_op decorator: the
# decorator's Python wrappers cost several times a plain kernel registration's host time per call
# (docs/python.md). What the decorator adds (autograd and version-counter wrappers) is not needed
# by inference ops that are never differentiated.

_LIB = torch.library.Library("ditops", "FRAGMENT")


def _define(schema: str, impl, fake) -> None:
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    torch.library.register_fake("ditops::" + name, fake, lib=_LIB)


def _new(op, name, like, shape, dtype, strided, like_name=None):
    dt = like.dtype if dtype is None else getattr(torch, dtype)
    if strided == "format":
        return _ditops._dense_in_order_of(like, shape(), dt)
    if strided:
        return torch.empty_strided(shape(), like.stride(), dtype=dt, device=like.device)
    return torch.empty(shape(), dtype=dt, device=like.device)


def _or_empty(tensor, like):
    """The output, or an empty [0] tensor of its dtype when the call does not produce it."""
    if tensor is not None:
        return tensor
    src, dtype = like
    return torch.empty((0,), dtype=src.dtype if dtype is None else getattr(torch, dtype), device=src.device)


# ---------------------------------------------------------------- eager fallback
# Where no implementation takes a valid call on its device, or every eligible one failed
# (ditops.NoImplementation), a torch op runs the op's eager chain (ditops.eager) and writes its
# result into the op's outputs, so a model keeps running where SGLang's would. Bad arguments
# still raise (a plain ditops.Error): a fallback never hides a user error. An explicit backend=
# is strict and never falls back. The decision is made inside the op's implementation, which
# torch.compile treats as opaque and CUDA graphs capture with whatever it launched (the eager
# chain's kernels after a fallback); nothing branches on tensor values.
#
# The core remembers a failed implementation per (device, op, implementation, template key)
# and skips it from then on (ditops.clear_failures() forgets); here each (device, signature)
# warns once, naming the reason.

_FALLBACK_WARNED: dict = {}  # (op, device, dtypes, options) -> the core's reason
_FALLBACK_LOCK = threading.Lock()  # one warning per signature when several threads fall back at once
_LAST_DISPATCH = threading.local()


class Dispatch(_namedtuple("Dispatch", ["op", "ran", "fallback_reason"])):
    """What the last torch op call on this thread ran: `ran` is the implementation's name
    ("qknorm_rope.aot") or "eager" (the op's eager chain), `fallback_reason` why the eager chain
    ran ("" otherwise)."""


def last_dispatch():
    """The Dispatch of the last ditops torch op called on this thread, or None. Under a CUDA
    graph, replays run what the capture recorded: the capture's call is the last one seen."""
    return getattr(_LAST_DISPATCH, "value", None)


def fallbacks() -> dict:
    """Every (op, device, dtypes, options) signature that took the eager chain, with the reason."""
    return dict(_FALLBACK_WARNED)


def _option_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _run_or_fallback(index, op, backend, args, slots) -> None:
    if backend is not None:  # an explicit backend is strict
        _LAST_DISPATCH.value = Dispatch(op, str(_call(index, False, _ENV_STREAM, *args)), "")
        return
    try:
        ran = _call(index, False, _ENV_STREAM, *args)
    except NoImplementation as e:
        tensors, options = slots()
        _eager_fallback(op, tensors, options, str(e))
        return
    _LAST_DISPATCH.value = Dispatch(op, str(ran), "")


def _eager_fallback(op, tensors, options, reason) -> None:
    given = {n: t for n, t in tensors.items() if t is not None}
    outputs = fallback_outputs(op, given, {n: _option_text(v) for n, v in options.items() if v is not None})
    if outputs is None:
        raise NoImplementation(f"{reason}\n  and {op} has no eager chain for these options "
                               f"({', '.join(f'{n}={v}' for n, v in options.items())}) to fall back to")
    device = next(iter(given.values())).device
    sig = (op, str(device), tuple((n, t.dtype) for n, t in given.items()), tuple(sorted(options.items())))
    with _FALLBACK_LOCK:
        first = sig not in _FALLBACK_WARNED
        if first:
            _FALLBACK_WARNED[sig] = reason
    if first:
        warnings.warn(f"ditops: {op} on {device} runs the eager chain: {reason}", RuntimeWarning,
                      stacklevel=5)  # the caller of torch.ops.ditops.<op>
    for name, value in outputs.items():
        dst = tensors.get(name)
        if dst is not None and dst.numel() > 0:
            dst.copy_(value)
    _LAST_DISPATCH.value = Dispatch(op, "eager", reason)


_rows = _ditops._rows
_up128 = _ditops._up128
_TORCH_SOURCE = _codegen.torch_source(_ditops._TABLE)
exec(compile(_TORCH_SOURCE, "<ditops generated torch ops>", "exec"), globals())


def generated_source() -> str:
    """The source of the torch.library implementations, fakes and schemas, as derived."""
    return _TORCH_SOURCE


# ---------------------------------------------------------------- the gate

KILL_SWITCH = "DITOPS_ENABLE_FUSED_QKNORM_ROPE"
_FALSY = ("0", "false", "off", "no", "")

# Device types the fused path serves. The CPU reference is correct but no faster than the
# eager chain and not bit-exact to CPU PyTorch, so CPU tensors take the eager chain. (Tests widen
# this to exercise the gate without a GPU.)
_FUSED_DEVICE_TYPES = ("cuda",)


def fused_qknorm_rope_enabled() -> bool:
    """The kill switch, read on every call so it can be flipped at run time."""
    return os.environ.get(KILL_SWITCH, "1").strip().lower() not in _FALSY


# The self-check's per-signature states (ditops._gate: the mechanism the diffusers sites use too).
_QKNORM_ROPE_GATE = Gate()
# signature -> "" when a CUDA implementation would run it, else the dispatcher's reason.
_QKNORM_ROPE_CAPABLE: dict = {}


def reset_gates() -> None:
    """Forget self-check results, capability answers and the eager fallbacks warned about
    (tests; after changing DITOPS_*)."""
    _QKNORM_ROPE_GATE.reset()
    _QKNORM_ROPE_CAPABLE.clear()
    _FALLBACK_WARNED.clear()


def _disable_qknorm_rope(sig, why: str) -> None:
    _QKNORM_ROPE_GATE.disable(sig, why, f"ditops: disabling the fused qknorm_rope path for {sig}: {why}; "
                              "using the eager chain", stacklevel=3)  # apply_qk_norm_rope's caller


def _tracing_or_capturing(device: torch.device) -> bool:
    if torch.compiler.is_compiling():
        return True
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _token_rows(x: torch.Tensor) -> bool:
    """Whether x [..., H, D] views as [T, H, D] without a copy (the leading dims flatten)."""
    for i in range(x.dim() - 3):
        if x.shape[i] != 1 and x.shape[i + 1] != 1 and x.stride(i) != x.stride(i + 1) * x.shape[i + 1]:
            return False
    return True


@torch.compiler.assume_constant_result
def _qknorm_rope_capability(device_index: int, dtype: torch.dtype, cache_dtype: torch.dtype,
                            pos_dtype: torch.dtype, num_q_heads: int, num_k_heads: int,
                            head_dim: int, cache_width: int, rope_dim: int, is_neox: bool,
                            cache_full_width: bool, rounding: str, norm_order: str = "aten",
                            norm_weight_rounding: str = "once") -> str:
    """"" when the dispatcher would run a CUDA implementation (not the CPU reference) for this
    signature, else why not. Asks the dispatcher on one-token tensors of the signature; runs
    nothing on the GPU. A constant for torch.compile: it depends on the signature only."""
    sig = (device_index, dtype, cache_dtype, pos_dtype, num_q_heads, num_k_heads, head_dim,
           cache_width, rope_dim, is_neox, cache_full_width, rounding, norm_order, norm_weight_rounding)
    why = _QKNORM_ROPE_CAPABLE.get(sig)
    if why is not None:
        return why
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
        q = torch.zeros(1, num_q_heads, head_dim, dtype=dtype, device=dev)
        k = torch.zeros(1, num_k_heads, head_dim, dtype=dtype, device=dev)
        w = torch.zeros(head_dim, dtype=dtype, device=dev)
        cache = torch.zeros(1, cache_width, dtype=cache_dtype, device=dev)
        pos = torch.zeros(1, dtype=pos_dtype, device=dev)
        try:
            report = _qknorm_rope_explain(q, k, w, w.clone(), cache, pos, is_neox=is_neox,
                                          rope_dim=rope_dim, cache_full_width=cache_full_width,
                                          rounding=rounding, norm_order=norm_order,
                                          norm_weight_rounding=norm_weight_rounding)
            chosen = report["chosen"]
            if chosen is None:
                why = "no eligible implementation"
            elif str(chosen).endswith(".reference"):
                why = "only the CPU reference is eligible (" + str(report["text"]).strip().replace("\n", "; ") + ")"
            else:
                why = ""
        except Error as e:
            why = str(e)
    _QKNORM_ROPE_CAPABLE[sig] = why
    return why


def qk_norm_rope_gate(q, k, q_weight, k_weight, cos_sin_cache, positions=None, *, eps, is_neox,
                      k_eps=None, rope_dim=None, cache_full_width=False, rounding="rounded",
                      norm_order="aten", norm_weight_rounding="once", allow_inplace=True) -> str:
    """The gate of apply_qk_norm_rope: "" when the fused op will run, else why the eager chain
    will. Same arguments as apply_qk_norm_rope."""
    # 1. kill switch
    if not fused_qknorm_rope_enabled():
        return f"disabled by {KILL_SWITCH}"
    if not allow_inplace:
        return "the caller does not allow in-place updates"
    # 2. platform, dtype, eps, weights, layout
    dev = q.device
    if dev.type not in _FUSED_DEVICE_TYPES:
        return f"q is on {dev.type} (the fused path serves {', '.join(_FUSED_DEVICE_TYPES)})"
    others = (k, q_weight, k_weight, cos_sin_cache) + (() if positions is None else (positions,))
    if any(t.device != dev for t in others):
        return "the tensors are not all on q's device"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype:
        return f"q/k dtypes {q.dtype}/{k.dtype} (needs both float16 or both bfloat16)"
    if k_eps is not None and k_eps != eps:
        return f"q and k norms have different eps ({eps} vs {k_eps})"
    if q_weight.dtype != q.dtype or k_weight.dtype != k.dtype:
        return f"norm weights are {q_weight.dtype}/{k_weight.dtype}, activations {q.dtype}"
    if q.dim() < 3 or k.dim() != q.dim():
        return "q and k must be [..., heads, head_dim] of one rank"
    D = q.shape[-1]
    if k.shape[-1] != D or q.shape[:-2] != k.shape[:-2]:
        return f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in tokens or head_dim"
    if q_weight.shape != (D,) or k_weight.shape != (D,) or q_weight.stride(-1) != 1 or k_weight.stride(-1) != 1:
        return "norm weights must be contiguous [head_dim]"
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        return "q and k need a unit last stride"
    Hq, Hk = q.shape[-2], k.shape[-2]
    if Hq > 1 and Hk > 1 and q.stride(-2) != k.stride(-2):
        return "q and k head strides differ"
    if not (_token_rows(q) and _token_rows(k)):
        return "q or k leading dims do not flatten into tokens without a copy"
    if cos_sin_cache.dim() != 2 or cos_sin_cache.stride(-1) != 1:
        return "cos_sin_cache must be [positions, width] with a unit last stride"
    if cos_sin_cache.dtype not in (torch.float32, q.dtype):
        return f"cos_sin_cache is {cos_sin_cache.dtype} (needs float32 or {q.dtype})"
    num_tokens = q.numel() // (Hq * D) if Hq * D else 0
    if positions is None:
        pos_dtype = torch.int64
        if cos_sin_cache.shape[0] < num_tokens:
            return "positions=None needs one cache row per token"
    else:
        pos_dtype = positions.dtype
        if pos_dtype not in (torch.int32, torch.int64) or positions.numel() != num_tokens:
            return "positions must be int32/int64 with one entry per token"
    width = cos_sin_cache.shape[1]
    rdim = rope_dim or (width // 2 if cache_full_width else width)
    # 3. self-check state (bit-exact mode only): decided before the capability so that nothing
    # is asked of the dispatcher while tracing or capturing an unverified signature.
    if rounding == "rounded":
        sig = _signature(q, k, cos_sin_cache, pos_dtype, rdim, is_neox, cache_full_width,
                         (norm_order, norm_weight_rounding))
        state = _QKNORM_ROPE_GATE.state(sig)
        if state == "disabled":
            return "disabled by the self-check: " + _QKNORM_ROPE_GATE.reasons[sig]
        if state == "unverified" and _tracing_or_capturing(dev):
            return "not yet verified (the self-check never runs while tracing or capturing)"
    # 4. capability
    why = _qknorm_rope_capability(dev.index if dev.type == "cuda" else -1, q.dtype,
                                  cos_sin_cache.dtype, pos_dtype, Hq, Hk, D, width, rdim, is_neox,
                                  cache_full_width, rounding, norm_order, norm_weight_rounding)
    if why:
        return "not capable: " + why
    return ""


def _signature(q, k, cos_sin_cache, pos_dtype, rope_dim, is_neox, cache_full_width, norm=("aten", "once")):
    """norm: (norm_order, norm_weight_rounding)."""
    return (str(q.device), q.dtype, cos_sin_cache.dtype, pos_dtype, q.shape[-1], rope_dim,
            is_neox, cache_full_width, q.shape[-2], k.shape[-2]) + ((norm,) if norm != ("aten", "once") else ())


def _norm_chain(norm_order, norm_weight_rounding) -> dict:
    """The eager chain's norm options for the fused op's: diffusers' RMSNorm (aten_mean, twice)
    and MochiRMSNorm (aten_mean, once) have chains of their own; aten and warp are F.rms_norm."""
    if norm_order == "aten_mean" or norm_weight_rounding != "once":
        return {"norm_order": norm_order, "norm_weight_rounding": norm_weight_rounding}
    return {}


# The chain the self-check compares with (a module attribute so tests can substitute it).
_self_check_reference = qknorm_rope_eager


def apply_qk_norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions=None, *, eps, is_neox,
                       k_eps=None, rope_dim=None, cache_full_width=False, rounding="rounded",
                       norm_order="aten", norm_weight_rounding="once", allow_inplace=True):
    """QK RMSNorm per head then RoPE, for attention in a DiT block. Returns (q, k).

    q [..., Hq, D], k [..., Hk, D] (GQA: Hq != Hk allowed), weights [D], cos_sin_cache
    [P, rope_dim] (rope_dim/2 cos then rope_dim/2 sin) or [P, 2*rope_dim] with cache_full_width,
    positions [T] (None: token t uses cache row t). eps: q's norm eps; k_eps: k's, when different
    (the fused op needs them equal). rope_dim None: from the cache width. norm_order and
    norm_weight_rounding: the op's options; norm_order="aten_mean" with
    norm_weight_rounding="twice" is diffusers' own RMSNorm (Qwen-Image, HunyuanVideo), the
    defaults F.rms_norm (torch.nn.RMSNorm: FLUX.1, Wan).

    The fused op writes q and k in place and returns them; the eager chain returns new tensors
    and leaves q and k as they were. Use the returned tensors. allow_inplace=False forces the
    eager chain."""
    why = qk_norm_rope_gate(q, k, q_weight, k_weight, cos_sin_cache, positions, eps=eps,
                            is_neox=is_neox, k_eps=k_eps, rope_dim=rope_dim,
                            cache_full_width=cache_full_width, rounding=rounding,
                            norm_order=norm_order, norm_weight_rounding=norm_weight_rounding,
                            allow_inplace=allow_inplace)
    width = cos_sin_cache.shape[1]
    rdim = rope_dim or (width // 2 if cache_full_width else width)
    Hq, Hk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    q3, k3 = q.reshape(-1, Hq, D), k.reshape(-1, Hk, D)  # views when the gate passed
    if positions is None:
        positions = torch.arange(q3.shape[0], device=q.device)
    if why:
        qo, ko = qknorm_rope_eager(q3, k3, q_weight, k_weight, cos_sin_cache, positions, rdim,
                                   is_neox, eps, cache_full_width, k_eps,
                                   **_norm_chain(norm_order, norm_weight_rounding))
        return qo.view(q.shape), ko.view(k.shape)

    def fused():
        qknorm_rope(q3, k3, q_weight, k_weight, cos_sin_cache, positions, is_neox=is_neox, eps=eps,
                    rope_dim=rdim, cache_full_width=cache_full_width, rounding=rounding,
                    norm_order=norm_order, norm_weight_rounding=norm_weight_rounding)

    sig = _signature(q, k, cos_sin_cache, positions.dtype, rdim, is_neox, cache_full_width,
                     (norm_order, norm_weight_rounding))
    if rounding != "rounded" or _QKNORM_ROPE_GATE.state(sig) == "verified":
        fused()
        return q, k
    # First call of this signature, eager and not capturing (the gate saw to that): compare.
    ref_q, ref_k = _self_check_reference(q3, k3, q_weight, k_weight, cos_sin_cache, positions,
                                         rdim, is_neox, eps, cache_full_width,
                                         **_norm_chain(norm_order, norm_weight_rounding))
    try:
        fused()
    except Error as e:
        _disable_qknorm_rope(sig, f"the fused call failed: {e}")
        return ref_q.view(q.shape), ref_k.view(k.shape)
    if torch.equal(q3, ref_q) and torch.equal(k3, ref_k):
        if not _QKNORM_ROPE_GATE.verify(sig):  # another thread's check of sig differed meanwhile
            q3.copy_(ref_q)
            k3.copy_(ref_k)
    else:
        differ = int((q3 != ref_q).sum()) + int((k3 != ref_k).sum())
        _disable_qknorm_rope(sig, f"{differ} of {q3.numel() + k3.numel()} elements differ "
                                  "from the eager chain")
        # Keep the in-place contract: q and k hold the eager chain's values.
        q3.copy_(ref_q)
        k3.copy_(ref_k)
    return q, k


__all__ += [op["name"] for op in _ditops._TABLE]
