"""The bindings derived from the op table: every registered op reaches Python and torch with the
C++ defaults, and the derived entries give the facade's messages."""
import inspect

import numpy as np
import pytest

import ditops

_PY = {"true": True, "false": False, "none": None}


def _default(option):
    text, kind = option["default"], option["kind"]
    if kind in ("bool", "optional_bool"):
        return _PY[text]
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def test_every_registered_op_is_described_and_bound():
    registered = {k["op"] for k in ditops.list_kernels()}
    described = {op["name"] for op in ditops.op_table()}
    assert registered == described
    for name in described:
        assert callable(getattr(ditops, name)), name


def test_python_functions_take_the_cpp_defaults():
    for op in ditops.op_table():
        params = inspect.signature(getattr(ditops, op["name"])).parameters
        for option in op["options"]:
            assert params[option["name"]].default == _default(option), (op["name"], option["name"])
            assert params[option["name"]].kind == inspect.Parameter.KEYWORD_ONLY
        for t in op["tensors"]:
            assert t["name"] in params, (op["name"], t["name"])
        assert params["backend"].default is None and params["stream"].default is None


def test_raw_call_arguments_match_the_ffi_entry_for_every_op():
    """_codegen.call_arguments (the host-overhead benchmark's raw call) gives exactly the count the
    FFI entry expects for every op: one fewer is refused as a count, these reach argument matching."""
    from ditops import _codegen
    for index, op in enumerate(ditops.op_table()):
        args = _codegen.call_arguments(op, {})
        assert len(args) == len(op["tensors"]) + len(op["options"]) + 2, op["name"]
        with pytest.raises(ditops.Error, match="arguments after the op") as short:
            ditops._call(index, True, -1, *args[:-1])
        assert f"expected {len(args)} arguments after the op but got {len(args) - 1}" in str(short.value)
        # every tensor absent: the count is accepted and argument matching refuses the call,
        # naming the op's first required tensor
        first = next(t["name"] for t in op["tensors"] if not t["optional"] and t["role"] != "out")
        with pytest.raises(ditops.Error) as absent:
            ditops._call(index, True, -1, *args)
        assert str(absent.value).startswith(f"{op['name']}: tensor '{first}' is required"), str(absent.value)


def test_raw_call_arguments_run_the_op():
    from ditops import _codegen
    from conftest import make_qknorm_rope_inputs
    table = ditops.op_table()
    index = [op["name"] for op in table].index("qknorm_rope")
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(3, 2, 2, 64, 64)
    tensors = dict(q=q.copy(), k=k.copy(), q_weight=wq, k_weight=wk, cos_sin_cache=cache, positions=pos)
    args = _codegen.call_arguments(table[index], tensors, dict(is_neox=True, eps=1e-5))
    assert str(ditops._call(index, False, -1, *args)) == "qknorm_rope.reference"
    q2, k2 = q.copy(), k.copy()
    ditops.qknorm_rope(q2, k2, wq, wk, cache, pos, is_neox=True, eps=1e-5)  # the generated function
    assert np.array_equal(tensors["q"], q2) and np.array_equal(tensors["k"], k2)
    with pytest.raises(ValueError, match="qknorm_rope: no option named is_neo "):
        _codegen.call_arguments(table[index], tensors, dict(is_neo=True))
    with pytest.raises(ValueError, match="qknorm_rope: no tensor named x "):
        _codegen.call_arguments(table[index], dict(x=q))


def test_gemm_flag_is_exported():
    """`gemm` (benchmarks report the read roof) is a bool of every op, set only on GEMMs/GEMVs."""
    table = ditops.op_table()
    assert all(isinstance(op["gemm"], bool) for op in table)
    assert {op["name"] for op in table if op["gemm"]} == {"fp8_linear"}


def test_known_cpp_defaults_reach_python():
    qk = inspect.signature(ditops.qknorm_rope).parameters
    assert qk["eps"].default == 1e-06 and qk["rounding"].default == "rounded" and qk["use_pdl"].default is True
    nss = inspect.signature(ditops.norm_scale_shift).parameters
    assert nss["fp8_reciprocal"].default == "div_full" and nss["store_y"].default is None
    fp8 = inspect.signature(ditops.layernorm_modulate_fp8).parameters
    assert fp8["fp8_reciprocal"].default == "ieee"


def test_torch_schemas_take_the_cpp_defaults():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import ditops.torch  # noqa: F401 (registers the ops)
    for op in ditops.op_table():
        schema = getattr(torch.ops.ditops, op["name"]).default._schema
        args = {a.name: a for a in schema.arguments}
        for option in op["options"]:
            assert args[option["name"]].default_value == _default(option), (op["name"], option["name"])
            assert args[option["name"]].kwarg_only


def test_derived_errors_keep_the_facade_messages():
    q = np.ones((2, 2, 64), np.float16)
    w = np.ones(64, np.float16)
    cache = np.zeros((4, 64), np.float32)
    pos = np.zeros(2, np.int64)
    with pytest.raises(ditops.Error, match=r"unknown rounding 'exact' \(expected rounded or fp32\)"):
        ditops.qknorm_rope(q, q.copy(), w, w, cache, pos, rounding="exact")
    with pytest.raises(ditops.Error, match=r"q_weight.*64.*"):
        ditops.qknorm_rope(q, q.copy(), np.ones(32, np.float16), w, cache, pos)
    with pytest.raises(ditops.Error, match=r"option 'eps' must be a number"):
        ditops.qknorm_rope(q, q.copy(), w, w, cache, pos, eps="small")
    r = np.ones((2, 3, 8), np.float32)
    with pytest.raises(ditops.Error, match="out must not overlap residual"):
        ditops.residual_gate_add(r, r.copy(), r.copy(), out=r)


def test_outputs_follow_the_table_rules():
    x = np.ones((1, 256, 64), np.float32)
    scale = np.zeros((1, 64), np.float32)
    outs = ditops.norm_scale_shift(x, scale)
    assert outs.y is not None and outs.y.shape == x.shape and outs.fp8 is None
    outs = ditops.norm_scale_shift(x, scale, residual=x.copy(), gate=scale.copy())
    assert outs.residual_out is not None and outs.residual_out.shape == x.shape
    q = np.ones((1, 4, 2, 64), np.float32).astype(np.dtype("float32"))
    with pytest.raises(ditops.Error):  # bf16 only: the error comes from the facade, not Python
        ditops.qk_head_layernorm(q, q.copy())


def test_generated_source_is_inspectable():
    src = ditops.generated_source()
    for op in ditops.op_table():
        assert f"def {op['name']}(" in src


def test_alloc_rules_evaluate_in_python_as_in_cpp():
    from ditops import _codegen
    expr, like = _codegen._shape_expr("dim(x,0),dim(x,2)+left+1,last(x)-left")
    x = np.zeros((2, 5, 7, 11), np.float32)
    assert like == "x"
    assert eval(expr, {"x": x, "left": 3}) == (2, 11, 8)  # tests/test_op_rules.cpp: the same rule


def test_format_outputs_keep_the_dimension_order_of_their_tensor():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    x = torch.zeros(1, 4, 2, 3, 5).to(memory_format=torch.channels_last_3d)
    out = ditops._dense_in_order_of(x, (1, 4, 3, 5, 7), torch.float16)
    assert out.shape == (1, 4, 3, 5, 7) and out.dtype == torch.float16
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    plain = ditops._dense_in_order_of(torch.zeros(2, 3, 4), (2, 5, 4), torch.float32)
    assert plain.is_contiguous() and plain.shape == (2, 5, 4)
