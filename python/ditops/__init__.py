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

import functools
import os
import sys
from collections import namedtuple as _namedtuple
from pathlib import Path

import tvm_ffi

from . import _codegen

__all__ = ["Error", "NoImplementation", "list_kernels", "explain", "DispatchReport", "reload_config", "clear_failures",
           "op_table", "generated_source", "__version__"]  # + every op of the table (below)


class Error(RuntimeError, ValueError):
    """Every failure ditops reports: bad arguments (the message names the op, the tensor, the
    dimension, the expected and the actual value), no eligible implementation, CUDA/NVRTC errors.
    A RuntimeError and a ValueError, so either except clause catches it."""


class NoImplementation(Error):
    """No implementation takes a valid call on its device, or every eligible one failed (C++
    ditops::NoImplementation). The only error the torch ops answer with the eager chain; bad
    arguments raise a plain Error."""


# ditops::Error crosses the FFI as the error kind "DitopsError", NoImplementation as
# "DitopsNoImplementation" (src/python/ffi_module.cpp).
tvm_ffi.register_error("DitopsError", Error)
tvm_ffi.register_error("DitopsNoImplementation", NoImplementation)


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
_call = _ffi.call

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


def _dense_in_order_of(like, shape, dtype):
    """An empty torch tensor of `shape`, dense in like's dimension order (largest stride first):
    a channels-last `like` gives a channels-last result of another shape."""
    torch = _torch_tensor_module(like)
    order = sorted(range(like.dim()), key=lambda d: -like.stride(d))
    t = torch.empty([shape[d] for d in order], dtype=dtype, device=like.device)
    return t.permute([order.index(d) for d in range(like.dim())])


def _new_output(op: str, name: str, like, shape, dtype=None, strided=False, like_name="the input"):
    """A new output of shape() on like's device (like is the input named like_name); dtype None:
    like's dtype, else a torch dtype name ("float8_e4m3fn", "uint8"). strided: like's strides (a
    permuted dense layout stays permuted: the transposed residual stream); "format": dense in like's
    dimension order."""
    torch = _torch_tensor_module(like)
    if torch is not None:
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        if strided == "format":
            return _dense_in_order_of(like, shape(), dt)
        if strided:
            return torch.empty_strided(shape(), like.stride(), dtype=dt, device=like.device)
        return torch.empty(shape(), dtype=dt, device=like.device)
    if isinstance(like, _ndarray):
        import numpy as np
        if strided and strided != "format" and dtype is None:
            return np.empty_like(like, order="K")
        if dtype is None:
            np_dtype = like.dtype
        elif hasattr(np, dtype):
            np_dtype = np.dtype(getattr(np, dtype))
        else:
            np_dtype = _numpy_dtype(dtype)
        if strided == "format":
            order = sorted(range(like.ndim), key=lambda d: -like.strides[d])
            full = shape()
            return np.empty([full[d] for d in order], dtype=np_dtype).transpose(
                [order.index(d) for d in range(like.ndim)])
        return np.empty(shape(), dtype=np_dtype)
    if not hasattr(like, "__dlpack__") and not isinstance(like, tvm_ffi.Tensor):
        # not a tensor at all: the input is at fault, not the output allocated like it
        raise Error(f"{op}: {like_name} must be a tensor (a torch tensor, a numpy array or another DLPack "
                    f"producer) but is {type(like).__name__}")
    raise Error(f"{op}: {name} was not given and ditops allocates outputs only for torch tensors and "
                f"numpy arrays (got {type(like).__name__} for {like_name}); pass {name}=")


def _rows(x) -> int:
    rows = 1
    for n in tuple(x.shape)[:-1]:
        rows *= n
    return rows


def _up128(n: int) -> int:
    return (n + 127) // 128 * 128


# ---------------------------------------------------------------- ops
# Derived from the op table the C++ core exports (ditops/op.h): one function per op with its
# tensors, then the options as keywords with the C++ defaults, outputs allocated when absent,
# then backend, quality and stream; and an explain twin. The text is in generated_source().

_TABLE = _codegen.parse_table(str(_ffi.op_table()))
_SOURCE = _codegen.python_source(_TABLE)
exec(compile(_SOURCE, "<ditops generated ops>", "exec"), globals())


def generated_source() -> str:
    """The Python source of the op functions, as derived from the op table."""
    return _SOURCE


def op_table() -> list[dict]:
    """Every op's description: name, summary, doc, dims, gemm (a GEMM/GEMV: benchmarks report the
    read roof), tensors (name, role, optional, keyword,
    dtypes, shape, alloc, alloc_dtype, present, doc) and options (name, kind, default, choices,
    doc), as the C++ core declares them."""
    import copy
    return copy.deepcopy(_TABLE)


# ---------------------------------------------------------------- registry


class DispatchReport:
    """The dispatch reasoning for one call: every candidate in the order considered, with the
    reason it was chosen or refused. str() gives the table `ditops explain` prints. When nothing is
    eligible at the call's quality and some candidates were refused only for their contract,
    admitting_quality names the lowest tier that admits one and admitting_choice what it would run."""

    def __init__(self, record):
        self.op = str(record["op"])
        self.device = str(record["device"])
        self.template_key = str(record["template_key"])
        self.chosen = None if record["chosen"] is None else str(record["chosen"])
        self.quality = str(record["quality"])
        self.admitting_quality = None if record["admitting_quality"] is None else str(record["admitting_quality"])
        self.admitting_choice = str(record["admitting_choice"]) or None
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
        raise Error(f"explain: unknown op '{op}' (known: {', '.join(_EXPLAIN)})") from None
    return DispatchReport(entry(*args, **options))


def can_use(op: str, *args, **options) -> tuple[bool, str]:
    """(True, "") when an implementation takes this call, else (False, every candidate's reason).
    Runs and compiles nothing. Bad input still raises: a user error is never an answer of "no"."""
    report = explain(op, *args, **options)
    if report.chosen is not None:
        return True, ""
    return False, f"{op}: no eligible implementation on {report.device}; " + "; ".join(
        f"{c['name']}: {c['reason']}" for c in report.candidates)


def try_call(op: str, *args, **options):
    """The op's result where an implementation takes the call; None, with nothing written, where
    none is eligible or every eligible one failed (each failure warned about once). Bad input
    raises; backend= stays strict and raises as the op does."""
    fn = _OPS.get(op)
    if fn is None:
        raise Error(f"try_call: unknown op '{op}' (known: {', '.join(_OPS)})")
    if options.get("backend") is not None:
        return fn(*args, **options)
    explain_options = {k: v for k, v in options.items() if k != "stream"}
    if explain(op, *args, **explain_options).chosen is None:
        return None
    try:
        return fn(*args, **options)
    except NoImplementation:
        return None


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
    usable on this machine, else the reason) and, for kda kernels, evidence. An op that is not
    described raises, as explain does."""
    if op and op not in _OPS:
        raise Error(f"list_kernels: unknown op '{op}' (known: {', '.join(_OPS)})")
    return [_plain(r) for r in _ffi.list_kernels(op or "")]


def reload_config() -> None:
    """Re-read the DITOPS_* environment variables (read once and cached otherwise)."""
    _ffi.reload_config()


def clear_failures() -> None:
    """Forget implementations that failed to resolve or launch (skipped until cleared)."""
    _ffi.clear_failures()


for _name in _OPS:  # try_<op> and can_use_<op> beside every op function
    globals()[f"try_{_name}"] = functools.partial(try_call, _name)
    globals()[f"can_use_{_name}"] = functools.partial(can_use, _name)
__all__ += ["can_use", "try_call"] + [f"{p}_{n}" for n in _OPS for p in ("try", "can_use")]
__all__ += list(_OPS) + [_codegen.outputs_class_name(op) for op in _TABLE
                         if len(_codegen.returned_outputs(op)) > 1]
