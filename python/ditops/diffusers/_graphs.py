"""One-call CUDA-graph capture of a diffusers transformer's forward (issue 36).

capture(model) (or enable(model, cuda_graph=True)) puts a dispatcher in the model's forward, an
instance attribute, so release/disable restores the class's forward (enable's block forwards are
diffusers hooks, _patching.py: a block with any other hook is refused). Per input signature it runs:

  first call   the model's forward, eagerly: ditops's first-sight checks run here;
  second call  the forward once more on a side stream (the warm-up: that stream's cuBLAS
               workspace, lazily loaded kernels), then captured into a CUDA graph in the
               model's one memory pool, then replayed for this call;
  later calls  one copy_ per input tensor into the graph's static input, the replay, and clones
               of the static outputs (a caller may keep an output while the next call replays).

The signature is everything a captured graph bakes in: each tensor's shape, strides, dtype,
device and address alignment, every non-tensor argument's value (return_dict, the attention
kwargs, Qwen-Image's img_shapes), inference mode and autocast. Whatever cannot be captured runs
the model's forward eagerly with one RuntimeWarning per reason (docs/diffusers.md lists them);
a failed capture leaves no graph behind (its warning names the error and where in the model's
code it was raised) and the model goes regional: its repeated blocks (_repeated_blocks) are
captured instead, each a CapturedForward of its own sharing the model's lock, pool and stream
(_Group), the forward eager around their replays; without repeated blocks that signature runs
eagerly from then on.

Tensors a forward builds from host values (LTX-2's RoPE coordinates when the call passes none:
a host-to-device copy a capture cannot hold) are built once per signature before its capture,
by the model module's graph_constants(), and passed to the captured forward: the graph reads
them where they lie (they live as long as the graph; they are never copied at a replay). A
call whose forward reads device values on the host (LTX-2's spatio-temporal guidance with a
perturbation_mask on the GPU) is refused before a capture is tried, by graph_refusal().

Several threads may call one captured model. A model's graphs share their static inputs and
outputs and one memory pool, so a model's replays are serialized: a lock is held around the
copy-in, the replay and the copy-out (they only enqueue work, so the lock is held for the host's
part of a call, not for the GPU's), and a caller on another CUDA stream than the previous replay
first waits for that stream (an event, only when the stream changes). First calls and eager
calls run outside the lock. Captures are serialized process-wide (they share one side stream
per device).

The capture backend is a module attribute (tests substitute one that "captures" a Python
closure, so the signature and fallback logic runs on the CPU).
"""
from __future__ import annotations

import enum
import functools
import importlib
import itertools
import os
import threading
import traceback
import warnings
from collections import Counter

import torch
import torch.utils._pytree as pytree
from torch._dynamo.comptime import comptime
from torch.nn.modules import module as _nn_module

from ._patching import only_ditops_hooks


__all__ = ["capture", "release", "captured", "CapturedForward", "CaptureReport"]

DEFAULT_MAX_GRAPHS = 8

# Keys that differ only in Python numbers, per tensor layout, before the numbers count as
# changing with every call: a few legitimate values (Qwen-Image's img_shapes of one token count:
# portrait and landscape) each get their graph, a float timestep does not get one per step.
VALUES_PER_LAYOUT = 4


# ---------------------------------------------------------------- the signature

_Tensor = torch.Tensor
_NUMBERS = (int, float)
_SCALARS = frozenset((bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
                      torch.layout, torch.memory_format))


class _Opaque(Exception):
    """An argument the signature cannot hold (a tensor subclass, an object with state)."""


def _walk(value, key, tensors, paths, path):
    """Appends value's signature entries to key (paths, when not None, gets each entry's
    argument path) and its tensors, in traversal order, to tensors."""
    kind = type(value)
    if kind is _Tensor or kind is torch.nn.Parameter:
        tensors.append(value)
        key.append((value.shape, value.stride(), value.dtype, value.device, value.data_ptr() & 15))
    elif kind in _SCALARS or isinstance(value, enum.Enum):
        key.append((kind, value))  # the type too: 1, 1.0 and True are equal keys otherwise
    elif kind is tuple or kind is list:
        key.append((kind, len(value)))
        if paths is not None:
            paths.append(path)
        for i, item in enumerate(value):
            _walk(item, key, tensors, paths, f"{path}[{i}]" if paths is not None else None)
        return
    elif kind is dict:
        key.append((dict, tuple(value)))
        if paths is not None:
            paths.append(path)
        for name, item in value.items():
            _walk(item, key, tensors, paths, f"{path}[{name!r}]" if paths is not None else None)
        return
    else:
        what = "a tensor subclass" if isinstance(value, torch.Tensor) else "an object whose state the graph cannot see"
        raise _Opaque(f"argument {path or '?'} is of type {kind.__qualname__} ({what})")
    if paths is not None:
        paths.append(path)


def _mode() -> tuple:
    autocast = torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda")
    return (torch.is_inference_mode_enabled(), autocast)


def signature(args, kwargs, paths=None):
    """(key, tensors): the hashable signature of a forward call and its tensors in traversal
    order. paths (a list) receives the argument path of each key entry. Raises _Opaque."""
    key, tensors = [_mode()], []
    if paths is not None:
        paths.append("(mode)")
    for i, value in enumerate(args):
        _walk(value, key, tensors, paths, f"args[{i}]" if paths is not None else None)
    for name, value in kwargs.items():
        key.append(name)
        if paths is not None:
            paths.append(name)
        _walk(value, key, tensors, paths, name)
    return tuple(key), tensors


def _skeleton(key) -> tuple:
    """The key with the values of Python numbers left out: two keys with one skeleton differ
    only in a number's value."""
    return tuple(entry[0] if type(entry) is tuple and len(entry) == 2 and entry[0] in _NUMBERS else entry
                 for entry in key)


def _substitute(value, statics):
    """value with each tensor replaced by the next of statics (an iterator), containers rebuilt."""
    kind = type(value)
    if kind is _Tensor or kind is torch.nn.Parameter:
        return next(statics)
    if kind is tuple or kind is list:
        return kind(_substitute(item, statics) for item in value)
    if kind is dict:
        return {name: _substitute(item, statics) for name, item in value.items()}
    return value


def _non_overlapping(shape, stride) -> bool:
    """No two indices share an element: with the dims in order of stride, each stride reaches past
    the extent of the dims before it (slices with gaps pass; aten's overlap check calls them too
    hard)."""
    extent = 1
    for n, st in sorted(((n, st) for n, st in zip(shape, stride) if n > 1), key=lambda d: d[1]):
        if st < extent:
            return False
        extent = st * (n - 1) + extent
    return True


class _StaticInput:
    """A graph's input buffer for one argument: its view has the argument's shape, strides and
    address alignment (kernels may choose by alignment, e.g. cuBLAS: the replay must run what the
    eager call ran); dims of stride 0 (expand) are stored once, as the argument stores them."""

    def __init__(self, t: torch.Tensor, path: str):
        shape, stride = tuple(t.shape), t.stride()
        compact = [1 if st == 0 else n for n, st in zip(shape, stride)]
        extent = 0 if t.numel() == 0 else 1 + sum((n - 1) * st for n, st in zip(compact, stride))
        offset = (t.data_ptr() & 15) // t.element_size()
        flat = torch.empty(extent + offset, dtype=t.dtype, device=t.device)
        if not _non_overlapping(compact, stride):
            raise _Opaque(f"argument {path} has overlapping strides {stride} (a copy into it is undefined)")
        self.base = flat.as_strided(compact, stride, offset)
        self.view = flat.as_strided(shape, stride, offset)
        self.narrow = tuple(d for d, (n, st) in enumerate(zip(shape, stride)) if st == 0 and n > 1)
        self.copy = self.base.copy_ if not self.narrow else self._copy_narrowed

    def _copy_narrowed(self, src):
        for d in self.narrow:
            src = src.narrow(d, 0, 1)
        self.base.copy_(src)


def _output_rebuilder(out):
    """(static output tensors, a function returning the output structure with clones)."""
    leaves, spec = pytree.tree_flatten(out)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if type(out) is tuple and len(leaves) == len(out) and len(tensors) == len(leaves):
        return tensors, lambda: tuple([t.clone() for t in tensors])
    return tensors, lambda: pytree.tree_unflatten(
        [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


# ---------------------------------------------------------------- backends


# Held by capture/release/enable/disable while they install or restore (a model enabled or
# captured twice at once otherwise). Order: INSTALL_LOCK, then a model's lock (never the reverse).
INSTALL_LOCK = threading.RLock()

# Held by every capture (any model, any thread): they share the side stream of their device, and a
# capture happens once per signature, so serializing them costs nothing at steady state.
_CAPTURE_LOCK = threading.RLock()


class CudaGraphs:
    """torch.cuda.CUDAGraph on a side stream per device, in the pool the caller gives."""

    _streams: dict = {}

    def refuses(self, device: torch.device) -> str:
        if device.type != "cuda":
            return f"the model is on {device}; CUDA graphs capture CUDA work only"
        return ""

    def capturing(self) -> bool:
        return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()

    def new_pool(self, device):
        return torch.cuda.graph_pool_handle()

    def stream_token(self, device):
        """A cheap identity of the caller's current stream (its raw handle)."""
        return torch._C._cuda_getCurrentRawStream(_index(device))

    def follow(self, device, previous):
        """The caller's current stream, made to wait for everything enqueued so far on previous
        (the stream of the model's last replay; None: nothing to wait for). No host sync."""
        current = torch.cuda.current_stream(device)
        if previous is not None:
            current.wait_stream(previous)
        return current

    def _stream(self, device):
        stream = self._streams.get(device.index)
        if stream is None:
            stream = self._streams[device.index] = torch.cuda.Stream(device)
        return stream

    def capture(self, fn, pool, device):
        """(graph, outputs): fn run once as the warm-up, then captured into pool. On any failure
        the stream capture is ended, the pool and the CUDA generator are left usable, and the
        exception propagates. One capture at a time in the process (_CAPTURE_LOCK)."""
        with _CAPTURE_LOCK:
            return self._capture_locked(fn, pool, device)

    def _capture_locked(self, fn, pool, device):
        stream, current = self._stream(device), torch.cuda.current_stream(device)
        with torch.cuda.device(device):
            stream.wait_stream(current)
            try:
                with torch.cuda.stream(stream):
                    fn()  # the warm-up: this stream's cuBLAS workspace and first launches, outside the pool
                torch.cuda.synchronize(device)  # as torch.cuda.graph does: nothing in flight at capture_begin
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.stream(stream):
                    # thread_local: other threads' CUDA calls stay legal while this thread captures
                    graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                    try:
                        out = fn()
                    except BaseException:
                        self._abandon(graph, pool, device, stream, forward_failed=True)
                        raise
                    try:
                        graph.capture_end()
                    except BaseException:
                        self._abandon(graph, pool, device, stream, forward_failed=False)
                        raise
            finally:
                current.wait_stream(stream)
        return graph, out

    @staticmethod
    def _abandon(graph, pool, device, stream, forward_failed):
        """Cleans up a failed capture. When cudaStreamEndCapture fails (an invalidated capture: a
        sync or an illegal call inside), torch's capture_end stops before its bookkeeping: the pool
        stays marked as capturing and keeps the capture's use count (it would never be freed), and
        the default CUDA generator stays in capture mode (its next eager use raises 'Offset
        increment outside graph capture')."""
        if forward_failed:
            try:
                graph.capture_end()  # a Python error that left the capture valid ends cleanly here
                graph.reset()
                return
            except RuntimeError:
                pass
        never_ended = False
        try:
            torch._C._cuda_endAllocateToPool(device.index, pool)
            never_ended = True  # capture_end stopped before this; else it raises 'not recording'
        except RuntimeError:
            pass
        try:
            graph.reset()
        except RuntimeError:
            pass
        if never_ended:
            try:
                torch._C._cuda_releasePool(device.index, pool)  # what reset does for an ended capture
            except RuntimeError:
                pass
        # a clean capture of one trivial kernel runs the generator's capture prologue and epilogue
        scratch = torch.zeros(1, device=device)
        clean = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            clean.capture_begin()
            scratch.add_(1)
            clean.capture_end()
        clean.reset()


BACKEND = CudaGraphs()


def _index(device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


# ---------------------------------------------------------------- per model


_SEEN, _GRAPH, _REFUSED = "seen once", "captured", "eager"


def _py_ptrs_equal(tensors, ptrs, indices) -> bool:
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


# True when tensors[i].data_ptr() == ptrs[i] for each index: in C++ where torch has it (its
# cudagraph trees check their static inputs with it), as the replay path runs it every call.
_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", _py_ptrs_equal)


def _is_tensor_entry(entry) -> bool:
    return type(entry) is tuple and len(entry) == 5 and isinstance(entry[3], torch.device)


class _Entry:
    """One signature: seen once (its first, eager call ran), captured, or refused (eager).
    constants: the tensors the graph reads that are no argument (graph_constants)."""
    __slots__ = ("state", "why", "graph", "inputs", "outputs", "rebuild", "calls", "label", "constants")

    def __init__(self, label: str):
        self.state, self.why, self.label = _SEEN, "", label
        self.graph = self.inputs = self.outputs = self.rebuild = self.constants = None
        self.calls = 1

    def replay(self, tensors):
        for static, src in zip(self.inputs, tensors):
            static.copy(src)
        self.graph.replay()
        return self.rebuild()

    def drop(self):
        self.graph = self.inputs = self.outputs = self.rebuild = self.constants = None


_TRACED = ("the forward is being traced by torch.compile: the traced code is the model's forward and "
           "ditops's graphs are not used (compile the model without capture, or capture it without compile)")
_traced_warned = []


def _warn_traced(ctx=None):
    """Runs at trace time (torch._dynamo.comptime): a warning inside fullgraph tracing would break it."""
    if not _traced_warned:
        _traced_warned.append(True)
        warnings.warn("ditops.diffusers.capture: " + _TRACED, RuntimeWarning, stacklevel=2)


def _describe_forward(module) -> str:
    from ._patching import foreign_hooks
    registry = getattr(module, "_diffusers_hook", None)
    if registry is not None and getattr(registry, "hooks", None):
        names = foreign_hooks(module)
        if names:
            return (f"diffusers hooks ({', '.join(names)}): a hook may change what the forward runs from call "
                    "to call (a cache skips blocks, an offload moves weights), which a graph would bake in")
        return "diffusers hooks"
    if hasattr(module, "_hf_hook"):
        return f"accelerate's {type(module._hf_hook).__name__}"
    return "an instance attribute ditops did not set"


def _model_hooks(model) -> tuple:
    """(graph_refusal, graph_constants) of the model's module, each None where it has none:
    graph_refusal(model, args, kwargs) -> why a call's forward cannot be captured (a host read of
    device values) or ''; graph_constants(model, args, kwargs) -> (args, kwargs, kept): the call
    with the tensors its forward would build from host values built now (kept: those tensors)."""
    from . import SUPPORTED_MODELS
    name = SUPPORTED_MODELS.get(type(model).__name__)
    if name is None:
        return None, None
    module = importlib.import_module(f"{__package__}.{name}")
    if type(model).__module__ != getattr(module, "DIFFUSERS_MODULE", None):
        return None, None
    return getattr(module, "graph_refusal", None), getattr(module, "graph_constants", None)


# The marker _slow returns for "run the model's forward eagerly, outside the lock".
_RUN_EAGER = object()

_REGIONAL = "regional"  # the whole forward's capture failed: its repeated blocks are captured instead


class _Group:
    """What a model's whole-forward capture and its regions (the repeated blocks' captures) share:
    one lock (their graphs share one memory pool, so their replays are serialized), the pool, and
    the stream of the last replay."""
    __slots__ = ("lock", "pool", "stream", "stream_token")

    def __init__(self):
        self.lock = threading.RLock()
        self.pool = self.stream = self.stream_token = None


def _group_attribute(name):
    return property(lambda self: getattr(self._group, name), lambda self, v: setattr(self._group, name, v))


class CapturedForward:
    """The captured forward of one model: its signatures, graphs and counters (live).

    It is reachable from the forward it installs (model.forward._ditops_capture), not from a
    global table, which would keep every captured model alive: the model and its capture form
    one cycle, which the garbage collector frees with the model.

    Safe to call from several threads: _lock guards the signatures, the counters, the captures
    and each replay's copy-in, replay and copy-out (module docstring)."""

    # Shared with the regions (_Group): a region's replay waits for the model's last one.
    _lock = _group_attribute("lock")
    pool = _group_attribute("pool")
    _stream = _group_attribute("stream")   # the stream of the last replay (backend.follow)
    _stream_token = _group_attribute("stream_token")

    def __init__(self, model, name: str, max_graphs: int, backend, group: _Group | None = None, original=None):
        self.model = model
        self.name = name or type(model).__name__
        self.max_graphs = int(max_graphs)
        self.backend = backend
        # A region's or a model's original is its forward as it is (enable's diffusers hook, if any).
        self.original = original or type(model).forward.__get__(model, type(model))
        self._previous = model.__dict__.get("forward")  # what uninstall puts back
        self._graph_refusal, self._graph_constants = _model_hooks(model)
        self.released = False
        self._group = group or _Group()
        self.entries: dict = {}
        self.regions: list = []              # the repeated blocks' captures, once the whole one failed
        self._parent = None                  # a region's model capture (its warnings go there, once)
        self.regional_calls = 0
        self.refusals: Counter = Counter()   # reason -> eager calls
        self.eager_calls = 0                 # first calls of a signature
        self.captures = 0
        self.replays = 0
        self._device = None
        self._warned: set = set()
        self._skeletons: dict = {}           # skeleton -> the keys seen with it
        self._volatile: dict = {}            # skeleton -> why its Python numbers steer the forward
        self._weights: list = []             # parameters and buffers the graphs read, and where
        self._weight_ptrs: list = []
        self._weight_idx: list = []

        @functools.wraps(self.original)  # inspect.signature(model.forward) stays the model's
        def forward(*args, **kwargs):
            return forward._ditops_capture.call(args, kwargs)

        forward._ditops_capture = self
        self.installed = forward

    # ------------------------------------------------------------ install / release
    def install(self):
        self.model.forward = self.installed

    def lift(self):
        """Takes the capture off the model (its forward is what it was before the capture) while
        enable or disable changes the model's code underneath; reseat puts it back."""
        if self.model.__dict__.get("forward") is self.installed:
            if self._previous is None:
                del self.model.forward
            else:
                self.model.forward = self._previous

    def reseat(self):
        """The capture back on the model, over its forward as it is now: the class's, or ditops's
        hook where enable patched the model's own forward (e.g. Wan's norm_out)."""
        own = self.model.__dict__.get("forward")
        self.original = own if own is not None else type(self.model).forward.__get__(self.model, type(self.model))
        self._previous = own
        self.install()

    def uninstall(self) -> str:
        with self._lock:
            self.released = True  # a caller still holding the installed forward runs the model's
            self.drop_graphs()
        whys = self.drop_regions()
        if self.model.__dict__.get("forward") is not self.installed:
            return "; ".join(whys + [f"{self.name}.forward was replaced after capture; left as it is"])
        if self._previous is None:
            del self.model.forward
        else:
            self.model.forward = self._previous
        return "; ".join(whys)

    def drop_regions(self) -> list:
        """Puts the blocks' forwards back where regions replaced them; the reasons of any left."""
        with self._lock:
            regions, self.regions = self.regions, []
        return [why for why in (r.uninstall() for r in regions) if why]

    def _go_regional(self) -> str:
        """After a failed whole-forward capture: a capture of each repeated block (the model's
        _repeated_blocks classes, as diffusers' compile_repeated_blocks), in the model's pool; the
        forward then runs eagerly around their replays. The lock held. '' or why not."""
        if self.regions:
            return ""
        classes = set(getattr(self.model, "_repeated_blocks", None) or ())
        blocks = [(n, m) for n, m in self.model.named_modules() if type(m).__name__ in classes and m is not self.model]
        if not blocks:
            return f"{type(self.model).__name__} names no repeated blocks (_repeated_blocks)"
        for name, block in blocks:
            own = block.__dict__.get("forward")
            if own is not None and not only_ditops_hooks(block):
                return f"{name}.forward is replaced by {_describe_forward(block)}"
        for name, block in blocks:
            region = CapturedForward(block, f"{self.name}.{name}", self.max_graphs, self.backend, self._group,
                                     original=block.forward)
            region._parent = self
            region.install()
            self.regions.append(region)
        return ""

    def drop_graphs(self):
        """Frees every graph, its static tensors and (with the last graph) the pool; forgets
        every signature. Waits for a replay another thread is making."""
        with self._lock:
            if self._device is not None and self._device.type == "cuda" and self.graphs:
                torch.cuda.synchronize(self._device)  # no replay in flight while its graph is destroyed
            for entry in self.entries.values():
                entry.drop()
            for region in self.regions:
                region.drop_graphs()
            self.entries.clear()
            self._skeletons.clear()
            self._volatile.clear()
            self.pool = None
            self._stream = self._stream_token = None
            self._weights, self._weight_ptrs, self._weight_idx = [], [], []

    # ------------------------------------------------------------ the call
    def call(self, args, kwargs):
        if torch.compiler.is_compiling():
            comptime(_warn_traced)
            return self.original(*args, **kwargs)
        if self.released:
            return self.original(*args, **kwargs)
        if torch.jit.is_tracing():
            return self._eager(args, kwargs, "the forward is being traced by torch.jit")
        if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks:
            return self._eager(args, kwargs, "global module forward hooks are registered (they would run "
                                             "at capture only, not at each replay)")
        if torch.is_grad_enabled():
            return self._eager(args, kwargs, "autograd is recording (call the model under torch.no_grad() "
                                             "or torch.inference_mode(), as the pipelines do)")
        if self.backend.capturing():
            return self._eager(args, kwargs, "the call is inside a CUDA-graph capture ditops does not own "
                                             "(the forward is recorded into that capture as eager code)")
        try:
            key, tensors = signature(args, kwargs)
        except _Opaque:
            return self._eager(args, kwargs, _opaque_why(args, kwargs))
        with self._lock:
            entry = self.entries.get(key)
            if entry is not None and entry.graph is not None and _ptrs_equal(
                    self._weights, self._weight_ptrs, self._weight_idx):
                self.replays += 1
                entry.calls += 1
                return self._replay(entry, tensors)
            if entry is not None and entry.state == _REGIONAL:
                entry.calls += 1
                self.regional_calls += 1
                out = _RUN_EAGER
            else:
                out = self._slow(key, args, kwargs, tensors)
        if out is _RUN_EAGER:
            return self.original(*args, **kwargs)
        return out

    def _replay(self, entry, tensors):
        """entry's replay on the caller's stream, after the model's last replay (the lock held)."""
        token = self.backend.stream_token(self._device)
        if token != self._stream_token:
            self._stream = self.backend.follow(self._device, self._stream)
            self._stream_token = token
        return entry.replay(tensors)

    def _warn(self, why: str):
        self._warn_once(why + "; the forward runs eagerly")

    def _warn_once(self, why: str):
        if self._parent is not None:  # one warning for all blocks of a class
            return self._parent._warn_once(f"a repeated block ({type(self.model).__name__}): {why}")
        with self._lock:
            if why in self._warned:
                return
            self._warned.add(why)
        warnings.warn(f"ditops.diffusers.capture: {self.name}: {why}", RuntimeWarning, stacklevel=4)

    def _refused(self, why: str):
        """Counts an eager call and warns once per reason; returns _RUN_EAGER."""
        with self._lock:
            self.refusals[why] += 1
        self._warn(why)
        return _RUN_EAGER

    def _eager(self, args, kwargs, why: str):
        self._refused(why)
        return self.original(*args, **kwargs)

    def _slow(self, key, args, kwargs, tensors):
        """The lock held: a first call, a capture (then its replay) or a refusal. Returns the
        outputs, or _RUN_EAGER for the caller to run the model's forward outside the lock."""
        if self._weights and not _ptrs_equal(
                self._weights, self._weight_ptrs, self._weight_idx):
            # the graphs read the parameters at their capture-time addresses
            self.drop_graphs()
            why = ("the model's parameters moved since the capture (model.to, a fused LoRA, replaced "
                   "weights): its graphs were released, and each signature is captured again")
            if why not in self._warned:
                self._warned.add(why)
                warnings.warn(f"ditops.diffusers.capture: {self.name}: {why}", RuntimeWarning, stacklevel=3)
        entry = self.entries.get(key)
        if entry is None:
            return self._first(key, args, kwargs)
        entry.calls += 1
        if entry.state == _REFUSED:
            return self._refused(entry.why)
        if self.regions:  # a whole-forward capture failed before: this signature goes regional too
            entry.state, entry.why = _REGIONAL, "the whole forward's capture failed on another signature"
            self.regional_calls += 1
            return _RUN_EAGER
        paths = []
        signature(args, kwargs, paths)
        why = self._refusal(key, paths, args, kwargs)
        if not why:
            try:
                self._capture(entry, key, paths, args, kwargs, tensors)
            except _Opaque as e:
                entry.drop()
                why = str(e)
            except Exception as e:  # noqa: BLE001 (any failure: this signature runs eagerly)
                entry.drop()
                if not self.graphs:
                    # the failed capture released the pool's last use: torch refuses to begin
                    # another capture in a pool waiting to be freed
                    self.pool = None
                failed = f"the capture failed ({type(e).__name__}: {_first_line(e)}{_where(e, self.model)})"
                retry = "release() and capture() again to retry"
                if self._parent is None:  # a model's whole forward: its blocks instead (a block's own: eager)
                    no_regions = self._go_regional()
                    if not no_regions:
                        entry.state, entry.why = _REGIONAL, failed
                        self._warn_once(f"{failed}; its repeated blocks are captured instead ({len(self.regions)} "
                                        "blocks, one graph per block and signature, the rest of the forward eager)")
                        self.regional_calls += 1
                        return _RUN_EAGER
                    retry += f"; no regional capture: {no_regions}"
                why = f"{failed}; this signature runs eagerly from now on ({retry})"
        if why:
            entry.state, entry.why = _REFUSED, why
            return self._refused(why)
        self.captures += 1
        return self._replay(entry, tensors)

    def _first(self, key, args, kwargs):
        """A signature's first call: eager, recorded; or eager unrecorded where a Python number
        changes between calls (each value would be a signature of its own). The lock held; the
        forward runs after it is released (_RUN_EAGER)."""
        skeleton = _skeleton(key)
        why = self._volatile.get(skeleton)
        if why:
            return self._refused(why)
        paths = []
        signature(args, kwargs, paths)
        keys = self._skeletons.setdefault(skeleton, [])
        if len(keys) >= VALUES_PER_LAYOUT:
            changed = [(paths[i], a[1], b[1]) for i, (a, b) in enumerate(zip(keys[0], key)) if a != b]
            names = ", ".join(f"{p} ({old!r}, ..., {new!r})" for p, old, new in changed[:3])
            why = self._volatile[skeleton] = (
                f"the Python value of {names} took more than {VALUES_PER_LAYOUT} values with the same "
                "tensors: a graph bakes it in, so each value would need a graph of its own; calls with a "
                "new value run eagerly (pass it as a tensor)")
            return self._refused(why)
        keys.append(key)
        if len(self.entries) >= 4 * self.max_graphs:
            return self._refused(f"more than {4 * self.max_graphs} signatures were seen (a shape "
                                 "or an argument that changes with every call?)")
        self.entries[key] = _Entry(_label(key, paths))
        self.eager_calls += 1
        return _RUN_EAGER

    def _refusal(self, key, paths, args=(), kwargs=None) -> str:
        """Why this signature cannot be captured now, or ''."""
        model = self.model
        if model.__dict__.get("forward") is not self.installed:
            return "the model's forward was replaced after capture() (something wraps it)"
        weights = list(itertools.chain(model.parameters(), model.buffers()))
        devices = sorted({str(t.device) for t in weights})
        if len(devices) > 1:
            return f"the model's parameters are on several devices ({', '.join(devices)})"
        tensor_devices = [(p, e[3]) for e, p in zip(key, paths) if _is_tensor_entry(e)]
        device = weights[0].device if weights else (tensor_devices[0][1] if tensor_devices else torch.device("cpu"))
        why = self.backend.refuses(device)
        if why:
            return why
        for path, d in tensor_devices:
            if d != device:
                return f"argument {path} is on {d}, the model on {device} (mixed devices)"
        for name, module in model.named_modules():
            if module is model:
                continue  # its own hooks run around this forward at every call
            if module._forward_hooks or module._forward_pre_hooks:
                return f"{name} has forward hooks (they would run at capture only, not at each replay)"
            # ditops's forwards are diffusers hooks of their own (_patching.py); any other hook refuses
            own = module.__dict__.get("forward")
            if own is not None and getattr(own, "_ditops_capture", None) in self.regions:
                continue  # a region of this capture
            if own is not None and not only_ditops_hooks(module):
                return f"{name}.forward is replaced by {_describe_forward(module)}"
            processor = getattr(module, "processor", None)
            if processor is not None and not type(processor).__module__.startswith(("diffusers.", "ditops.")):
                return (f"{name}.processor is {type(processor).__module__}.{type(processor).__qualname__} "
                        "(a processor that is not diffusers' or ditops's may keep Python state)")
        if self.graphs >= self.max_graphs:
            return (f"{self.name} has max_graphs={self.max_graphs} graphs already (release() frees them; "
                    "capture(..., max_graphs=) allows more)")
        if self._graph_refusal is not None:
            why = self._graph_refusal(model, args, kwargs or {})
            if why:
                return why
        self._device = device
        if not self._weights:
            self._weights = weights
            self._weight_ptrs = [t.data_ptr() for t in weights]
            self._weight_idx = list(range(len(weights)))
        return ""

    def _capture(self, entry, key, paths, args, kwargs, tensors):
        tensor_paths = [p for e, p in zip(key, paths) if _is_tensor_entry(e)]
        inputs = [_StaticInput(t, p) for t, p in zip(tensors, tensor_paths)]
        for static, src in zip(inputs, tensors):
            static.copy(src)  # the warm-up and the capture run on this call's values
        views = iter([s.view for s in inputs])
        s_args, s_kwargs = _substitute(args, views), _substitute(kwargs, views)
        constants = None
        if self._graph_constants is not None:
            # built here, eagerly and outside the graph, on the caller's stream (the capture's side
            # stream waits for it); the graph reads them at these addresses
            s_args, s_kwargs, constants = self._graph_constants(self.model, s_args, s_kwargs)
        if self.pool is None:
            self.pool = self.backend.new_pool(self._device)
        original = self.original
        graph, out = self.backend.capture(lambda: original(*s_args, **s_kwargs), self.pool, self._device)
        entry.outputs, entry.rebuild = _output_rebuilder(out)
        entry.graph, entry.inputs, entry.constants, entry.state = graph, inputs, constants, _GRAPH
        # the capture synchronized the device: the first replay waits for no earlier stream
        self._stream = self._stream_token = None

    # ------------------------------------------------------------ report
    # The report reads under the lock: other threads' calls add signatures and count.
    @property
    def graphs(self) -> int:
        """This forward's graphs (its regions' apart: region_graphs)."""
        with self._lock:
            return sum(e.graph is not None for e in self.entries.values())

    @property
    def region_graphs(self) -> int:
        with self._lock:
            return sum(r.graphs for r in self.regions)

    def signatures(self) -> list:
        with self._lock:
            return [{"signature": e.label, "state": e.state, "why": e.why, "calls": e.calls}
                    for e in self.entries.values()]

    def as_dict(self) -> dict:
        with self._lock:
            return {"model": self.name, "graphs": self.graphs, "max_graphs": self.max_graphs,
                    "first_calls": self.eager_calls, "captures": self.captures, "replays": self.replays,
                    "signatures": self.signatures(), "refusals": dict(self.refusals),
                    "regional_calls": self.regional_calls, "regions": [r.as_dict() for r in self.regions]}

    def __str__(self):
        with self._lock:
            rows = [f"{self.name}: {self.graphs} graph(s) (max {self.max_graphs}), {self.captures} captured, "
                    f"{self.replays} replays, {self.eager_calls} first calls, "
                    f"{sum(self.refusals.values())} eager calls refused capture"]
            for e in self.entries.values():
                rows.append(f"  {e.state:<10} {e.calls:>5} call(s)  {e.label}" + (f"  why: {e.why}" if e.why else ""))
            for why, n in self.refusals.most_common(5):
                rows.append(f"  {n} eager call(s): {why}")
            if self.regions:
                replays = sum(r.replays for r in self.regions)
                rows.append(f"  regional: {self.regional_calls} call(s) of the forward around {len(self.regions)} "
                            f"captured blocks ({self.region_graphs} graph(s), {replays} block replays)")
        return "\n".join(rows)


def _opaque_why(args, kwargs) -> str:
    """The refusal of an argument the signature cannot hold, naming it (the fast path has no paths)."""
    try:
        signature(args, kwargs, [])
    except _Opaque as e:
        return str(e)
    return "an argument the signature cannot hold"


def _first_line(e) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _where(e, model) -> str:
    """', at <file>:<line> in <function>': the innermost frame of e's traceback in the model's
    code (diffusers, or the module of the model's class), else outside torch and this module;
    or ''."""
    import sys
    roots = [os.path.dirname(getattr(sys.modules.get("diffusers"), "__file__", None) or "/nonexistent") + os.sep]
    own = getattr(sys.modules.get(type(model).__module__), "__file__", None)
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__]
    model_frames = [f for f in frames if f.filename == own or f.filename.startswith(tuple(roots))]
    f = (model_frames or frames or [None])[-1]
    return "" if f is None else f", at {os.path.basename(f.filename)}:{f.lineno} in {f.name}"


def _label(key, paths) -> str:
    """A short text of a signature: each tensor's shape and dtype, each non-tensor value."""
    parts = []
    for entry, path in zip(key[1:], paths[1:]):
        if _is_tensor_entry(entry):
            parts.append(f"{path}={list(entry[0])} {str(entry[2]).replace('torch.', '')}")
        elif type(entry) is tuple and len(entry) == 2 and entry[0] in _SCALARS and entry[1] is not None:
            parts.append(f"{path}={entry[1]!r}")
    return ", ".join(parts)


# ---------------------------------------------------------------- the API


class CaptureReport:
    """What capture() installed: a CapturedForward per model (a pipeline's transformer and
    transformer_2), and the parts it left eager, with why."""

    def __init__(self):
        self.parts: dict = {}     # name -> CapturedForward
        self.refused: dict = {}   # name -> why

    def __getitem__(self, name: str) -> CapturedForward:
        return self.parts[name]

    def as_dict(self) -> dict:
        return {"captured": {n: c.as_dict() for n, c in self.parts.items()}, "refused": dict(self.refused)}

    def __str__(self):
        rows = ["ditops.diffusers.capture: one CUDA graph per input signature (the first call eager)"]
        rows += ["  " + line for c in self.parts.values() for line in str(c).splitlines()]
        rows += [f"  not captured: {n}: {why}" for n, why in self.refused.items()]
        return "\n".join(rows)


_COMPILED = ("is a torch.compile wrapper: its forward is compiled, and a capture of it would be traced "
             "(torch.compile(mode='reduce-overhead') captures CUDA graphs itself; or capture the model)")


def _parts(target):
    """[(name, model or None, why not)]: a model, or a pipeline's transformer and transformer_2."""
    from . import UnsupportedError
    compiled = torch._dynamo.eval_frame.OptimizedModule
    if isinstance(target, torch.nn.Module):
        return [(type(target).__name__, None, _COMPILED) if isinstance(target, compiled)
                else (type(target).__name__, target, "")]
    found = []
    for name in ("transformer", "transformer_2"):
        part = getattr(target, name, None)
        if isinstance(part, compiled):
            found.append((name, None, _COMPILED))
        elif isinstance(part, torch.nn.Module):
            found.append((name, part, ""))
    if not found:
        raise UnsupportedError(f"ditops.diffusers.capture: {type(target).__name__} is neither a model nor a "
                               "pipeline with a transformer; nothing was changed")
    return found


def captured(model_or_pipeline) -> CapturedForward | None:
    """The CapturedForward of a captured model (a pipeline's transformer), or None."""
    for _, model, _ in _parts(model_or_pipeline):
        if model is not None:
            state = getattr(model.__dict__.get("forward"), "_ditops_capture", None)
            if state is not None:
                return state
    return None


def check_max_graphs(max_graphs) -> None:
    from . import UnsupportedError
    if type(max_graphs) is not int or max_graphs < 1:
        raise UnsupportedError(f"ditops.diffusers.capture: max_graphs must be an int >= 1, not {max_graphs!r}; "
                               "nothing was changed")


def _install(model_or_pipeline, max_graphs: int, reuse: bool) -> CaptureReport:
    with INSTALL_LOCK:
        return _install_locked(model_or_pipeline, max_graphs, reuse)


def _install_locked(model_or_pipeline, max_graphs: int, reuse: bool) -> CaptureReport:
    from . import SUPPORTED_MODELS, UnsupportedError
    check_max_graphs(max_graphs)
    report, todo = CaptureReport(), []
    for name, model, why in _parts(model_or_pipeline):
        if model is None:
            report.refused[name] = why
            warnings.warn(f"ditops.diffusers.capture: {name} {why}; it runs as it is", RuntimeWarning, stacklevel=4)
            continue
        existing = captured(model)
        if existing is not None:
            if not reuse:
                raise UnsupportedError(f"ditops.diffusers.capture: {name} is already captured; release it first "
                                       "(nothing was changed)")
            report.parts[name] = existing
            continue
        own = model.__dict__.get("forward")
        if own is not None and not only_ditops_hooks(model):
            why = (f"its forward is already replaced by {_describe_forward(model)}; a capture would hide "
                   "it, so the model runs as it is")
            report.refused[name] = why
            warnings.warn(f"ditops.diffusers.capture: {name}: {why}", RuntimeWarning, stacklevel=4)
            continue
        todo.append((name, model))
    for name, model in todo:
        if type(model).__name__ not in SUPPORTED_MODELS:
            warnings.warn(f"ditops.diffusers.capture: {type(model).__name__} is not among the classes "
                          f"ditops.diffusers tests ({', '.join(SUPPORTED_MODELS)}); it is captured on the "
                          "assumption that its forward depends on its arguments and weights only",
                          RuntimeWarning, stacklevel=4)
        # Over ditops's hook where enable patched the model's own forward (the hook chain runs).
        state = CapturedForward(model, name, max_graphs, BACKEND, original=model.__dict__.get("forward"))
        state.install()
        report.parts[name] = state
    return report


def capture(model_or_pipeline, *, max_graphs: int = DEFAULT_MAX_GRAPHS) -> CaptureReport:
    """Capture the forward of a diffusers transformer (a model, or a pipeline's transformer and
    transformer_2) in CUDA graphs, one per input signature: the first call of a signature runs
    eagerly, the second captures, later calls replay. Returns the live CaptureReport.

    Each call returns new tensors (clones of the graph's outputs), safe to keep across calls.
    What cannot be captured runs eagerly with one RuntimeWarning per reason; a torch.compile
    wrapper is left as it is (a warning). At most max_graphs graphs per model (all in one memory
    pool). Raises UnsupportedError, with nothing changed, for a target that is neither a model
    nor a pipeline, or a model already captured. release() or ditops.diffusers.disable() frees
    the graphs and restores the forward."""
    return _install(model_or_pipeline, max_graphs, reuse=False)


def release(model_or_pipeline) -> bool:
    """Free the graphs and restore the forward capture() replaced. True when something was
    captured."""
    done = False
    with INSTALL_LOCK:
        for _, model, _ in _parts(model_or_pipeline):
            state = captured(model) if model is not None else None
            if state is None:
                continue
            why = state.uninstall()
            if why:
                warnings.warn(f"ditops.diffusers.release: {why}", RuntimeWarning, stacklevel=2)
            done = True
    return done


def forget(model) -> None:
    """Drop a captured model's graphs and signatures (its code changed: enable, disable), and put
    its blocks' forwards back where regions replaced them (before enable changes them)."""
    state = captured(model)
    if state is not None:
        state.drop_graphs()
        state.drop_regions()
