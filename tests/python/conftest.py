"""Shared helpers for the Python package tests (run by ctest as python_pytest, or directly:
PYTHONPATH=<build>/python python -m pytest tests/python)."""
import atexit
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

# Inductor's FX graph cache keys a graph on the op names it calls, not on their schemas
# (pytorch/pytorch#187319): a graph cached by an earlier build calls a changed op with its old
# arguments. The tests compile into a cache of their own, per session, unless the caller names one.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ditops-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

# ditops.eager and the bench share one eager chain; tests import the package as installed or
# from the build tree (PYTHONPATH), never from the source tree, which has no compiled module.
import ditops  # noqa: F401  (fails loudly here when the module is missing)


def pytest_configure(config):
    # cpu_only: a module that runs on the CPU whatever the machine (CI runs it on every change). The
    # device verify deselects it (-m "not cpu_only"): its CPU torch.compile tests took 138-152 s
    # each there beside the GPU jobs (docs/tuning/device_verify.md).
    config.addinivalue_line("markers", "cpu_only: a CPU-only test module (the device verify leaves it to CI)")


# Modules whose tests without a CUDA skipif mark run on the CPU whatever the machine (read on
# 2026-12-06: nothing else in them touches a device): those tests are cpu_only too. At 19999c5 on
# the H100 they were 510 of the device verify's 3060 pytest test-seconds.
CPU_UNLESS_MARKED_CUDA = {"test_diffusers_fp8.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in CPU_UNLESS_MARKED_CUDA and not any(
                "CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cpu_only)


def make_qknorm_rope_inputs(T, Hq, Hk, D, R, *, dtype=np.float16, cache_dtype=np.float32,
                            pos_dtype=np.int64, full_width=False, packed=False, seed=0):
    """numpy inputs; packed: q and k are views into one [T, (Hq + 2 Hk) * D] QKV buffer (the V
    part holds 1.25 so a stray write shows)."""
    rng = np.random.default_rng(seed)
    if packed:
        qkv = np.full((T, (Hq + 2 * Hk) * D), 1.25, dtype=dtype)
        qkv[:, : (Hq + Hk) * D] = rng.standard_normal((T, (Hq + Hk) * D)).astype(dtype)
        q = qkv[:, : Hq * D].reshape(T, Hq, D)
        k = qkv[:, Hq * D: (Hq + Hk) * D].reshape(T, Hk, D)
        assert np.shares_memory(q, qkv) and np.shares_memory(k, qkv)
    else:
        qkv = None
        q = rng.standard_normal((T, Hq, D)).astype(dtype)
        k = rng.standard_normal((T, Hk, D)).astype(dtype)
    wq = (rng.random(D) + 0.5).astype(dtype)
    wk = (rng.random(D) + 0.5).astype(dtype)
    P = max(2 * T, 16)
    if full_width:
        cache = rng.standard_normal((P, 2 * R))
    else:
        inv = 10000.0 ** (-np.arange(0, R // 2) * 2 / R)
        t = np.arange(P)[:, None]
        cache = np.concatenate([np.cos(t * inv), np.sin(t * inv)], -1)
    cache = cache.astype(cache_dtype)
    pos = rng.permutation(P)[:T].astype(pos_dtype)
    return q, k, wq, wk, cache, pos, qkv


def qknorm_rope_float64(x, w, cache, pos, R, neox, eps, full_width=False):
    """The op in float64, with the norm rounded to the activation dtype before RoPE as the
    rounded mode does (docs/qknorm_rope.md §2): a tolerance oracle for the bindings' plumbing."""
    xd = x.astype(np.float64)
    inv_rms = 1.0 / np.sqrt(np.mean(xd * xd, -1, keepdims=True) + eps)
    n = (xd * inv_rms * w.astype(np.float64)).astype(x.dtype).astype(np.float64)
    rows = cache[pos].astype(np.float64)
    if full_width:
        cos, sin = rows[:, :R], rows[:, R:]
    else:
        c, s = rows[:, : R // 2], rows[:, R // 2:]
        cos, sin = (np.concatenate([c, c], -1), np.concatenate([s, s], -1)) if neox else \
                   (np.repeat(c, 2, -1), np.repeat(s, 2, -1))
    cos, sin = cos[:, None, :], sin[:, None, :]
    xr = n[..., :R]
    if neox:
        rot = np.concatenate([-xr[..., R // 2:], xr[..., : R // 2]], -1)
    else:
        rot = np.stack([-xr[..., 1::2], xr[..., 0::2]], -1).reshape(xr.shape)
    out = n.copy()
    out[..., :R] = xr * cos + rot * sin
    return out


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def diffusers_or_skip():
    """(torch, diffusers) for a test module of ditops.diffusers, or the module skipped where either
    is missing or diffusers is outside the range ditops.diffusers is tested with."""
    torch = torch_or_skip()
    diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (pip install 'ditops[diffusers]')")
    import ditops.diffusers as dd
    try:
        dd._check_version()  # the range enable() refuses outside of
    except dd.UnsupportedError as e:
        pytest.skip(str(e), allow_module_level=True)
    return torch, diffusers


NO_CUDA = "no CUDA device (GPU tests run on the device machine)"


def needs_cuda_mark(torch):
    """The mark of a GPU test in a module that also runs on the CPU."""
    return pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)


def cuda_or_skip():
    torch = torch_or_skip()
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA, allow_module_level=True)
    return torch


# DITOPS_PYTEST_PROGRESS=FILE: one line per test as it starts and ends (worker, seconds, the CPU
# seconds of the worker and the children it waited for: how much of the machine a test took, and
# the outcome), flushed at once, so a run cut by its deadline still shows which test was running,
# how long each took and which failed (its JUnit XML is written only at the end).
_PROGRESS = os.environ.get("DITOPS_PYTEST_PROGRESS")
if _PROGRESS:
    import resource as _resource
    import time as _time

    _WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")

    def _progress(line):
        with open(_PROGRESS, "a") as f:
            f.write(f"{_time.strftime('%H:%M:%S')} {_WORKER} {line}\n")

    def _cpu_seconds():
        return sum(u.ru_utime + u.ru_stime for u in map(_resource.getrusage, (_resource.RUSAGE_SELF, _resource.RUSAGE_CHILDREN)))

    _OUTCOME = {}  # nodeid -> "passed" / "failed" / "skipped" (a failed setup or teardown fails the test)

    def pytest_runtest_logreport(report):
        if report.failed:
            _OUTCOME[report.nodeid] = "failed"
        elif report.when == "call" or report.skipped:
            _OUTCOME.setdefault(report.nodeid, report.outcome)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start, cpu = _time.perf_counter(), _cpu_seconds()
        _progress(f"start {item.nodeid}")
        yield
        outcome = _OUTCOME.pop(item.nodeid, "unknown")
        _progress(f"end {_time.perf_counter() - start:.1f}s cpu {_cpu_seconds() - cpu:.1f}s {outcome} {item.nodeid}")
