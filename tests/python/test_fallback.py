"""The torch ops' eager fallback (issue 23, item 1), for every op over the op test driver's cases
on CPU tensors, with the op's implementations disabled so that nothing is eligible (the same path
a CUDA call takes when no kernel is eligible or every eligible one failed):
- a valid call runs the eager chain: it writes exactly ditops.eager's outputs for the call (a
  test of the routing: those chains are checked against diffusers' own modules in test_eager.py
  and against the kernels in test_ops_eager.py), warns once per signature and says so in
  last_dispatch();
- bad input raises a plain ditops.Error before anything runs, with or without implementations;
- an explicit backend stays strict; options with no eager chain raise NoImplementation.
"""
import re
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
# cpu_only: CPU tensors whatever the machine (297 of the device verify's 3060 pytest test-seconds
# on the H100 at 19999c5): CI runs it, the device verify leaves it out.
pytestmark = pytest.mark.cpu_only

import ditops  # noqa: E402
import ditops.torch as dtorch  # noqa: E402
from ditops import _codegen  # noqa: E402
from ditops.eager import fallback_outputs  # noqa: E402
import op_cases  # noqa: E402

CASES = op_cases.cases()
OPS = sorted({c["op"] for c in CASES})
TABLE = {o["name"]: o for o in ditops.op_table()}
needs_cases = pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")


def _small(c):
    return c["kind"] != "empty" and not c.get("large") and not any(t["storage"] for t in c["tensors"])


def _torch_args(case):
    """The case's inputs and options as torch.ops.ditops.<op> takes them (outputs are the op's)."""
    table = TABLE[case["op"]]
    options, absent = op_cases.options_and_absent(case, table)
    x = {**op_cases.tensors(case, case["seed"], "cpu"), **absent}
    inputs = {t["name"]: x.get(t["name"]) for t in table["tensors"] if t["role"] != "out"}
    return inputs, options


def _results(op, returned):
    """The op's returned outputs by name (absent ones are empty [0] tensors: dropped)."""
    outs = _codegen.returned_outputs(TABLE[op])
    values = returned if isinstance(returned, tuple) else (returned,)
    return {t["name"]: v for t, v in zip(outs, values) if v is not None and v.numel() > 0}


def _case_with_oracle(op, has_oracle):
    for c in CASES:
        if c["op"] != op or c["invalid"] or not _small(c):
            continue
        inputs, _ = _torch_args(c)
        given = {n: t for n, t in inputs.items() if t is not None}
        if (fallback_outputs(op, given, c["options"]) is not None) == has_oracle:
            return c
    return None


@pytest.fixture
def nothing_eligible(monkeypatch):
    def disable(op):
        monkeypatch.setenv("DITOPS_DISABLE", op)
        ditops.reload_config()
        dtorch.reset_gates()
    yield disable
    monkeypatch.delenv("DITOPS_DISABLE", raising=False)
    ditops.reload_config()
    dtorch.reset_gates()


def _valid_case(op):
    """A small valid case, with an eager chain where the op has one."""
    return _case_with_oracle(op, has_oracle=True) or _case_with_oracle(op, has_oracle=False)


def _invalid_input_case(op):
    """A small invalid case whose refused tensor is an input (the torch ops allocate the outputs)."""
    inputs = {t["name"] for t in TABLE[op]["tensors"] if t["role"] != "out"}
    for c in CASES:
        if c["op"] == op and c["invalid"] and _small(c) and re.split(r"[ .\[]", c["invalid"][0])[0] in inputs:
            return c
    return None


@needs_cases
@pytest.mark.parametrize("op", OPS)
def test_no_eligible_implementation_runs_the_eager_chain_and_warns_once(op, nothing_eligible):
    """Routing: with nothing eligible the call writes what ditops.eager's chain computes for it
    (fallback_outputs is the path's own chain, so this checks that the path runs it and writes its
    outputs back, not the chain's values: test_eager.py and test_ops_eager.py do that)."""
    case = _case_with_oracle(op, has_oracle=True)
    if case is None:  # fp8_linear: no eager chain is its oracle, so nothing stands in
        inputs, options = _torch_args(_valid_case(op))
        nothing_eligible(op)
        with pytest.raises(ditops.NoImplementation, match="no eager chain for these options"):
            getattr(torch.ops.ditops, op)(**inputs, **options)
        return
    inputs, options = _torch_args(case)
    given = {n: t.clone() for n, t in inputs.items() if t is not None}
    expected = fallback_outputs(op, given, case["options"])
    nothing_eligible(op)
    with pytest.warns(RuntimeWarning, match=f"(?s){op} on cpu runs the eager chain: .*disabled by DITOPS_DISABLE"):
        returned = getattr(torch.ops.ditops, op)(**inputs, **options)
    got = _results(op, returned)
    got.update({n: inputs[n] for n in expected if n in inputs})  # written in place
    assert set(got) == set(expected), (set(got), set(expected))
    for name, value in expected.items():
        assert torch.equal(got[name].view(torch.uint8), value.contiguous().view(torch.uint8)), name
    last = dtorch.last_dispatch()
    assert last.op == op and last.ran == "eager" and "disabled by DITOPS_DISABLE" in last.fallback_reason
    assert any(sig[0] == op for sig in dtorch.fallbacks())
    with warnings.catch_warnings():  # the same signature again: no second warning
        warnings.simplefilter("error")
        getattr(torch.ops.ditops, op)(**_torch_args(case)[0], **options)


@needs_cases
@pytest.mark.parametrize("op", OPS)
def test_an_eligible_implementation_runs_without_a_fallback(op):
    case = _valid_case(op)
    inputs, options = _torch_args(case)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(torch.ops.ditops, op)(**inputs, **options)
    assert dtorch.last_dispatch() == dtorch.Dispatch(op, f"{op}.reference", "")


@needs_cases
@pytest.mark.parametrize("op", OPS)
def test_bad_input_raises_and_writes_nothing_with_or_without_implementations(op, nothing_eligible):
    case = _invalid_input_case(op)
    if case is None:
        pytest.skip(f"{op}: no invalid case of an input without shared storage")
    for disable in (False, True):
        if disable:
            nothing_eligible(op)
        inputs, options = _torch_args(case)
        before = {n: t.clone() for n, t in inputs.items() if t is not None}
        with pytest.raises(ditops.Error, match=re.escape(case["invalid"][0])) as raised:
            getattr(torch.ops.ditops, op)(**inputs, **options)
        assert not isinstance(raised.value, ditops.NoImplementation)
        for n, t in before.items():  # bytes (NaN compares equal to itself), views made dense first
            assert torch.equal(inputs[n].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), n


@needs_cases
@pytest.mark.parametrize("op", OPS)
def test_an_explicit_backend_stays_strict(op, nothing_eligible):
    case = _valid_case(op)
    inputs, options = _torch_args(case)
    nothing_eligible(op)
    with pytest.raises(ditops.NoImplementation, match="for the requested backend reference"):
        getattr(torch.ops.ditops, op)(**inputs, **options, backend="reference")


@needs_cases
def test_options_without_an_eager_chain_raise_no_implementation(nothing_eligible):
    # qknorm_rope's warp order reproduces SGLang's chain, which no eager chain stands in for.
    case = next(c for c in CASES if c["op"] == "qknorm_rope" and not c["invalid"] and _small(c))
    inputs, options = _torch_args(case)
    nothing_eligible("qknorm_rope")
    with pytest.raises(ditops.NoImplementation, match="no eager chain for these options"):
        torch.ops.ditops.qknorm_rope(**inputs, **dict(options, norm_order="warp"))


@needs_cases
def test_the_fallback_runs_under_torch_compile(nothing_eligible):
    case = _case_with_oracle("residual_gate_add", has_oracle=True)
    inputs, options = _torch_args(case)
    # The expected values from the C++ reference (bit_exact to eager's chain; its own oracle is in
    # tests/cases/residual_gate_add_cases.cpp), not from the eager chain the fallback runs.
    expected = {"out": torch.ops.ditops.residual_gate_add(inputs["residual"], inputs["update"], inputs["gate"])}
    assert dtorch.last_dispatch().ran == "residual_gate_add.reference"
    nothing_eligible("residual_gate_add")
    compiled = torch.compile(lambda r, u, g: torch.ops.ditops.residual_gate_add(r, u, g) * 2,
                             fullgraph=True, backend="aot_eager")  # traced with fakes; no C++ compile
    with pytest.warns(RuntimeWarning, match="runs the eager chain"):
        got = compiled(inputs["residual"], inputs["update"], inputs["gate"])
    assert torch.equal(got, expected["out"] * 2)
    assert dtorch.last_dispatch().ran == "eager"


@needs_cases
@pytest.mark.parametrize("op", OPS)
def test_a_float64_input_raises_and_never_falls_back(op, nothing_eligible):
    # No op takes float64 activations: a dtype error, with or without implementations.
    inputs, options = _torch_args(_valid_case(op))
    first = next(t["name"] for t in TABLE[op]["tensors"] if t["role"] != "out")
    inputs[first] = inputs[first].double()
    for disable in (False, True):
        if disable:
            nothing_eligible(op)
        with pytest.raises(ditops.Error, match=f"{first}.*dtype|dtype.*{first}") as raised:
            getattr(torch.ops.ditops, op)(**inputs, **options)
        assert not isinstance(raised.value, ditops.NoImplementation)
