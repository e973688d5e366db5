"""can_use and try_<op> for every op (issue 23's protocols), on CPU tensors built from the op test
driver's cases: a valid call is usable and runs; with every implementation disabled it is not
usable, try returns None and writes nothing while the plain call raises; bad input raises
through both; an explicit backend stays strict."""
import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import ditops  # noqa: E402
import op_cases  # noqa: E402

CASES = op_cases.cases()
OPS = sorted({c["op"] for c in CASES})


def _first(op, invalid):
    """The op's first small case, valid or not; invalid ones without shared storage (a torch view
    keeps its owner's dtype, where the C++ driver aliases raw bytes)."""
    for c in CASES:
        if c["op"] == op and bool(c["invalid"]) == invalid and c["kind"] != "empty" and not c.get("large") \
                and not (invalid and any(t["storage"] for t in c["tensors"])):
            return c
    return None


def _call_args(case):
    table = next(o for o in ditops.op_table() if o["name"] == case["op"])
    options, absent = op_cases.options_and_absent(case, table)
    x = {**op_cases.tensors(case, case["seed"], "cpu"), **absent}
    written = [t["name"] for t in table["tensors"] if t["role"] != "in" and x.get(t["name"]) is not None]
    return x, options, written


@pytest.fixture
def disabled(monkeypatch):
    def disable(op):
        monkeypatch.setenv("DITOPS_DISABLE", op)
        ditops.reload_config()
    yield disable
    monkeypatch.delenv("DITOPS_DISABLE", raising=False)
    ditops.reload_config()


@pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")
@pytest.mark.parametrize("op", OPS)
def test_a_valid_call_is_usable_and_try_runs_it(op):
    case = _first(op, invalid=False)
    x, options, _ = _call_args(case)
    assert ditops.can_use(op, **x, **options) == (True, "")
    assert getattr(ditops, f"can_use_{op}")(**x, **options) == (True, "")
    assert getattr(ditops, f"try_{op}")(**x, **options) is not None


@pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")
@pytest.mark.parametrize("op", OPS)
def test_with_nothing_eligible_try_returns_none_and_writes_nothing(op, disabled):
    case = _first(op, invalid=False)
    x, options, written = _call_args(case)
    disabled(op)
    usable, why = ditops.can_use(op, **x, **options)
    assert not usable and "disabled by DITOPS_DISABLE" in why, why
    before = {n: x[n].clone() for n in written}
    assert ditops.try_call(op, **x, **options) is None
    for n in written:
        assert torch.equal(x[n].view(torch.uint8), before[n].view(torch.uint8)), n
    with pytest.raises(ditops.Error, match="no eligible implementation"):
        getattr(ditops, op)(**x, **options)


@pytest.mark.skipif(not CASES, reason="DITOPS_EXPORT_OP_CASES does not name the case exporter")
@pytest.mark.parametrize("op", OPS)
def test_bad_input_raises_through_both_and_a_named_backend_stays_strict(op):
    case = _first(op, invalid=True)
    if case is not None:
        x, options, _ = _call_args(case)
        with pytest.raises(ditops.Error, match=re.escape(case["invalid"][0])):
            ditops.can_use(op, **x, **options)
        with pytest.raises(ditops.Error):
            ditops.try_call(op, **x, **options)
    x, options, _ = _call_args(_first(op, invalid=False))
    with pytest.raises(ditops.Error, match="no eligible implementation"):
        ditops.try_call(op, **x, **options, backend="jit")  # CPU tensors: the jit cannot take them
