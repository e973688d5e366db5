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
import warnings
import torch

from . import (Error, _ENV_STREAM, _ffi_layernorm_modulate, _ffi_layernorm_modulate_fp8,
               _ffi_norm_scale_shift, _ffi_qk_head_layernorm, _ffi_qknorm_rope,
               _ffi_residual_gate_add, _qknorm_rope_explain)
from .eager import qknorm_rope_eager

__all__ = ["qknorm_rope", "residual_gate_add", "layernorm_modulate", "layernorm_modulate_fp8",
           "qk_head_layernorm", "norm_scale_shift", "apply_qk_norm_rope", "qk_norm_rope_gate", "fused_qknorm_rope_enabled",
           "reset_gates"]

# ---------------------------------------------------------------- custom ops
# One per facade function, options as keyword-only arguments with the facade's names and
# defaults. qknorm_rope writes q and k in place: its schema marks them mutated (Tensor(a!), what
# torch.library.custom_op's mutates_args produces), it returns nothing and its fake does nothing.
# The ops with separate outputs are functional: the implementation allocates the outputs (the C++
# facade writes into them) and returns them; the fake allocates the same shapes, dtypes and
# strides, so torch.compile plans memory and CUDA graphs capture the allocation.
#
# Defined with torch.library.Library + register_fake rather than the custom_op decorator: the
# decorator's Python wrappers cost ~12 us per call against ~3 us for a plain kernel
# registration (measured on the CI CPU, torch 2.15, a no-op body), and the per-call budget of
# the whole torch call is 10 us. What the decorator adds (autograd and version-counter
# wrappers) is not needed by inference ops that are never differentiated.

_LIB = torch.library.Library("ditops", "FRAGMENT")


def _define(schema: str, impl, fake) -> None:
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    torch.library.register_fake("ditops::" + name, fake, lib=_LIB)


def _qknorm_rope_impl(q, k, q_weight, k_weight, cos_sin_cache, positions, *, is_neox=False,
                      eps=1e-6, rope_dim=0, cache_full_width=False, rounding="rounded",
                      norm_order="aten", use_pdl=True, backend=None, quality=None):
    # TVM-FFI takes the torch tensors through DLPack (no copy) and sets the current torch stream
    # of q's device as the call's stream (_ENV_STREAM).
    _ffi_qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, is_neox, eps, rope_dim,
                     cache_full_width, rounding, norm_order, use_pdl, backend or "", quality or "",
                     _ENV_STREAM)


def _qknorm_rope_fake(q, k, q_weight, k_weight, cos_sin_cache, positions, *, is_neox=False,
                      eps=1e-6, rope_dim=0, cache_full_width=False, rounding="rounded",
                      norm_order="aten", use_pdl=True, backend=None, quality=None):
    return None


_define("qknorm_rope(Tensor(a!) q, Tensor(b!) k, Tensor q_weight, Tensor k_weight, "
        "Tensor cos_sin_cache, Tensor positions, *, bool is_neox=False, float eps=1e-06, "
        "int rope_dim=0, bool cache_full_width=False, str rounding='rounded', "
        "str norm_order='aten', bool use_pdl=True, str? backend=None, str? quality=None) -> ()",
        _qknorm_rope_impl, _qknorm_rope_fake)

qknorm_rope = torch.ops.ditops.qknorm_rope


# Absent optional tensors arrive as None; the FFI entries take None for "not given".


def _residual_gate_add_out(residual):
    # residual's strides, so the transposed [B, T, H]-strided residual stream stays transposed.
    return torch.empty_strided(residual.shape, residual.stride(), dtype=residual.dtype,
                               device=residual.device)


def _residual_gate_add_impl(residual, update, gate, *, use_pdl=True, backend=None, quality=None):
    out = _residual_gate_add_out(residual)
    _ffi_residual_gate_add(residual, update, gate, out, use_pdl, backend or "", quality or "",
                           _ENV_STREAM)
    return out


def _residual_gate_add_fake(residual, update, gate, *, use_pdl=True, backend=None, quality=None):
    return _residual_gate_add_out(residual)


_define("residual_gate_add(Tensor residual, Tensor update, Tensor gate, *, bool use_pdl=True, "
        "str? backend=None, str? quality=None) -> Tensor",
        _residual_gate_add_impl, _residual_gate_add_fake)


def _layernorm_modulate_impl(x, scale, shift=None, *, eps=1e-6, mapping="automatic", use_pdl=True,
                             backend=None, quality=None):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _ffi_layernorm_modulate(x, scale, shift, out, eps, "ieee", mapping, None, use_pdl, backend or "",
                            quality or "", _ENV_STREAM)
    return out


def _layernorm_modulate_fake(x, scale, shift=None, *, eps=1e-6, mapping="automatic", use_pdl=True,
                             backend=None, quality=None):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_define("layernorm_modulate(Tensor x, Tensor scale, Tensor? shift=None, *, float eps=1e-06, "
        "str mapping='automatic', bool use_pdl=True, str? backend=None, str? quality=None) -> Tensor",
        _layernorm_modulate_impl, _layernorm_modulate_fake)


def _layernorm_modulate_fp8_impl(x, scale, shift, input_scale, *, eps=1e-6, fp8_reciprocal="ieee",
                                 mapping="automatic", use_pdl=True, backend=None, quality=None):
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    _ffi_layernorm_modulate_fp8(x, scale, shift, input_scale, out, eps, fp8_reciprocal, mapping, None,
                                use_pdl, backend or "", quality or "", _ENV_STREAM)
    return out


def _layernorm_modulate_fp8_fake(x, scale, shift, input_scale, *, eps=1e-6, fp8_reciprocal="ieee",
                                 mapping="automatic", use_pdl=True, backend=None, quality=None):
    return torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)


_define("layernorm_modulate_fp8(Tensor x, Tensor scale, Tensor? shift, Tensor input_scale, *, "
        "float eps=1e-06, str fp8_reciprocal='ieee', str mapping='automatic', bool use_pdl=True, "
        "str? backend=None, str? quality=None) -> Tensor",
        _layernorm_modulate_fp8_impl, _layernorm_modulate_fp8_fake)


def _qk_head_layernorm_impl(q, k, *, eps=1e-6, mapping="automatic", use_pdl=True, backend=None,
                            quality=None):
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _ffi_qk_head_layernorm(q, k, q_out, k_out, eps, "ieee", mapping, None, use_pdl, backend or "",
                           quality or "", _ENV_STREAM)
    return q_out, k_out


def _qk_head_layernorm_fake(q, k, *, eps=1e-6, mapping="automatic", use_pdl=True, backend=None,
                            quality=None):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device))


_define("qk_head_layernorm(Tensor q, Tensor k, *, float eps=1e-06, str mapping='automatic', "
        "bool use_pdl=True, str? backend=None, str? quality=None) -> (Tensor, Tensor)",
        _qk_head_layernorm_impl, _qk_head_layernorm_fake)


def _norm_scale_shift_outputs(x, residual, input_scale, global_scale, store_y):
    """(y, residual_out, fp8, nvfp4_packed, nvfp4_scales): a schema has a fixed number of
    returns, so the outputs a call does not produce are empty [0] tensors of their dtype (what
    aten does for outputs it skips, e.g. native_layer_norm's stats) and reach the FFI as None."""
    dev, shape = x.device, x.shape
    D = shape[-1] if x.dim() else 0
    rows = x.numel() // D if D else 0

    def new(present, size, dtype):
        return torch.empty(size if present else (0,), dtype=dtype, device=dev), present

    if store_y is None:
        store_y = input_scale is None and global_scale is None
    nvfp4 = global_scale is not None
    return (new(store_y, shape, x.dtype), new(residual is not None, shape, x.dtype),
            new(input_scale is not None, shape, torch.float8_e4m3fn),
            new(nvfp4, (rows, D // 2), torch.uint8),
            new(nvfp4, ((rows + 127) // 128 * 128, D // 16), torch.uint8))


def _norm_scale_shift_impl(x, scale, shift=None, *, residual=None, gate=None, weight=None, bias=None,
                           input_scale=None, global_scale=None, store_y=None, norm="layer", eps=1e-6,
                           numerics="eager", fp8_reciprocal="div_full", e2m1="automatic", use_pdl=True,
                           backend=None, quality=None):
    outs = _norm_scale_shift_outputs(x, residual, input_scale, global_scale, store_y)
    y, residual_out, fp8, packed, scales = (t if present else None for t, present in outs)
    _ffi_norm_scale_shift(x, residual, gate, weight, bias, scale, shift, input_scale, global_scale, y,
                          residual_out, fp8, packed, scales, norm, eps, numerics, fp8_reciprocal, e2m1,
                          use_pdl, backend or "", quality or "", _ENV_STREAM)
    return tuple(t for t, _ in outs)


def _norm_scale_shift_fake(x, scale, shift=None, *, residual=None, gate=None, weight=None, bias=None,
                           input_scale=None, global_scale=None, store_y=None, norm="layer", eps=1e-6,
                           numerics="eager", fp8_reciprocal="div_full", e2m1="automatic", use_pdl=True,
                           backend=None, quality=None):
    return tuple(t for t, _ in _norm_scale_shift_outputs(x, residual, input_scale, global_scale, store_y))


_define("norm_scale_shift(Tensor x, Tensor scale, Tensor? shift=None, *, Tensor? residual=None, "
        "Tensor? gate=None, Tensor? weight=None, Tensor? bias=None, Tensor? input_scale=None, "
        "Tensor? global_scale=None, bool? store_y=None, str norm='layer', float eps=1e-06, "
        "str numerics='eager', str fp8_reciprocal='div_full', str e2m1='automatic', "
        "bool use_pdl=True, str? backend=None, str? quality=None) "
        "-> (Tensor y, Tensor residual_out, Tensor fp8, Tensor nvfp4_packed, Tensor nvfp4_scales)",
        _norm_scale_shift_impl, _norm_scale_shift_fake)

residual_gate_add = torch.ops.ditops.residual_gate_add
layernorm_modulate = torch.ops.ditops.layernorm_modulate
layernorm_modulate_fp8 = torch.ops.ditops.layernorm_modulate_fp8
qk_head_layernorm = torch.ops.ditops.qk_head_layernorm
norm_scale_shift = torch.ops.ditops.norm_scale_shift

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


class BitExactGate:
    """Once-per-signature verification of a bit_exact fused path against its eager chain.

    A signature is the tuple of everything that selects a different kernel (dtypes, head dim,
    rope dim, pairing, cache layout, head counts, device). States: unverified -> verified (the
    outputs were torch.equal) or disabled (they were not, or the fused call failed)."""

    def __init__(self, name: str):
        self.name = name
        self.verified: set = set()
        self.disabled: dict = {}  # signature -> why

    def state(self, sig) -> str:
        if sig in self.disabled:
            return "disabled"
        return "verified" if sig in self.verified else "unverified"

    def disable(self, sig, why: str) -> None:
        self.disabled[sig] = why
        warnings.warn(f"ditops: disabling the fused {self.name} path for {sig}: {why}; "
                      "using the eager chain", RuntimeWarning, stacklevel=3)

    def reset(self) -> None:
        self.verified.clear()
        self.disabled.clear()


_QKNORM_ROPE_GATE = BitExactGate("qknorm_rope")
# signature -> "" when a CUDA implementation would run it, else the dispatcher's reason.
_QKNORM_ROPE_CAPABLE: dict = {}


def reset_gates() -> None:
    """Forget self-check results and capability answers (tests; after changing DITOPS_*)."""
    _QKNORM_ROPE_GATE.reset()
    _QKNORM_ROPE_CAPABLE.clear()


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
                            cache_full_width: bool, rounding: str) -> str:
    """"" when the dispatcher would run a CUDA implementation (not the CPU reference) for this
    signature, else why not. Asks the dispatcher on one-token tensors of the signature; runs
    nothing on the GPU. A constant for torch.compile: it depends on the signature only."""
    sig = (device_index, dtype, cache_dtype, pos_dtype, num_q_heads, num_k_heads, head_dim,
           cache_width, rope_dim, is_neox, cache_full_width, rounding)
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
                                          rounding=rounding)
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
                      allow_inplace=True) -> str:
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
        sig = _signature(q, k, cos_sin_cache, pos_dtype, rdim, is_neox, cache_full_width)
        state = _QKNORM_ROPE_GATE.state(sig)
        if state == "disabled":
            return "disabled by the self-check: " + _QKNORM_ROPE_GATE.disabled[sig]
        if state == "unverified" and _tracing_or_capturing(dev):
            return "not yet verified (the self-check never runs while tracing or capturing)"
    # 4. capability
    why = _qknorm_rope_capability(dev.index if dev.type == "cuda" else -1, q.dtype,
                                  cos_sin_cache.dtype, pos_dtype, Hq, Hk, D, width, rdim, is_neox,
                                  cache_full_width, rounding)
    if why:
        return "not capable: " + why
    return ""


def _signature(q, k, cos_sin_cache, pos_dtype, rope_dim, is_neox, cache_full_width):
    return (str(q.device), q.dtype, cos_sin_cache.dtype, pos_dtype, q.shape[-1], rope_dim,
            is_neox, cache_full_width, q.shape[-2], k.shape[-2])


# The chain the self-check compares with (a module attribute so tests can substitute it).
_self_check_reference = qknorm_rope_eager


def apply_qk_norm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions=None, *, eps, is_neox,
                       k_eps=None, rope_dim=None, cache_full_width=False, rounding="rounded",
                       norm_order="aten", allow_inplace=True):
    """QK RMSNorm per head then RoPE, for attention in a DiT block. Returns (q, k).

    q [..., Hq, D], k [..., Hk, D] (GQA: Hq != Hk allowed), weights [D], cos_sin_cache
    [P, rope_dim] (rope_dim/2 cos then rope_dim/2 sin) or [P, 2*rope_dim] with cache_full_width,
    positions [T] (None: token t uses cache row t). eps: q's norm eps; k_eps: k's, when different
    (the fused op needs them equal). rope_dim None: from the cache width.

    The fused op writes q and k in place and returns them; the eager chain returns new tensors
    and leaves q and k as they were. Use the returned tensors. allow_inplace=False forces the
    eager chain."""
    why = qk_norm_rope_gate(q, k, q_weight, k_weight, cos_sin_cache, positions, eps=eps,
                            is_neox=is_neox, k_eps=k_eps, rope_dim=rope_dim,
                            cache_full_width=cache_full_width, rounding=rounding,
                            allow_inplace=allow_inplace)
    width = cos_sin_cache.shape[1]
    rdim = rope_dim or (width // 2 if cache_full_width else width)
    Hq, Hk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    q3, k3 = q.reshape(-1, Hq, D), k.reshape(-1, Hk, D)  # views when the gate passed
    if positions is None:
        positions = torch.arange(q3.shape[0], device=q.device)
    if why:
        qo, ko = qknorm_rope_eager(q3, k3, q_weight, k_weight, cos_sin_cache, positions, rdim,
                                   is_neox, eps, cache_full_width, k_eps)
        return qo.view(q.shape), ko.view(k.shape)

    def fused():
        qknorm_rope(q3, k3, q_weight, k_weight, cos_sin_cache, positions, is_neox=is_neox, eps=eps,
                    rope_dim=rdim, cache_full_width=cache_full_width, rounding=rounding,
                    norm_order=norm_order)

    sig = _signature(q, k, cos_sin_cache, positions.dtype, rdim, is_neox, cache_full_width)
    if rounding != "rounded" or _QKNORM_ROPE_GATE.state(sig) == "verified":
        fused()
        return q, k
    # First call of this signature, eager and not capturing (the gate saw to that): compare.
    ref_q, ref_k = _self_check_reference(q3, k3, q_weight, k_weight, cos_sin_cache, positions,
                                         rdim, is_neox, eps, cache_full_width)
    try:
        fused()
    except Error as e:
        _QKNORM_ROPE_GATE.disable(sig, f"the fused call failed: {e}")
        return ref_q.view(q.shape), ref_k.view(k.shape)
    if torch.equal(q3, ref_q) and torch.equal(k3, ref_k):
        _QKNORM_ROPE_GATE.verified.add(sig)
    else:
        differ = int((q3 != ref_q).sum()) + int((k3 != ref_k).sum())
        _QKNORM_ROPE_GATE.disable(sig, f"{differ} of {q3.numel() + k3.numel()} elements differ "
                                       "from the eager chain")
        # Keep the in-place contract: q and k hold the eager chain's values.
        q3.copy_(ref_q)
        k3.copy_(ref_k)
    return q, k
