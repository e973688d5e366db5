"""The package over numpy (DLPack, reference backend): results, errors, the registry. No torch."""
import numpy as np
import pytest

import ditops
from conftest import make_qknorm_rope_inputs, qknorm_rope_float64


def run_numpy(T, Hq, Hk, D, R, neox, **kw):
    opts = {k: kw.pop(k) for k in ("dtype", "cache_dtype", "pos_dtype", "full_width", "packed") if k in kw}
    q, k, wq, wk, cache, pos, qkv = make_qknorm_rope_inputs(T, Hq, Hk, D, R, **opts)
    q0, k0 = q.copy(), k.copy()
    impl = ditops.qknorm_rope(q, k, wq, wk, cache, pos, is_neox=neox, rope_dim=R,
                              cache_full_width=opts.get("full_width", False), **kw)
    eps = kw.get("eps", 1e-6)
    full = opts.get("full_width", False)
    ref_q = qknorm_rope_float64(q0, wq, cache, pos, R, neox, eps, full)
    ref_k = qknorm_rope_float64(k0, wk, cache, pos, R, neox, eps, full)
    return impl, q, k, ref_q, ref_k, qkv


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("T,Hq,Hk,D,R", [(1, 1, 1, 64, 64), (7, 4, 2, 128, 128), (5, 3, 3, 128, 64),
                                         (3, 2, 1, 256, 128), (0, 2, 2, 64, 64)])
def test_qknorm_rope_numpy_matches_float64(T, Hq, Hk, D, R, neox):
    impl, q, k, ref_q, ref_k, _ = run_numpy(T, Hq, Hk, D, R, neox)
    assert impl == "qknorm_rope.reference"
    # fp16 outputs of O(1): a plumbing mistake (stride, position, pairing) is off by O(1).
    np.testing.assert_allclose(q.astype(np.float64), ref_q, rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(k.astype(np.float64), ref_k, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("variant", [dict(pos_dtype=np.int32), dict(cache_dtype=np.float16),
                                     dict(full_width=True), dict(packed=True)])
def test_qknorm_rope_numpy_variants(variant):
    neox = True
    impl, q, k, ref_q, ref_k, qkv = run_numpy(9, 4, 2, 128, 128, neox, **variant)
    np.testing.assert_allclose(q.astype(np.float64), ref_q, rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(k.astype(np.float64), ref_k, rtol=4e-3, atol=4e-3)
    if qkv is not None:  # packed QKV: the V part is untouched
        assert (qkv[:, (4 + 2) * 128:] == np.float16(1.25)).all()


def test_results_change_with_options():
    # is_neox and eps reach the C++ options (a binding that dropped them would pass the above
    # only for its default).
    base = make_qknorm_rope_inputs(4, 2, 2, 64, 64)
    outs = []
    for neox, eps in ((False, 1e-6), (True, 1e-6), (False, 10.0)):
        q, k, wq, wk, cache, pos, _ = [x.copy() if x is not None else None for x in base]
        ditops.qknorm_rope(q, k, wq, wk, cache, pos, is_neox=neox, eps=eps)
        outs.append(q)
    assert not np.array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_fp32_rounding_and_warp_order_run():
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(3, 2, 2, 128, 128)
    q0 = q.copy()
    impl = ditops.qknorm_rope(q, k, wq, wk, cache, pos, rounding="fp32", norm_order="warp",
                              quality="high")
    assert impl == "qknorm_rope.reference"
    ref = qknorm_rope_float64(q0, wq, cache, pos, 128, False, 1e-6)
    np.testing.assert_allclose(q.astype(np.float64), ref, rtol=4e-3, atol=4e-3)


# ---------------------------------------------------------------- errors: named, nothing written


def expect_error_nothing_written(match, mutate):
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(4, 2, 2, 64, 64)
    args = dict(q=q, k=k, q_weight=wq, k_weight=wk, cos_sin_cache=cache, positions=pos)
    opts = mutate(args) or {}
    q_before, k_before = args["q"].copy(), args["k"].copy()
    with pytest.raises(ditops.Error, match=match):
        ditops.qknorm_rope(*args.values(), **opts)
    assert np.array_equal(args["q"], q_before) and np.array_equal(args["k"], k_before)


def test_wrong_dtype_names_the_tensor():
    expect_error_nothing_written(r"q\.dtype must be bf16 or f16 but is f32",
                                 lambda a: a.update(q=a["q"].astype(np.float32)))
    expect_error_nothing_written(r"k_weight", lambda a: a.update(k_weight=a["k_weight"].astype(np.float32)))
    expect_error_nothing_written(r"positions", lambda a: a.update(positions=a["positions"].astype(np.float32)))


def test_unsupported_dlpack_dtype_names_the_tensor():
    # The dtype by name and what is accepted: ditops' dtypes and this tensor's rule.
    expect_error_nothing_written(r"qknorm_rope: cos_sin_cache: from_dlpack: unsupported dtype float64 \(DLPack "
                                 r"code 2, bits 64, lanes 1\); the dtypes ditops takes: f32, f16, bf16, .*; "
                                 r"cos_sin_cache takes f32 or q's dtype$",
                                 lambda a: a.update(cos_sin_cache=a["cos_sin_cache"].astype(np.float64)))
    expect_error_nothing_written(r"qknorm_rope: q: from_dlpack: unsupported dtype complex64 .*; q takes bf16 or f16$",
                                 lambda a: a.update(q=a["q"].astype(np.complex64)))
    expect_error_nothing_written(r"qknorm_rope: positions: from_dlpack: unsupported dtype int16 .*; positions takes "
                                 r"i32 or i64$", lambda a: a.update(positions=a["positions"].astype(np.int16)))


def test_a_non_tensor_input_is_named_not_the_output_allocated_like_it():
    x = np.zeros((2, 3, 8), np.float32)
    for bad in ([1.0, 2.0], 1.5, np.float32(1.0)):
        with pytest.raises(ditops.Error, match=r"^residual_gate_add: residual must be a tensor \(a torch tensor, "
                                               r"a numpy array or another DLPack producer\) but is "):
            ditops.residual_gate_add(bad, x, x)
    with pytest.raises(ditops.Error, match=r"^residual_gate_add: gate must be a tensor"):
        ditops.residual_gate_add(x, x, [1.0])


def test_non_contiguous_last_dim_is_refused():
    def strided_q(a):
        wide = np.repeat(a["q"], 2, axis=-1)  # [T, H, 2D]
        a["q"] = wide[..., ::2]               # the same values, last stride 2
    expect_error_nothing_written(r"q\.stride", strided_q)


def test_wrong_shape_names_the_dimension():
    expect_error_nothing_written(r"q_weight\.shape", lambda a: a.update(q_weight=a["q_weight"][:32].copy()))
    expect_error_nothing_written(r"k\.shape\[0\]", lambda a: a.update(k=a["k"][:3].copy()))
    expect_error_nothing_written(r"head_dim\) must be 64, 128 or 256 but is 96",
                                 lambda a: a.update(q=np.zeros((4, 2, 96), np.float16),
                                                    k=np.zeros((4, 2, 96), np.float16)))


def test_read_only_arrays_are_refused_for_in_place_ops():
    def read_only(name):
        def mutate(a):
            a[name] = a[name].copy()
            a[name].flags.writeable = False
        return mutate
    expect_error_nothing_written(r"qknorm_rope: q is a read-only numpy array", read_only("q"))
    expect_error_nothing_written(r"qknorm_rope: k is a read-only numpy array", read_only("k"))

    # Read-only inputs that are only read are fine.
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(2, 1, 1, 64, 64)
    for x in (wq, wk, cache, pos):
        x.flags.writeable = False
    ditops.qknorm_rope(q, k, wq, wk, cache, pos)


def test_bad_options_are_errors():
    expect_error_nothing_written(r"unknown rounding 'exact' \(expected rounded or fp32\)",
                                 lambda a: {"rounding": "exact"})
    expect_error_nothing_written(r"unknown norm_order", lambda a: {"norm_order": "tree"})
    expect_error_nothing_written(r"unknown backend 'cuda'", lambda a: {"backend": "cuda"})
    expect_error_nothing_written(r"unknown quality", lambda a: {"quality": "best"})
    expect_error_nothing_written(r"rope_dim must be in", lambda a: {"rope_dim": 512})
    # An explicit backend is strict: jit cannot run CPU arrays, and says so.
    expect_error_nothing_written(r"qknorm_rope\.jit", lambda a: {"backend": "jit"})


def test_error_is_runtime_and_value_error():
    assert issubclass(ditops.Error, RuntimeError) and issubclass(ditops.Error, ValueError)
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(2, 1, 1, 64, 64)
    with pytest.raises(ValueError):
        ditops.qknorm_rope(q.astype(np.float32), k, wq, wk, cache, pos)


# ---------------------------------------------------------------- registry


def test_list_kernels_has_every_qknorm_rope_implementation():
    rows = ditops.list_kernels()
    names = {r["name"] for r in rows}
    assert {"qknorm_rope.reference", "qknorm_rope.jit", "qknorm_rope.aot"} <= names
    ref = next(r for r in rows if r["name"] == "qknorm_rope.reference")
    assert ref["provenance"] == "reference" and ref["unavailable"] == ""
    assert ref["contract"] in ("bit_exact", "close") and ref["op"] == "qknorm_rope"
    jit = next(r for r in rows if r["name"] == "qknorm_rope.jit")
    assert any("cuda" in c for c in jit["capabilities"])
    assert all(r["op"] == "qknorm_rope" for r in ditops.list_kernels("qknorm_rope"))
    with pytest.raises(ditops.Error, match="list_kernels: unknown op 'no_such_op'"):  # as explain
        ditops.list_kernels("no_such_op")


def test_explain_chooses_the_reference_for_cpu_arrays():
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(4, 2, 2, 128, 128)
    q0 = q.copy()
    report = ditops.explain("qknorm_rope", q, k, wq, wk, cache, pos, is_neox=True, quality="high")
    assert report.op == "qknorm_rope" and report.device == "cpu"
    assert report.chosen == "qknorm_rope.reference"
    by_name = {c["name"]: c for c in report.candidates}
    assert by_name["qknorm_rope.reference"]["chosen"] and by_name["qknorm_rope.reference"]["eligible"]
    assert not by_name["qknorm_rope.jit"]["eligible"] and "cpu" in by_name["qknorm_rope.jit"]["reason"]
    assert "CHOSEN" in str(report)
    assert np.array_equal(q, q0)  # explain runs nothing
    assert report.quality == "high" and report.admitting_quality is None and report.admitting_choice is None
    # Nothing eligible (the named backend cannot take CPU arrays), and no tier would change that.
    refused = ditops.explain("qknorm_rope", q, k, wq, wk, cache, pos, backend="jit", quality="exact")
    assert refused.chosen is None and refused.quality == "exact" and refused.admitting_quality is None
    assert "no eligible implementation at any quality: each is refused above for what the call or the device " \
           "lacks, not for its contract\n" in str(refused)


def test_explain_errors():
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(4, 2, 2, 128, 128)
    with pytest.raises(ditops.Error, match="unknown op 'nope'"):
        ditops.explain("nope", q)
    # list_kernels takes the same op names and refuses the same way
    with pytest.raises(ditops.Error, match=r"^list_kernels: unknown op 'nope' \(known: .*qknorm_rope"):
        ditops.list_kernels("nope")
    assert {k["op"] for k in ditops.list_kernels("qknorm_rope")} == {"qknorm_rope"}
    assert {k["op"] for k in ditops.list_kernels()} == {op["name"] for op in ditops.op_table()}
    with pytest.raises(ditops.Error, match=r"q\.dtype"):
        ditops.explain("qknorm_rope", q.astype(np.float32), k, wq, wk, cache, pos)


def test_version():
    assert ditops.__version__.count(".") == 2


def test_disable_env_reaches_the_dispatcher(monkeypatch):
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(2, 1, 1, 64, 64)
    monkeypatch.setenv("DITOPS_DISABLE", "qknorm_rope")
    ditops.reload_config()
    try:
        with pytest.raises(ditops.Error, match="qknorm_rope"):
            ditops.qknorm_rope(q, k, wq, wk, cache, pos)
    finally:
        monkeypatch.delenv("DITOPS_DISABLE")
        ditops.reload_config()
    ditops.qknorm_rope(q, k, wq, wk, cache, pos)
