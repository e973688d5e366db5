"""ditops.torch on the CPU: the custom op, its fake implementation under torch.compile, and the
gate of apply_qk_norm_rope (kill switch, static checks, capability, self-check), with the GPU-only
layers simulated where needed. Skipped without PyTorch."""
import warnings

import numpy as np
import pytest

from conftest import make_qknorm_rope_inputs, torch_or_skip

torch = torch_or_skip()
import ditops  # noqa: E402
import ditops.torch as dt  # noqa: E402
from ditops.eager import qknorm_rope_eager  # noqa: E402

pytestmark = pytest.mark.cpu_only  # CI runs it; the device verify leaves it out (conftest.py)


def inputs(T=6, Hq=4, Hk=2, D=128, R=128, dtype=torch.float16, **kw):
    q, k, wq, wk, cache, pos, _ = make_qknorm_rope_inputs(T, Hq, Hk, D, R, **kw)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return t(q).to(dtype), t(k).to(dtype), t(wq).to(dtype), t(wk).to(dtype), t(cache), t(pos)


@pytest.fixture(autouse=True)
def fresh_gates(monkeypatch):
    monkeypatch.delenv(dt.KILL_SWITCH, raising=False)
    dt.reset_gates()
    torch._dynamo.reset()
    yield
    dt.reset_gates()


@pytest.fixture
def cpu_as_fused_platform(monkeypatch):
    """Let the gate treat CPU tensors as it treats CUDA ones (the fused op then runs the CPU
    reference), so every layer of the gate runs without a GPU."""
    monkeypatch.setattr(dt, "_FUSED_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(dt, "_qknorm_rope_capability", lambda *a: "")


# ---------------------------------------------------------------- the custom op


def test_schema_declares_the_mutated_tensors():
    schema = torch.ops.ditops.qknorm_rope.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["q", "k"]
    assert [r for r in schema.returns] == []
    kwarg_only = [a.name for a in schema.arguments if a.kwarg_only]
    assert kwarg_only[:3] == ["is_neox", "eps", "rope_dim"] and "backend" in kwarg_only


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_custom_op_equals_the_direct_call(dtype):
    q, k, wq, wk, cache, pos = inputs(dtype=dtype)
    q2, k2 = q.clone(), k.clone()
    assert ditops.qknorm_rope(q, k, wq, wk, cache, pos, is_neox=True) == "qknorm_rope.reference"
    torch.ops.ditops.qknorm_rope(q2, k2, wq, wk, cache, pos, is_neox=True)
    assert torch.equal(q, q2) and torch.equal(k, k2)
    # And it did something close to the eager chain (the CPU reference is not bit-exact to CPU
    # PyTorch; the contract is on CUDA).
    q0, k0, *_ = inputs(dtype=dtype)
    rq, rk = qknorm_rope_eager(q0, k0, wq, wk, cache, pos, 128, True, 1e-6)
    torch.testing.assert_close(q2.float(), rq.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k2.float(), rk.float(), atol=2e-2, rtol=2e-2)


def test_opcheck():
    # Schema vs actual mutation, fake implementation, functionalization (AOT dispatch).
    q, k, wq, wk, cache, pos = inputs()
    torch.library.opcheck(torch.ops.ditops.qknorm_rope.default, (q, k, wq, wk, cache, pos),
                          {"is_neox": False, "eps": 1e-6},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_custom_op_errors_are_ditops_errors():
    q, k, wq, wk, cache, pos = inputs()
    q0 = q.clone()
    with pytest.raises(ditops.Error, match=r"k\.dtype"):
        torch.ops.ditops.qknorm_rope(q, k.float(), wq, wk, cache, pos)
    assert torch.equal(q, q0)


def test_custom_op_under_compile_fullgraph():
    q, k, wq, wk, cache, pos = inputs()
    q_ref, k_ref = q.clone(), k.clone()
    torch.ops.ditops.qknorm_rope(q_ref, k_ref, wq, wk, cache, pos, is_neox=True, eps=1e-5)

    @torch.compile(fullgraph=True, backend="inductor")
    def step(q, k):
        torch.ops.ditops.qknorm_rope(q, k, wq, wk, cache, pos, is_neox=True, eps=1e-5)
        return q * 2, k + 1  # consumers of the mutated values

    q2, k2 = step(q, k)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)  # mutated in place through the graph
    assert torch.equal(q2, q_ref * 2) and torch.equal(k2, k_ref + 1)


# ---------------------------------------------------------------- the gate


def gate(q, k, wq, wk, cache, pos=None, **kw):
    return dt.qk_norm_rope_gate(q, k, wq, wk, cache, pos, eps=kw.pop("eps", 1e-6),
                                is_neox=kw.pop("is_neox", False), **kw)


def test_cpu_tensors_take_the_eager_chain():
    q, k, wq, wk, cache, pos = inputs()
    q0, k0 = q.clone(), k.clone()
    assert gate(q, k, wq, wk, cache, pos).startswith("q is on cpu")
    qo, ko = dt.apply_qk_norm_rope(q, k, wq, wk, cache, pos, eps=1e-6, is_neox=False)
    rq, rk = qknorm_rope_eager(q0, k0, wq, wk, cache, pos, 128, False, 1e-6)
    assert torch.equal(qo, rq) and torch.equal(ko, rk)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # the eager chain leaves the inputs alone


def test_capability_asks_the_dispatcher():
    # On CPU only the reference is eligible, so the real capability check says no, and why.
    why = dt._qknorm_rope_capability(-1, torch.float16, torch.float32, torch.int64, 4, 2, 128,
                                     128, 128, False, False, "rounded")
    assert "only the CPU reference" in why
    why = dt._qknorm_rope_capability(-1, torch.float16, torch.float32, torch.int64, 4, 2, 96,
                                     96, 96, False, False, "rounded")
    assert "head_dim" in why


def test_static_layers_of_the_gate(cpu_as_fused_platform, monkeypatch):
    q, k, wq, wk, cache, pos = inputs()
    assert gate(q, k, wq, wk, cache, pos) == ""  # GQA (4 q heads, 2 k heads) is allowed
    assert gate(q, k, wq, wk, cache, None) == ""
    for off in ("0", "false", "OFF", "no", ""):
        monkeypatch.setenv(dt.KILL_SWITCH, off)
        assert gate(q, k, wq, wk, cache, pos).startswith("disabled by DITOPS_ENABLE_FUSED_QKNORM_ROPE")
    monkeypatch.setenv(dt.KILL_SWITCH, "1")
    assert gate(q, k, wq, wk, cache, pos) == ""
    assert "different eps" in gate(q, k, wq, wk, cache, pos, k_eps=1e-5)
    assert gate(q, k, wq, wk, cache, pos, k_eps=1e-6) == ""
    assert "dtypes" in gate(q.float(), k.float(), wq.float(), wk.float(), cache, pos)
    assert "dtypes" in gate(q, k.bfloat16(), wq, wk, cache, pos)
    assert "norm weights" in gate(q, k, wq.float(), wk, cache, pos)
    assert "in-place" in gate(q, k, wq, wk, cache, pos, allow_inplace=False)
    assert "unit last stride" in gate(q.transpose(1, 2).contiguous().transpose(1, 2), k, wq, wk, cache, pos)
    assert "positions" in gate(q, k, wq, wk, cache, pos.float())
    assert "cos_sin_cache" in gate(q, k, wq, wk, cache.double(), pos)
    # Leading dims that do not flatten into tokens without a copy.
    q4 = torch.randn(6, 3, 4, 128, dtype=torch.float16)      # [B, S, H, D]
    k4 = torch.randn(6, 3, 2, 128, dtype=torch.float16)
    p18 = torch.arange(18)
    assert gate(q4, k4, wq, wk, torch.randn(32, 128), p18) == ""
    assert "flatten" in gate(q4.transpose(0, 1), k4.transpose(0, 1), wq, wk, torch.randn(32, 128), p18)


def test_fused_path_through_the_helper(cpu_as_fused_platform, monkeypatch):
    # With the reference as the "fused" op and a self-check oracle that agrees with it.
    def agreeing_reference(q, k, wq, wk, cache, pos, R, neox, eps, full):
        q2, k2 = q.clone(), k.clone()
        ditops.qknorm_rope(q2, k2, wq, wk, cache, pos, is_neox=neox, eps=eps, rope_dim=R,
                           cache_full_width=full)
        agreeing_reference.calls += 1
        return q2, k2
    agreeing_reference.calls = 0
    monkeypatch.setattr(dt, "_self_check_reference", agreeing_reference)
    q, k, wq, wk, cache, pos = inputs(T=5, Hq=3, Hk=1)
    q4, k4 = q.view(1, 5, 3, 128), k.view(1, 5, 1, 128)  # [B, S, H, D] views of the same memory
    expect_q, expect_k = agreeing_reference(q, k, wq, wk, cache, pos, 128, True, 1e-6, False)
    qo, ko = dt.apply_qk_norm_rope(q4, k4, wq, wk, cache, pos, eps=1e-6, is_neox=True)
    assert qo is q4 and ko is k4 and qo.shape == (1, 5, 3, 128)  # in place, shapes kept
    assert torch.equal(q, expect_q) and torch.equal(k, expect_k)
    assert agreeing_reference.calls == 2  # the expectation above + one self-check
    sig = dt._signature(q4, k4, cache, torch.int64, 128, True, False)
    assert dt._QKNORM_ROPE_GATE.state(sig) == "verified"
    dt.apply_qk_norm_rope(q4.clone(), k4.clone(), wq, wk, cache, pos, eps=1e-6, is_neox=True)
    assert agreeing_reference.calls == 2  # verified: no second check for this signature


def test_self_check_mismatch_disables_with_a_warning(cpu_as_fused_platform, monkeypatch):
    def disagreeing_reference(*args):
        rq, rk = qknorm_rope_eager(*args)
        return rq + 1, rk  # what a changed eager dispatch would look like
    monkeypatch.setattr(dt, "_self_check_reference", disagreeing_reference)
    q, k, wq, wk, cache, pos = inputs()
    q0, k0 = q.clone(), k.clone()
    with pytest.warns(RuntimeWarning, match="disabling the fused qknorm_rope path"):
        qo, ko = dt.apply_qk_norm_rope(q, k, wq, wk, cache, pos, eps=1e-6, is_neox=False)
    expect_q, expect_k = disagreeing_reference(q0, k0, wq, wk, cache, pos, 128, False, 1e-6, False)
    # The returned (and in-place) values are the oracle's, not the fused op's.
    assert torch.equal(qo, expect_q) and torch.equal(ko, expect_k)
    assert "disabled by the self-check" in gate(q0, k0, wq, wk, cache, pos)
    # Disabled: later calls take the eager chain, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q1, k1 = q0.clone(), k0.clone()
        qo, ko = dt.apply_qk_norm_rope(q1, k1, wq, wk, cache, pos, eps=1e-6, is_neox=False)
    rq, rk = qknorm_rope_eager(q0, k0, wq, wk, cache, pos, 128, False, 1e-6)
    assert torch.equal(qo, rq) and torch.equal(q1, q0)  # eager chain, inputs untouched
    # Another signature (neox) is checked on its own.
    assert gate(q0, k0, wq, wk, cache, pos, is_neox=True) == ""


def test_fused_failure_disables_with_a_warning(cpu_as_fused_platform, monkeypatch):
    def failing(*args):
        raise ditops.Error("qknorm_rope: simulated launch failure")
    monkeypatch.setattr(dt, "_call", failing)  # the generic entry the derived torch ops call
    q, k, wq, wk, cache, pos = inputs()
    q0, k0 = q.clone(), k.clone()
    with pytest.warns(RuntimeWarning, match="simulated launch failure"):
        qo, ko = dt.apply_qk_norm_rope(q, k, wq, wk, cache, pos, eps=1e-6, is_neox=False)
    rq, rk = qknorm_rope_eager(q0, k0, wq, wk, cache, pos, 128, False, 1e-6)
    assert torch.equal(qo, rq) and torch.equal(ko, rk)


def test_no_self_check_while_tracing(cpu_as_fused_platform, monkeypatch):
    calls = []
    real = dt._call
    monkeypatch.setattr(dt, "_call", lambda *a: (calls.append(1), real(*a))[1])
    q, k, wq, wk, cache, pos = inputs()

    def layer(q, k):
        return dt.apply_qk_norm_rope(q, k, wq, wk, cache, pos, eps=1e-6, is_neox=False)

    compiled = torch.compile(layer, fullgraph=True)
    q0, k0 = q.clone(), k.clone()
    qo, ko = compiled(q, k)
    # Unverified while tracing: the graph holds the eager chain, no check ran, nothing fused.
    sig = dt._signature(q, k, cache, torch.int64, 128, False, False)
    assert dt._QKNORM_ROPE_GATE.state(sig) == "unverified" and calls == []
    rq, rk = qknorm_rope_eager(q0, k0, wq, wk, cache, pos, 128, False, 1e-6)
    torch.testing.assert_close(qo, rq, atol=1e-2, rtol=1e-2)  # inductor may fuse the chain
    assert torch.equal(q, q0)


def test_verified_signature_compiles_to_the_fused_op(cpu_as_fused_platform, monkeypatch):
    monkeypatch.setattr(dt, "_self_check_reference", _run_fused_copy)  # an agreeing oracle
    q, k, wq, wk, cache, pos = inputs()
    dt.apply_qk_norm_rope(q.clone(), k.clone(), wq, wk, cache, pos, eps=1e-6, is_neox=False)  # verifies
    calls = []
    real = dt._call
    monkeypatch.setattr(dt, "_call", lambda *a: (calls.append(1), real(*a))[1])

    @torch.compile(fullgraph=True)
    def layer(q, k):
        qo, ko = dt.apply_qk_norm_rope(q, k, wq, wk, cache, pos, eps=1e-6, is_neox=False)
        return qo + 0, ko + 0

    q1, k1 = q.clone(), k.clone()
    qo, ko = layer(q1, k1)
    assert len(calls) == 1  # the fused custom op ran inside the compiled graph
    q2, k2 = q.clone(), k.clone()
    ditops.qknorm_rope(q2, k2, wq, wk, cache, pos)
    assert torch.equal(qo, q2) and torch.equal(ko, k2) and torch.equal(q1, q2)


def _run_fused_copy(q, k, wq, wk, cache, pos, R, neox, eps, full):
    q2, k2 = q.clone(), k.clone()
    ditops.qknorm_rope(q2, k2, wq, wk, cache, pos, is_neox=neox, eps=eps, rope_dim=R,
                       cache_full_width=full)
    return q2, k2


def test_helper_compiles_fullgraph_on_cpu():
    # The whole gate traces (env read, dtype/stride checks, capability constant).
    q, k, wq, wk, cache, pos = inputs()

    @torch.compile(fullgraph=True)
    def layer(q, k):
        return dt.apply_qk_norm_rope(q, k, wq, wk, cache, None, eps=1e-6, is_neox=True)

    qo, ko = layer(q, k)
    rq, rk = qknorm_rope_eager(q, k, wq, wk, cache, torch.arange(6), 128, True, 1e-6)
    torch.testing.assert_close(qo, rq, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ko, rk, atol=1e-2, rtol=1e-2)


def test_the_helper_takes_diffusers_rms_norm_chain(cpu_as_fused_platform, monkeypatch):
    # norm_order="aten_mean" with norm_weight_rounding="twice" (diffusers' RMSNorm) reaches the
    # fused op, the self-check's chain and the gate's signature; the default chain is another one.
    seen = []

    def agreeing_reference(q, k, wq, wk, cache, pos, R, neox, eps, full, **norm):
        seen.append(norm)
        q2, k2 = q.clone(), k.clone()
        ditops.qknorm_rope(q2, k2, wq, wk, cache, pos, is_neox=neox, eps=eps, rope_dim=R,
                           cache_full_width=full, **norm)
        return q2, k2
    monkeypatch.setattr(dt, "_self_check_reference", agreeing_reference)
    q, k, _, _, cache, pos = inputs(T=5, Hq=3, Hk=1, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    wq = (1 + 0.3 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    wk = (1 + 0.3 * torch.randn(128, generator=gen)).to(torch.bfloat16)
    diffusers_norm = dict(norm_order="aten_mean", norm_weight_rounding="twice")
    q_once, k_once = dt.apply_qk_norm_rope(q.clone(), k.clone(), wq, wk, cache, pos, eps=1e-6, is_neox=False)
    q_twice, k_twice = dt.apply_qk_norm_rope(q.clone(), k.clone(), wq, wk, cache, pos, eps=1e-6, is_neox=False,
                                             **diffusers_norm)
    assert seen == [{}, diffusers_norm]
    expect_q, expect_k = agreeing_reference(q, k, wq, wk, cache, pos, 128, False, 1e-6, False, **diffusers_norm)
    assert torch.equal(q_twice, expect_q) and torch.equal(k_twice, expect_k)
    assert not torch.equal(q_twice, q_once)  # the option is no no-op on weights other than 1
    sig = dt._signature(q, k, cache, torch.int64, 128, False, False, ("aten_mean", "twice"))
    assert dt._QKNORM_ROPE_GATE.state(sig) == "verified"
    # The eager path (allow_inplace=False) runs the same chain.
    eq, ek = dt.apply_qk_norm_rope(q.clone(), k.clone(), wq, wk, cache, pos, eps=1e-6, is_neox=False,
                                   allow_inplace=False, **diffusers_norm)
    ref_q, ref_k = qknorm_rope_eager(q, k, wq, wk, cache, pos, 128, False, 1e-6, **diffusers_norm)
    assert torch.equal(eq, ref_q) and torch.equal(ek, ref_k)
