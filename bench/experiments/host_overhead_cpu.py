"""Host cost of one call from Python on the CPU path (an experiment, not a benchmark of the
kernels): the raw FFI call, the ditops function and the torch.ops.ditops op, on the problem of one
row that bench/experiments/host_overhead_cpu.cpp times through the C++ facade. Compares two builds
with one method (docs/tuning/host_overhead.md):

    PYTHONPATH=BUILD/python python3 bench/experiments/host_overhead_cpu.py [CALLS [ROUNDS]]

prints the best of ROUNDS rounds of CALLS back-to-back calls, in us per call. On a shared machine
count instructions instead: `count OP N` makes N calls of ditops.OP (qknorm_rope or
residual_gate_add) with numpy f16 tensors and nothing else, so two callgrind totals
(OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 valgrind --tool=callgrind python3 ... count OP N) differ
by the calls alone.
"""
import sys
import time

import ditops
from ditops import _codegen


def count(op, calls):
    import numpy as np

    f16 = np.float16
    if op == "qknorm_rope":
        q, k, wq, wk = np.ones((1, 1, 64), f16), np.ones((1, 1, 64), f16), np.ones(64, f16), np.ones(64, f16)
        cache, pos = np.zeros((2, 64), np.float32), np.zeros(1, np.int64)
        for _ in range(calls):
            ditops.qknorm_rope(q, k, wq, wk, cache, pos)
    else:
        res, upd, gate, out = (np.ones((1, 1, 64), f16) for _ in range(4))
        for _ in range(calls):
            ditops.residual_gate_add(res, upd, gate, out=out)


def per_call_us(fn, calls, rounds):
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "count":
        count(sys.argv[2], int(sys.argv[3]))
        return
    import torch

    import ditops.torch  # noqa: F401 (registers torch.ops.ditops)

    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    bf16 = torch.bfloat16
    q, k = torch.ones(1, 1, 64, dtype=bf16), torch.ones(1, 1, 64, dtype=bf16)
    wq, wk = torch.ones(64, dtype=bf16), torch.ones(64, dtype=bf16)
    cache, pos = torch.zeros(2, 64), torch.zeros(1, dtype=torch.int64)
    res, upd, gate = (torch.ones(1, 1, 64, dtype=bf16) for _ in range(3))
    table = ditops.op_table()
    index = [op["name"] for op in table].index("qknorm_rope")
    args = _codegen.call_arguments(table[index], dict(q=q, k=k, q_weight=wq, k_weight=wk, cos_sin_cache=cache,
                                                      positions=pos), dict(is_neox=False, eps=1e-6))
    raw = ditops._call
    calls_by_name = {
        "qknorm_rope ffi_direct": lambda: raw(index, False, -1, *args),
        "qknorm_rope ditops.qknorm_rope": lambda: ditops.qknorm_rope(q, k, wq, wk, cache, pos),
        "qknorm_rope torch.ops.ditops": lambda: torch.ops.ditops.qknorm_rope(q, k, wq, wk, cache, pos),
        "residual_gate_add ditops": lambda: ditops.residual_gate_add(res, upd, gate),
        "residual_gate_add torch.ops.ditops": lambda: torch.ops.ditops.residual_gate_add(res, upd, gate),
    }
    print(f"host overhead per call, CPU path (Python, one row), best of {rounds} x {calls} calls")
    for name, fn in calls_by_name.items():
        print(f"  {name:40s} {per_call_us(fn, calls, rounds):7.2f} us")


if __name__ == "__main__":
    main()
