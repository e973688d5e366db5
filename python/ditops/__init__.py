"""ditops: fused kernels for diffusion-transformer inference, from Python.

A thin layer over the C++ core through TVM-FFI (the ABI SGLang's and FlashInfer's kernels use).
Tensors from any DLPack producer (PyTorch, numpy, CuPy, JAX) are passed without a copy; CPU
tensors run the reference backend, CUDA tensors the GPU kernels on the caller's stream (for torch
tensors the current torch stream). Errors raise ditops.Error with the C++ message.

    import ditops
    ditops.qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, is_neox=False)
    ditops.list_kernels()                         # the registry
    print(ditops.explain("qknorm_rope", q, k, q_weight, k_weight, cos_sin_cache, positions))

PyTorch custom ops (torch.compile, CUDA graphs) and the model-layer helper: ditops.torch.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

import tvm_ffi

__all__ = ["Error", "qknorm_rope", "residual_gate_add", "layernorm_modulate",
           "layernorm_modulate_fp8", "qk_head_layernorm", "norm_scale_shift", "NormScaleShiftOutputs",
           "list_kernels", "explain", "DispatchReport", "reload_config",
           "clear_failures", "__version__"]


class Error(RuntimeError, ValueError):
    """Every failure ditops reports: bad arguments (the message names the op, the tensor, the
    dimension, the expected and the actual value), no eligible implementation, CUDA/NVRTC errors.
    A RuntimeError and a ValueError, so either except clause catches it."""


# ditops::Error crosses the FFI as the error kind "DitopsError" (src/python/ffi_module.cpp).
tvm_ffi.register_error("DitopsError", Error)


def _load_module():
    # DITOPS_FFI_MODULE overrides the location (a module built elsewhere).
    path = Path(os.environ.get("DITOPS_FFI_MODULE") or Path(__file__).with_name("_ditops_ffi.so"))
    if not path.is_file():
        raise ImportError(
            f"ditops: the compiled module {path} is missing. Install the package with `pip install .`, "
            "or build it with CMake (-DDITOPS_BUILD_PYTHON=ON, needs `pip install apache-tvm-ffi`) and "
            "put <build>/python on PYTHONPATH.")
    return tvm_ffi.load_module(str(path))


_ffi = _load_module()
# Looked up once: an attribute lookup on the module per call would cost a string search.
_ffi_qknorm_rope = _ffi.qknorm_rope
_ffi_qknorm_rope_explain = _ffi.qknorm_rope_explain
_ffi_residual_gate_add = _ffi.residual_gate_add
_ffi_layernorm_modulate = _ffi.layernorm_modulate
_ffi_layernorm_modulate_fp8 = _ffi.layernorm_modulate_fp8
_ffi_qk_head_layernorm = _ffi.qk_head_layernorm
_ffi_norm_scale_shift = _ffi.norm_scale_shift

__version__ = str(_ffi.version())

try:  # numpy is optional; only its arrays carry a writeable flag to check
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover
    class _ndarray:  # noqa: N801 (never instantiated: isinstance is always false)
        pass

# The stream argument of every FFI entry: -1 takes the stream TVM-FFI set for the call (the
# current torch stream for torch CUDA tensors; the legacy default stream otherwise).
_ENV_STREAM = -1


def _stream_handle(stream) -> int:
    """A raw CUDA stream handle from an int, a torch/CuPy stream (.cuda_stream / .ptr) or an
    object with __cuda_stream__."""
    if stream is None:
        return _ENV_STREAM
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    raise TypeError(f"stream must be an int handle or a CUDA stream object, not {type(stream).__name__}")


def _check_writable(op: str, name: str, x) -> None:
    """In-place ops refuse read-only numpy arrays before anything is written (numpy would hand a
    read-only array over DLPack as writable memory otherwise)."""
    if isinstance(x, _ndarray) and not x.flags.writeable:
        raise Error(f"{op}: {name} is a read-only numpy array but the op writes to it in place "
                    "(pass a writable array, e.g. a copy)")


def _readable(x):
    """A read-only numpy array through a DLPack 1.x capsule: TVM-FFI asks numpy for a legacy DLPack
    export, which numpy refuses for read-only arrays (legacy DLPack cannot mark them); inputs
    that are only read are fine to pass."""
    if isinstance(x, _ndarray) and not x.flags.writeable:
        try:
            return tvm_ffi.from_dlpack(x.__dlpack__(max_version=(1, 0)))
        except TypeError:  # numpy < 2 (no DLPack 1.x): a copy is the only way through
            return x.copy()
    return x


def _opt(value) -> str:
    return "" if value is None else str(value)


# ---------------------------------------------------------------- ops
# Each op mirrors its C++ facade (include/ditops/<op>.h): the tensors, then the options struct's
# fields as keywords with the same names and defaults, then backend/quality (DispatchOptions) and
# stream. Returns the name of the implementation that ran.


def qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, *, is_neox=False, eps=1e-6,
                rope_dim=0, cache_full_width=False, rounding="rounded", norm_order="aten",
                use_pdl=True, backend=None, quality=None, stream=None) -> str:
    """In-place per-head QK RMSNorm + RoPE (include/ditops/qknorm_rope.h, docs/qknorm_rope.md).

    q [T, Hq, D], k [T, Hk, D] fp16/bf16 (written in place), q_weight/k_weight [D],
    cos_sin_cache [P, rope_dim] (or [P, 2*rope_dim] with cache_full_width) fp32 or the activation
    dtype, positions [T] int32/int64. rounding: "rounded" (bit_exact vs the eager chain) or
    "fp32" (close); norm_order: "aten" or "warp"; backend: kda/aot/jit/vendor/reference (strict);
    quality: lossless/high/extra-high. Returns the implementation that ran."""
    _check_writable("qknorm_rope", "q", q)
    _check_writable("qknorm_rope", "k", k)
    return str(_ffi_qknorm_rope(q, k, _readable(q_weight), _readable(k_weight),
                                _readable(cos_sin_cache), _readable(positions), is_neox, eps,
                                rope_dim, cache_full_width, rounding, norm_order, use_pdl,
                                _opt(backend), _opt(quality), _stream_handle(stream)))


def _qknorm_rope_explain(q, k, q_weight, k_weight, cos_sin_cache, positions, *, is_neox=False,
                         eps=1e-6, rope_dim=0, cache_full_width=False, rounding="rounded",
                         norm_order="aten", use_pdl=True, backend=None, quality=None):
    return _ffi_qknorm_rope_explain(q, k, q_weight, k_weight, cos_sin_cache, positions, is_neox,
                                    eps, rope_dim, cache_full_width, rounding, norm_order, use_pdl,
                                    _opt(backend), _opt(quality), _ENV_STREAM)


# ---------------------------------------------------------------- output allocation
# The C++ facades write into outputs the caller allocated. The Python functions take them as
# keywords (out=, q_out=, y=, ...) and allocate the absent ones for torch tensors and numpy
# arrays (other DLPack producers pass them explicitly).


def _torch_tensor_module(x):
    """torch when x is a torch tensor (torch is never imported here: only an already-imported
    torch can have produced one)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def _numpy_dtype(name: str):
    """The numpy storage of a torch dtype name numpy lacks natively (float8_e4m3fn): uint8 bytes,
    which the fp8 outputs accept. (ml_dtypes' float8 types are no use here: numpy's DLPack export
    refuses every dtype outside the built-in integer, float and complex kinds.)"""
    import numpy as np
    return np.dtype(np.uint8)


def _new_output(op: str, name: str, like, shape, dtype=None):
    """A new contiguous output of `shape` on like's device; dtype None: like's dtype, else a
    torch dtype name ("float8_e4m3fn", "uint8")."""
    torch = _torch_tensor_module(like)
    if torch is not None:
        return torch.empty(tuple(shape), dtype=like.dtype if dtype is None else getattr(torch, dtype),
                           device=like.device)
    if isinstance(like, _ndarray):
        import numpy as np
        if dtype is None:
            np_dtype = like.dtype
        elif hasattr(np, dtype):
            np_dtype = np.dtype(getattr(np, dtype))
        else:
            np_dtype = _numpy_dtype(dtype)
        return np.empty(tuple(shape), dtype=np_dtype)
    raise Error(f"{op}: {name} was not given and ditops allocates outputs only for torch tensors and "
                f"numpy arrays (got {type(like).__name__}); pass {name}=")


def _output(op: str, name: str, given, like, shape, dtype=None):
    """The caller's output (checked writable before anything runs) or a new one."""
    if given is not None:
        _check_writable(op, name, given)
        return given
    return _new_output(op, name, like, shape, dtype)


def _empty_like_residual(residual):
    """residual_gate_add's output: residual's shape, dtype and strides."""
    torch = _torch_tensor_module(residual)
    if torch is not None:
        return torch.empty_strided(residual.shape, residual.stride(), dtype=residual.dtype,
                                   device=residual.device)
    if isinstance(residual, _ndarray):
        import numpy as np
        # order="K" keeps a dense permuted layout (the transposed residual stream).
        return np.empty_like(residual, order="K")
    return _new_output("residual_gate_add", "out", residual, ())


def residual_gate_add(residual, update, gate, *, out=None, use_pdl=True, backend=None, quality=None,
                      stream=None):
    """out = residual + update * gate with eager rounding (include/ditops/residual_gate_add.h,
    docs/residual_gate_add.md). residual/update [..., D] f16/bf16/f32, gate full, row [1,..,D],
    token [..., 1] or batch [B, 1, .., D]. out: residual's shape and strides (allocated when None:
    torch.empty_strided with residual's strides, numpy.empty_like keeping its layout). Returns out."""
    if out is not None:
        _check_writable("residual_gate_add", "out", out)
    else:
        out = _empty_like_residual(residual)
    _ffi_residual_gate_add(_readable(residual), _readable(update), _readable(gate), out, use_pdl,
                           _opt(backend), _opt(quality), _stream_handle(stream))
    return out


def _residual_gate_add_explain(residual, update, gate, out, *, use_pdl=True, backend=None,
                               quality=None):
    return _ffi.residual_gate_add_explain(residual, update, gate, out, use_pdl, _opt(backend),
                                          _opt(quality), _ENV_STREAM)


def layernorm_modulate(x, scale, shift=None, *, out=None, eps=1e-6, mapping="automatic",
                       stats_out=None, use_pdl=True, backend=None, quality=None, stream=None):
    """F.layer_norm(x) * (1 + scale[:, None]) (+ shift[:, None]), bit-identical to the eager bf16
    chain (include/ditops/layernorm_modulate.h, docs/layernorm_modulate.md). x [B, S, D] bf16,
    scale/shift [B, D] bf16 (shift None: no add). out [B, S, D] bf16 (allocated when None; may be
    x itself). mapping: automatic/warp/cta; stats_out: optional fp32 [B, S, 2] (mean, rstd).
    Returns out."""
    op = "layernorm_modulate"
    out = _output(op, "out", out, x, x.shape)
    if stats_out is not None:
        _check_writable(op, "stats_out", stats_out)
    _ffi_layernorm_modulate(_readable(x), _readable(scale), _readable(shift), out, eps, "ieee", mapping,
                            stats_out, use_pdl, _opt(backend), _opt(quality), _stream_handle(stream))
    return out


def layernorm_modulate_fp8(x, scale, shift, input_scale, *, out=None, eps=1e-6, fp8_reciprocal="ieee",
                           mapping="automatic", stats_out=None, use_pdl=True, backend=None,
                           quality=None, stream=None):
    """layernorm_modulate, then static e4m3 quantization: e4m3(clamp(y * (1 / input_scale), ±448)).
    input_scale fp32 with one element on x's device; fp8_reciprocal: ieee (eager 1.0/scale) or
    div_full (SGLang's Triton). out [B, S, D] float8_e4m3fn (allocated when None). Returns out."""
    op = "layernorm_modulate_fp8"
    out = _output(op, "out", out, x, x.shape, "float8_e4m3fn")
    if stats_out is not None:
        _check_writable(op, "stats_out", stats_out)
    _ffi_layernorm_modulate_fp8(_readable(x), _readable(scale), _readable(shift), _readable(input_scale),
                                out, eps, fp8_reciprocal, mapping, stats_out, use_pdl, _opt(backend),
                                _opt(quality), _stream_handle(stream))
    return out


def qk_head_layernorm(q, k, *, q_out=None, k_out=None, eps=1e-6, mapping="automatic", use_pdl=True,
                      backend=None, quality=None, stream=None):
    """F.layer_norm over the head dim of q [B, S, H, Dh] and k [B, S, Hk, Dh] (bf16, no affine).
    q_out/k_out: allocated (contiguous) when None; may be q/k themselves. Returns (q_out, k_out)."""
    op = "qk_head_layernorm"
    q_out = _output(op, "q_out", q_out, q, q.shape)
    k_out = _output(op, "k_out", k_out, k, k.shape)
    _ffi_qk_head_layernorm(_readable(q), _readable(k), q_out, k_out, eps, "ieee", mapping, None, use_pdl,
                           _opt(backend), _opt(quality), _stream_handle(stream))
    return q_out, k_out


class NormScaleShiftOutputs(NamedTuple):
    """What norm_scale_shift wrote (include/ditops/norm_scale_shift.h's NormScaleShiftOutputs);
    None where not produced."""
    y: object = None
    residual_out: object = None
    fp8: object = None
    nvfp4_packed: object = None
    nvfp4_scales: object = None


def _pad128(n: int) -> int:
    return (n + 127) // 128 * 128


def _norm_scale_shift_args(x, scale, shift, residual, gate, weight, bias, input_scale, global_scale, y,
                           residual_out, fp8, nvfp4_packed, nvfp4_scales, store_y, norm, eps, numerics,
                           fp8_reciprocal, e2m1, use_pdl, backend, quality):
    """The FFI entry's arguments (without stream), absent outputs allocated, and the outputs."""
    op = "norm_scale_shift"
    if store_y is None:
        store_y = y is not None or (input_scale is None and global_scale is None)
    shape = tuple(x.shape)
    D = shape[-1] if shape else 0
    rows = 1
    for n in shape[:-1]:
        rows *= n
    y = _output(op, "y", y, x, shape) if store_y else None
    if residual is not None or residual_out is not None:
        residual_out = _output(op, "residual_out", residual_out,
                               x if residual is None else residual, shape)
    if input_scale is not None or fp8 is not None:
        fp8 = _output(op, "fp8", fp8, x, shape, "float8_e4m3fn")
    if global_scale is not None or nvfp4_packed is not None or nvfp4_scales is not None:
        nvfp4_packed = _output(op, "nvfp4_packed", nvfp4_packed, x, (rows, D // 2), "uint8")
        nvfp4_scales = _output(op, "nvfp4_scales", nvfp4_scales, x, (_pad128(rows), D // 16), "uint8")
    args = (_readable(x), _readable(residual), _readable(gate), _readable(weight), _readable(bias),
            _readable(scale), _readable(shift), _readable(input_scale), _readable(global_scale), y,
            residual_out, fp8, nvfp4_packed, nvfp4_scales, norm, eps, numerics, fp8_reciprocal, e2m1,
            use_pdl, _opt(backend), _opt(quality))
    return args, NormScaleShiftOutputs(y, residual_out, fp8, nvfp4_packed, nvfp4_scales)


def norm_scale_shift(x, scale, shift=None, *, residual=None, gate=None, weight=None, bias=None,
                     input_scale=None, global_scale=None, y=None, residual_out=None, fp8=None,
                     nvfp4_packed=None, nvfp4_scales=None, store_y=None, norm="layer", eps=1e-6,
                     numerics="eager", fp8_reciprocal="div_full", e2m1="automatic", use_pdl=True,
                     backend=None, quality=None, stream=None) -> NormScaleShiftOutputs:
    """adaLN pre-norm: v = residual + x * gate (with residual), y = norm(v) * (1 + scale) + shift,
    optionally quantized to fp8 (input_scale) and/or NVFP4 (global_scale)
    (include/ditops/norm_scale_shift.h, docs/norm_scale_shift.md). x [B, S, D]; scale, shift,
    gate broadcast operands (scalar, [D], [B, D], [B, 1, D], [1|B, S, D], [B|1, F, 1, D]);
    weight/bias [D]; norm: layer/rms; numerics: eager/sglang; e2m1: automatic/software/hardware.

    Outputs are allocated when None: y (x's shape and dtype) when store_y (default: only when no
    quantized output is requested), residual_out with residual, fp8 [B, S, D] float8_e4m3fn with
    input_scale, nvfp4_packed [B*S, D/2] and nvfp4_scales [pad128(B*S), D/16] uint8 with
    global_scale. Returns NormScaleShiftOutputs (None for what was not produced)."""
    args, outs = _norm_scale_shift_args(
        x, scale, shift, residual, gate, weight, bias, input_scale, global_scale, y, residual_out, fp8,
        nvfp4_packed, nvfp4_scales, store_y, norm, eps, numerics, fp8_reciprocal, e2m1, use_pdl,
        backend, quality)
    _ffi_norm_scale_shift(*args, _stream_handle(stream))
    return outs


# Explain entries: the op's arguments and keywords, outputs included (allocated as the op would
# when absent), without stream.
def _layernorm_modulate_explain(x, scale, shift=None, *, out=None, eps=1e-6, mapping="automatic",
                                stats_out=None, use_pdl=True, backend=None, quality=None):
    out = _output("layernorm_modulate", "out", out, x, x.shape)
    return _ffi.layernorm_modulate_explain(_readable(x), _readable(scale), _readable(shift), out, eps,
                                           "ieee", mapping, stats_out, use_pdl, _opt(backend),
                                           _opt(quality), _ENV_STREAM)


def _layernorm_modulate_fp8_explain(x, scale, shift, input_scale, *, out=None, eps=1e-6,
                                    fp8_reciprocal="ieee", mapping="automatic", stats_out=None,
                                    use_pdl=True, backend=None, quality=None):
    out = _output("layernorm_modulate_fp8", "out", out, x, x.shape, "float8_e4m3fn")
    return _ffi.layernorm_modulate_fp8_explain(_readable(x), _readable(scale), _readable(shift),
                                               _readable(input_scale), out, eps, fp8_reciprocal,
                                               mapping, stats_out, use_pdl, _opt(backend),
                                               _opt(quality), _ENV_STREAM)


def _qk_head_layernorm_explain(q, k, *, q_out=None, k_out=None, eps=1e-6, mapping="automatic",
                               use_pdl=True, backend=None, quality=None):
    q_out = _output("qk_head_layernorm", "q_out", q_out, q, q.shape)
    k_out = _output("qk_head_layernorm", "k_out", k_out, k, k.shape)
    return _ffi.qk_head_layernorm_explain(_readable(q), _readable(k), q_out, k_out, eps, "ieee", mapping,
                                          None, use_pdl, _opt(backend), _opt(quality), _ENV_STREAM)


def _residual_gate_add_explain_alloc(residual, update, gate, *, out=None, use_pdl=True, backend=None,
                                     quality=None):
    if out is None:
        out = _empty_like_residual(residual)
    return _residual_gate_add_explain(_readable(residual), _readable(update), _readable(gate), out,
                                      use_pdl=use_pdl, backend=backend, quality=quality)


def _norm_scale_shift_explain(x, scale, shift=None, *, residual=None, gate=None, weight=None,
                              bias=None, input_scale=None, global_scale=None, y=None, residual_out=None,
                              fp8=None, nvfp4_packed=None, nvfp4_scales=None, store_y=None, norm="layer",
                              eps=1e-6, numerics="eager", fp8_reciprocal="div_full", e2m1="automatic",
                              use_pdl=True, backend=None, quality=None):
    args, _ = _norm_scale_shift_args(x, scale, shift, residual, gate, weight, bias, input_scale,
                                     global_scale, y, residual_out, fp8, nvfp4_packed, nvfp4_scales,
                                     store_y, norm, eps, numerics, fp8_reciprocal, e2m1, use_pdl,
                                     backend, quality)
    return _ffi.norm_scale_shift_explain(*args, _ENV_STREAM)

# op name -> its explain entry (same arguments as the op, without stream).
_EXPLAIN = {"qknorm_rope": _qknorm_rope_explain,
            "residual_gate_add": _residual_gate_add_explain_alloc,
            "layernorm_modulate": _layernorm_modulate_explain,
            "layernorm_modulate_fp8": _layernorm_modulate_fp8_explain,
            "qk_head_layernorm": _qk_head_layernorm_explain,
            "norm_scale_shift": _norm_scale_shift_explain}

# ---------------------------------------------------------------- registry


class DispatchReport:
    """The dispatch reasoning for one call: every candidate in the order considered, with the
    reason it was chosen or refused. str() gives the table `ditops explain` prints."""

    def __init__(self, record):
        self.op = str(record["op"])
        self.device = str(record["device"])
        self.template_key = str(record["template_key"])
        self.chosen = None if record["chosen"] is None else str(record["chosen"])
        self.candidates = [
            {"name": str(c["name"]), "provenance": str(c["provenance"]), "eligible": bool(c["eligible"]),
             "chosen": bool(c["chosen"]), "reason": str(c["reason"])}
            for c in record["candidates"]]
        self.text = str(record["text"])

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"DispatchReport(op={self.op!r}, device={self.device!r}, chosen={self.chosen!r})"


def explain(op: str, *args, **options) -> DispatchReport:
    """What the dispatcher would run for this call, and why; runs nothing. Takes the op's own
    arguments: explain("qknorm_rope", q, k, q_weight, k_weight, cache, positions, is_neox=True)."""
    try:
        entry = _EXPLAIN[op]
    except KeyError:
        raise Error(f"explain: unknown op '{op}' (known: {', '.join(sorted(_EXPLAIN))})") from None
    return DispatchReport(entry(*args, **options))


def _plain(value):
    """FFI containers (Map, Array, String) as dict, list, str."""
    if isinstance(value, str) or value is None or isinstance(value, (bool, int, float)):
        return value if not isinstance(value, str) else str(value)
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value]


def list_kernels(op: str | None = None) -> list[dict]:
    """Every registered implementation (of `op`, or of all ops): op, name, provenance,
    capabilities, contract (bit_exact/close), oracle, bounds, description, unavailable ("" when
    usable on this machine, else the reason) and, for kda kernels, evidence."""
    return [_plain(r) for r in _ffi.list_kernels(op or "")]


def reload_config() -> None:
    """Re-read the DITOPS_* environment variables (read once and cached otherwise)."""
    _ffi.reload_config()


def clear_failures() -> None:
    """Forget implementations that failed to resolve or launch (skipped until cleared)."""
    _ffi.clear_failures()
