"""Shared by the bench/*_torch.py scripts (imported from the script's own folder): the DLPack
structs of the C ABI (include/ditops/c_api.h), torch tensor -> DLTensor, the eager chains of the
Python package loaded by path (the scripts need only libditops, not the compiled module), and
the torch.compile recompile limits."""
import ctypes
import importlib.util
import os
import statistics
import sys

import torch


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# DLPack type codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLFloat8_e4m3fn 10 (dlpack 1.x)
DL_CODES = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
            torch.int32: (0, 32), torch.int64: (0, 64), torch.uint8: (1, 8), torch.float8_e4m3fn: (10, 8)}


def dltensor(t, keep):
    """A DLTensor viewing torch tensor `t` (no copy). It and its shape/stride arrays are appended
    to `keep`, which must outlive the C call."""
    shape = (ctypes.c_int64 * t.dim())(*t.shape)
    strides = (ctypes.c_int64 * t.dim())(*t.stride())
    code, bits = DL_CODES[t.dtype]
    d = DLTensor(ctypes.c_void_p(t.data_ptr()), DLDevice(2 if t.is_cuda else 1, t.device.index or 0),
                 t.dim(), DLDataType(code, bits, 1), shape, strides, 0)
    keep.append((shape, strides, d))
    return d


class DitopsLib:
    """libditops through its generic C ABI (ditops_call, include/ditops/c_api.h): any op of the
    table by name, tensors by slot name (absent ones omitted), options as text. Needs only
    libditops, no compiled Python module."""

    def __init__(self, path):
        import json
        self.lib = ctypes.CDLL(path)
        self.lib.ditops_call.restype = ctypes.c_int
        self.lib.ditops_op_table.restype = ctypes.c_size_t
        n = self.lib.ditops_op_table(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.ditops_op_table(buf, n + 1)
        self.slots = {op["name"]: [t["name"] for t in op["tensors"]] for op in json.loads(buf.value.decode())}

    def call(self, op, stream=None, options=None, **tensors):
        keep = []
        slots = self.slots[op]
        unknown = set(tensors) - set(slots)
        if unknown:
            raise TypeError(f"{op} has no tensors {sorted(unknown)} (slots: {slots})")
        ptrs = (ctypes.POINTER(DLTensor) * len(slots))(
            *[ctypes.pointer(dltensor(tensors[n], keep)) if tensors.get(n) is not None else None for n in slots])
        items = [(k, v) for k, v in (options or {}).items() if v is not None]
        opts = (DitopsOption * max(len(items), 1))(
            *[DitopsOption(k.encode(), (str(v).lower() if isinstance(v, bool) else str(v)).encode()) for k, v in items])
        impl, err = ctypes.create_string_buffer(128), ctypes.create_string_buffer(4096)
        s = ctypes.c_void_p(stream if stream is not None else torch.cuda.current_stream().cuda_stream)
        if self.lib.ditops_call(op.encode(), ptrs, len(slots), opts, len(items), s, impl, 128, err, 4096):
            raise RuntimeError(err.value.decode())
        return impl.value.decode()


class DitopsOption(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def load_eager():
    """python/ditops/eager (the one copy of every eager chain, a module per op), registered as the
    package `ditops_eager`: torch.compile re-imports the module of the functions it traces."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "ditops", "eager")
    spec = importlib.util.spec_from_file_location("ditops_eager", os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["ditops_eager"] = module
    spec.loader.exec_module(module)
    return module


def allow_recompiles(limit=256):
    """One torch.compile'd function is called at every benchmark shape (dynamic=False, so it is
    recompiled per shape). Dynamo stops recompiling after its limit (8 by default) and then runs
    the function eagerly, which would report eager times as torch.compile: raise the limits."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, limit)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 16 * limit)


def script_main(make_ditops, checks, run_bench):
    """The command line every bench/*_torch.py script shares: --lib PATH (libditops), --json PATH,
    --commit SHA, --skip-bench. Runs each (label, check(dt, rows, meta) -> bool) of `checks`, then
    run_bench(dt, rows, meta) unless --skip-bench; writes the timing records (bench/results/README.md:
    op, case, shape, impl, method, us, bytes, gb_per_s, copy_fraction, read_roof_fraction, device, date, commit) to
    --json and the checks' records (torch.equal results, with the torch version) beside it as
    <name>_checks.json; prints e.g. "VERIFY PASS GRAPH PASS"; returns the exit code."""
    import argparse
    import datetime
    import json
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--skip-bench", action="store_true")
    a = ap.parse_args()
    dt = make_ditops(a.lib)
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), commit=a.commit,
                torch=torch.__version__)
    rows = []
    # DITOPS_BENCH_SKIP_CHECKS=1: timing only (A/B runs; the checks ran on the same kernels elsewhere)
    import os
    skip_checks = os.environ.get("DITOPS_BENCH_SKIP_CHECKS") == "1"
    chosen = _selection("DITOPS_BENCH_CHECKS")  # a regex over the checks' labels (unset: every check)
    checks = [(label, check) for label, check in checks if chosen is None or chosen.search(label)]
    results = [] if skip_checks else [(label, bool(check(dt, rows, meta))) for label, check in checks]
    if not a.skip_bench:
        run_bench(dt, rows, meta)
    records = [r for r in rows if r.get("kind") == "bench"]
    checks = [r for r in rows if r.get("kind") != "bench"]
    for r in checks:
        r.update({k: v for k, v in meta.items() if k not in r})
    with open(a.json, "w") as f:
        json.dump([{k: r.get(k) for k in RECORD_FIELDS} for r in records], f, indent=1)
    print("wrote", a.json)
    if checks:
        path = os.path.splitext(a.json)[0] + "_checks.json"
        with open(path, "w") as f:
            json.dump(checks, f, indent=1)
        print("wrote", path)
    print(" ".join(f"{label} {'PASS' if ok else 'FAIL'}" for label, ok in results))
    return 0 if all(ok for _, ok in results) else 1


# The fields of a timing record, in order (bench/results/README.md; bench/records.py reads them).
RECORD_FIELDS = ("op", "case", "shape", "impl", "method", "us", "bytes", "gb_per_s", "copy_fraction",
                 "read_roof_fraction", "device", "date", "commit")


def shape_str(*dims):
    """"(1,4608,3072)": the shape field of a record; several tensors' shapes joined by commas."""
    return ",".join("(" + ",".join(str(int(d)) for d in t) + ")" for t in dims)


def record(rows, meta, op, case, shape, impl, method, us, nbytes, copy_us, read_roof_us=None):
    """Appends one timing record. method: "cold_l2" (do_bench: the L2 cleared before each call),
    "rotated_graph" (rotated_graph_us) or "cold_graph" (cold_graph_us). read_roof_us: a GEMM/GEMV's
    read roof (the bytes it must read at the measured read bandwidth), for read_roof_fraction."""
    rows.append(dict(kind="bench", op=op, case=case, shape=shape, impl=impl, method=method, us=round(us, 3),
                     bytes=nbytes, gb_per_s=round(nbytes / (us * 1e-6) / 1e9, 1),
                     copy_fraction=round(copy_us / us, 4) if copy_us else None,
                     read_roof_fraction=round(read_roof_us / us, 4) if read_roof_us else None,
                     device=meta["device"], date=meta["date"], commit=meta["commit"]))


def median_us(fn, rep_ms=200):
    """Median time of fn() in µs: triton.testing.do_bench (cold L2: it clears the cache before
    every repetition; repetitions for rep_ms milliseconds after 25 ms of warm-up)."""
    import triton
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e3


def graph_on_side_stream(fn):
    """A CUDA graph of fn(stream_handle) captured on a side stream (replay with .replay())."""
    side = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=side):
        fn(side.cuda_stream)
    return g


def cold_graph_us(fns, sets=4, rep_ms=200):
    """Time in µs of a call captured alone in a CUDA graph on a side stream and replayed by
    median_us (cache cleared before each replay): the cold reading with every implementation
    launched the same way. In median_us's own reading ditops is already such a graph (its ctypes
    call costs tens of µs of host time) while torch.compile and eager launch directly: a direct
    launch read 0.6-1.1 µs less than the same kernel alone in a graph where its host time stayed
    behind the clear, and up to 10x more where it did not (per-token gate: 84 against 7.4 µs;
    bench/results run 79). fns: one call per buffer set; the first `sets` of them get a graph
    each (rep_ms shared among them) and the median of their medians is returned: from a cleared
    L2 where the buffers lie moves a reading by up to 1.5 % (the same Triton kernel on two sets of
    residual_gate_add buffers at (1,4608,3072): 26.14 against 26.53 µs, bench/results run 88),
    which one set alone reads as a difference between implementations. Outputs fns return are
    held until the timing ends."""
    fns = fns[:sets]
    for fn in fns:  # compile, JIT, autotune outside the capture
        fn()
    torch.cuda.synchronize()
    per_set = []
    for fn in fns:
        side = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            held = fn()
        per_set.append(median_us(graph.replay, rep_ms=max(50, rep_ms // len(fns))))
        del held, graph
    return statistics.median(per_set)


def rotation_count(set_bytes, max_sets=64):
    """Buffer sets for rotated timing: enough that the sets together are over 3x the L2, so a set
    is never read from the L2 its previous use filled (2 at least, max_sets at most)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(2, min(max_sets, -(-3 * l2 // max(set_bytes, 1))))


def _tensors(value):
    """The tensors in a call's return value (a tensor, a tuple of them, or anything else)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def rotated_graph_us(calls, reps=15, target_us=3000.0):
    """GPU time per call in µs, the same way for every implementation: `calls` (one zero-argument
    callable per buffer set, each launching on the current stream) are captured round after round
    into one CUDA graph on a side stream, so no host time (Python, ctypes, Dynamo guards) and no
    cache flush overlaps the kernels; the rounds fill about target_us of GPU time. Returns the
    median over `reps` replays of replay time / calls captured. Outputs a call returns (eager,
    torch.compile) are held until the capture ends, so every captured call writes its own buffer
    from the graph's pool: freed at once, the next call would get the same block back and write
    into lines the previous call left in the L2 (a 25 MB output is half the H200's L2), an
    advantage the rotating ditops outputs do not get. Temporaries inside a call are still reused."""
    for c in calls:  # compile, JIT, autotune outside the capture
        c()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for c in calls:
        c()
    stop.record()
    torch.cuda.synchronize()
    round_us = max(start.elapsed_time(stop) * 1e3, 1.0)  # an upper bound (host time included)
    rounds = max(2, min(200, int(target_us / round_us) + 1))
    # Held outputs cost rounds x calls x the output size: stay under ~8 GiB of them.
    probe = calls[0]()
    out_bytes = sum(t.untyped_storage().nbytes() for t in _tensors(probe))
    del probe
    if out_bytes:
        rounds = max(1, min(rounds, (8 << 30) // (out_bytes * len(calls))))
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    held = []
    with torch.cuda.graph(graph, stream=side):
        for _ in range(rounds):
            for c in calls:
                held.append(c())
    del held  # the graph keeps its pool: the replays write the same distinct buffers
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / (rounds * len(calls)))
    del graph
    times.sort()
    return times[len(times) // 2]


try:  # triton comes with torch on the GPU machine
    import triton
    import triton.language as tl

    @triton.jit
    def _copy_words(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)
except ImportError:
    _copy_words = None


def copy_kernel(src, dst):
    """A device copy of src's bytes into dst as a Triton kernel (int32 words). For rotated timing:
    `dst.copy_(src)` captured in a CUDA graph becomes a memcpy node that runs on a copy engine,
    ~1.5x slower than a copy by the SMs (run 20); outside a graph it is an SM copy like this one."""
    s, d = src.view(torch.int32), dst.view(torch.int32)
    n = s.numel()
    _copy_words[(triton.cdiv(n, 2048),)](s, d, n, BLOCK=2048, num_warps=4)


def _selection(name):
    """A regular expression from the environment (None when unset): DITOPS_BENCH_CASES selects the
    benchmark cases by label, DITOPS_BENCH_IMPLS the implementations (the device copy is always
    timed), DITOPS_BENCH_CHECKS a script's checks by label. For A/B runs of a few cases
    (scripts/device_run.sh ab); records of a selection are
    still complete records of what was measured."""
    import os
    import re
    value = os.environ.get(name)
    return re.compile(value) if value else None


def case_selected(label):
    """Whether DITOPS_BENCH_CASES (unset: every case) selects the case `label`."""
    pattern = _selection("DITOPS_BENCH_CASES")
    return pattern is None or bool(pattern.search(label))


METHODS = ("cold_l2", "rotated_graph", "cold_graph")


def selected_methods():
    """The timing methods DITOPS_BENCH_METHODS names (comma-separated, e.g. "cold_graph": a grid too
    large for one device call timed one way); unset: all three."""
    import os
    value = os.environ.get("DITOPS_BENCH_METHODS")
    if not value:
        return METHODS
    chosen = tuple(m for m in METHODS if m in value.split(","))
    if not chosen:
        raise ValueError(f"DITOPS_BENCH_METHODS={value!r} names none of {METHODS}")
    return chosen


def measure(impls):
    """{label: (cold_us, rotated_us, cold_graph_us)} for impls = [(label, cold_fn, rotated_fns)]:
    cold_fn timed by median_us (cache cleared before each call), rotated_fns (one call per buffer
    set) by rotated_graph_us, and the first four of them (DITOPS_BENCH_COLD_SETS) each alone in a
    graph by cold_graph_us; a method DITOPS_BENCH_METHODS leaves out is None. An implementation that
    raises is reported and left out; so is one that DITOPS_BENCH_IMPLS does not select."""
    measured = {}
    pattern = _selection("DITOPS_BENCH_IMPLS")
    methods = selected_methods()
    import os
    cold_sets = int(os.environ.get("DITOPS_BENCH_COLD_SETS", "4"))  # fewer: a quicker, noisier screening run
    for label, cold_fn, rotated_fns in impls:
        if pattern is not None and label != "device_copy" and not pattern.search(label):
            continue
        try:
            measured[label] = (median_us(cold_fn) if "cold_l2" in methods else None,
                               rotated_graph_us(rotated_fns) if "rotated_graph" in methods else None,
                               cold_graph_us(rotated_fns, sets=cold_sets) if "cold_graph" in methods else None)
        except Exception as e:  # noqa: BLE001 (report and go on)
            print(f"  {label} failed: {repr(e)[:200]}", flush=True)
    return measured


def report(measured, rows, meta, op, case, shape, nbytes, width=34):
    """Prints one line per implementation (cold, rotated and cold-graph µs, GB/s by the byte model,
    fraction of the "device_copy" entry timed the same way) and appends one record per
    (implementation, method) to rows; then torch.compile's rotated and cold-graph times over
    ditops's ("ditops:jit")."""
    if "device_copy" not in measured:
        print(f"{case}: no device copy measured; records left out")
        return
    copy_cold, copy_rot, copy_graph = measured["device_copy"]

    def us(t, width_):
        return f"{t:{width_}.2f}" if t is not None else f"{'-':>{width_}s}"

    def pct(copy_t, t):
        return f"{100 * copy_t / t:5.1f}%" if t is not None else f"{'-':>6s}"

    for label, (cold, rot, graph) in measured.items():
        gbs = f"{nbytes / (rot * 1e-6) / 1e9:7.1f}" if rot is not None else f"{'-':>7s}"
        print(f"{case:{width}s} {label:24s} {us(cold, 9)} {pct(copy_cold, cold)} {us(rot, 10)} {gbs} {pct(copy_rot, rot)} "
              f"{us(graph, 9)} {pct(copy_graph, graph)}", flush=True)
        for method, t, copy_us in (("cold_l2", cold, copy_cold), ("rotated_graph", rot, copy_rot),
                                   ("cold_graph", graph, copy_graph)):
            if t is not None:
                record(rows, meta, op, case, shape, label, method, t, nbytes, copy_us)
    if "torch_compile" in measured and "ditops:jit" in measured:
        ratios = [f"({name}): {measured['torch_compile'][i] / measured['ditops:jit'][i]:.3f}"
                  for i, name in ((1, "rotated"), (2, "cold graph")) if measured["ditops:jit"][i] is not None]
        print(f"{case:{width}s} torch.compile / ditops {' '.join(ratios)}", flush=True)


def report_header(width=34):
    print(f"\n{'case':{width}s} {'impl':24s} {'cold us':>9s} {'copy%':>6s} {'rotated':>10s} {'GB/s':>7s} {'copy%':>6s}"
          f" {'graph cold':>9s} {'copy%':>6s}")


def copy_impl(sets, src_of, dst_of):
    """The "device_copy" entry of measure(): torch's copy_ cold, the Triton copy kernel rotated."""
    return ("device_copy", lambda: dst_of(sets[0]).copy_(src_of(sets[0])),
            [lambda s=s: copy_kernel(src_of(s), dst_of(s)) for s in sets])


def copy_buffers(nbytes):
    """src, dst of a device copy of the byte model: nbytes / 2 each, rounded up to int32 words."""
    src = torch.empty((nbytes // 2 + 3) // 4 * 4, dtype=torch.uint8, device="cuda")
    return src, torch.empty_like(src)
