"""The op test driver's cases against the eager PyTorch chain, on CUDA only: every case the C++
driver runs (exported as JSON by the export_op_cases executable, DITOPS_EXPORT_OP_CASES), laid
out the same way (strides, shared buffers, offsets), run through every implementation of the op
that explain finds eligible, and compared with torch.equal against the chain that the
implementation's bit_exact contract names (an eager chain, or torch._scaled_mm for fp8_linear's
vendor path). The chains are ditops.eager's (the benchmarks' too).
Cases whose numerics have no eager chain (fp32 rounding, SGLang orders, quantized NVFP4 outputs)
are left to the C++ driver, which compares them with the CPU reference."""

import pytest

from conftest import cuda_or_skip

torch = cuda_or_skip()

import ditops  # noqa: E402
from ditops import eager  # noqa: E402
import op_cases  # noqa: E402

_cases, _tensors = op_cases.cases, lambda case, seed: op_cases.tensors(case, seed, "cuda")


def _eager(case, x):
    """The written tensors the eager chain gives, or None when no chain is the oracle here."""
    return eager.oracle_outputs(case["op"], x, case["options"])


# Special values (NaN, +-Inf, subnormals) are compared with the reference by the C++ driver:
# torch.equal takes no NaN as equal.
CASES = [c for c in _cases() if not c["invalid"] and c["kind"] != "empty" and not op_cases.has_special_values(c)]
# Looked up once: a thousand cases would otherwise copy the whole table each.
TABLE = {op["name"]: op for op in ditops.op_table()}
# The implementations each case tries: those bit-exact to an eager chain (or torch._scaled_mm).
EAGER_EXACT = {name: [k for k in ditops.list_kernels(name) if k["provenance"] != "reference"
                      and k["contract"] == "bit_exact"
                      and ("eager" in k["oracle"] or "torch._scaled_mm" in k["oracle"])] for name in TABLE}


@pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")
@pytest.mark.parametrize("case", CASES, ids=[f"{c['op']}/{c['name']}" for c in CASES])
def test_every_eligible_implementation_equals_the_eager_chain(case):
    inputs = _tensors(case, case["seed"])
    want = _eager(case, {k: v.clone() for k, v in inputs.items()})
    if want is None:
        pytest.skip("no eager chain is this case's oracle (the C++ driver compares it with the reference)")
    fn = getattr(ditops, case["op"])
    options, absent = op_cases.options_and_absent(case, TABLE[case["op"]])
    ran = 0
    for kernel in EAGER_EXACT[case["op"]]:
        x = {**_tensors(case, case["seed"]), **absent}
        report = ditops.explain(case["op"], **x, **options, backend=kernel["provenance"], quality="high")
        if report.chosen != kernel["name"]:
            continue  # ineligible here (the C++ driver counts the reasons)
        impl = fn(**x, **options, backend=kernel["provenance"], quality="high")
        torch.cuda.synchronize()
        for tensor, expected in want.items():
            got = x[tensor]
            assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                               expected.view(torch.uint8) if expected.dtype == torch.float8_e4m3fn else expected), \
                f"{kernel['name']} ({impl}) {tensor} differs from the eager chain"
        ran += 1
    if ran == 0:
        pytest.skip("no implementation with an eager-chain contract is eligible for this case here")
