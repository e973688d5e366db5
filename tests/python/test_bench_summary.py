"""bench/summary.py, the one-screen summary that ends `scripts/device_run.sh verify`, on a fixture
of what a GPU run writes (tests/python/fixtures/device_run: a ctest log, pytest's JUnit XML, torch
check records, `ditops bench` records)."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "device_run")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import summary  # noqa: E402

OPS = ["qknorm_rope", "residual_gate_add", "layernorm_modulate", "layernorm_modulate_fp8", "norm_scale_shift",
       "fp8_linear", "fp8_static_quant"]


def rows(text):
    """{op: the row's fields} of a summary."""
    out = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if fields and (fields[0] in OPS or fields[0] == "(other)"):
            out[fields[0]] = fields
    return out


def test_tests_are_counted_per_op_and_skips_left_out():
    r = rows(summary.summarize(FIXTURE, OPS))
    # qknorm_rope: a GPU test, a hostile-input test, a pytest case; the skipped GPU test is no count.
    assert r["qknorm_rope"][1] == "3/0"
    assert r["norm_scale_shift"][1] == "1/0"  # NssJit; its pytest case was skipped
    assert r["residual_gate_add"][1] == "2/0"  # ResidualGateAddGpu and the rga_ compile case
    assert r["layernorm_modulate"][1] == "2/0"  # ln_mod_ is layernorm_modulate, not the fp8 one
    assert r["layernorm_modulate_fp8"][1] == "2/0"
    assert r["fp8_linear"][1] == "0/2"  # a failure and a timeout
    # The rest; python_pytest's own ctest line is replaced by its tests from the XML.
    assert r["(other)"][1] == "3/1"


def test_failures_are_named():
    text = summary.summarize(FIXTURE, OPS)
    failed = [line for line in text.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and failed[0].startswith("failed (3): ")
    assert "driver/ops.every_case_against_the_reference/fp8_linear (Timeout)" in failed[0]
    assert "test_torch_gpu::test_host_overhead_per_call (failure)" in failed[0]
    assert "python_pytest" not in failed[0]


def test_torch_equal_and_other_checks():
    r = rows(summary.summarize(FIXTURE, OPS))
    # bit_exact: 2 of 3 cases equal; close (kernels.json): 1 of 3 within its bound (a close record
    # without a bound check does not pass); graph and stream checks.
    assert r["qknorm_rope"][2:5] == ["2/3", "1/3", "2/2"]
    assert r["layernorm_modulate"][2:5] == ["-", "-", "3/3"]
    assert r["fp8_static_quant"][2] == "1/1"  # a record's own op wins over its file's
    # A record with beyond_bound is a close check (no output beyond the fp64 bound), the graph one a check.
    assert r["fp8_linear"][2:5] == ["-", "1/1", "1/1"]


def test_compile_against_eager_is_no_check_and_beyond_bound_fails_when_nonzero(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "run")
    path = tmp_path / "run" / "torch" / "verify_fp8_linear_checks.json"
    records = summary.json.load(open(path))
    records.append({"kind": "compile_vs_eager", "op": "fp8_linear", "torch_equal": False})
    records.append({"kind": "verify", "op": "fp8_linear", "impl": "jit", "beyond_bound": 3})
    summary.json.dump(records, open(path, "w"))
    r = rows(summary.summarize(str(tmp_path / "run"), OPS))
    assert r["fp8_linear"][2:5] == ["-", "1/2", "1/1"]


def test_close_records_are_told_apart_without_kernels_json(tmp_path):
    shutil.copytree(os.path.join(FIXTURE, "torch"), tmp_path / "torch")
    r = rows(summary.summarize(str(tmp_path), OPS))
    # Only `within_bound` says close; the unchecked aot_fp32 record reads as a failed torch.equal.
    assert r["qknorm_rope"][2:4] == ["2/4", "1/2"]


def test_fastest_implementation_and_its_roof():
    best = summary.fastest(summary.json.load(open(os.path.join(FIXTURE, "bench_cpp.json"))))
    # The largest case of qknorm_rope (not the first: the small one is; cold L2 only there), the
    # copy and host records left out.
    case, _, impl, method, us, fraction, roof = best["qknorm_rope"]
    assert (case, impl, method, us, fraction, roof) == (
        "FLUX.1 1024px (4608 tok, 24h)", "ditops:jit", "cold_l2", 21.9, 0.9178, "copy")
    # Rotated graphs where timed; the template key after the implementation's name is dropped.
    _, _, impl, method, us, _, _ = best["residual_gate_add"]
    assert (impl, method, us) == ("ditops:jit", "rotated_graph", 20.99)
    # A GEMV: the read roof, not the read_roof record itself.
    _, _, impl, _, us, fraction, roof = best["fp8_linear"]
    assert (impl, us, fraction, roof) == ("fp8_linear.cublaslt", 12.85, 0.7541, "read roof")
    text = summary.summarize(FIXTURE, OPS)
    assert "fp8_linear.cublaslt 12.85 us 0.75 read (rotated; table M=2 N=8192 K=5120)" in text
    assert "ditops:jit 21.90 us 0.92 copy (cold L2; FLUX.1 1024px (4608 tok,)" in text
    assert max(len(line) for line in text.splitlines() if not line.startswith(("failed", "slowest"))) <= 140


def test_missing_inputs_are_named(tmp_path):
    shutil.copy(os.path.join(FIXTURE, "ctest.log"), tmp_path / "ctest.log")
    text = summary.summarize(str(tmp_path), OPS)
    assert f"missing or empty in {tmp_path}: pytest.xml, torch checks, bench_cpp.json" in text
    # Without the XML, python_pytest counts as one (failed) test of its own.
    assert rows(text)["(other)"][1] == "2/1"
    assert "python_pytest (Failed)" in text


def test_the_slowest_tests_are_named():
    text = summary.summarize(FIXTURE, OPS)
    assert ("slowest ctest: driver/ops.every_case_against_the_reference/fp8_linear 207.1 s, "
            "Fp8LinearGpu.EveryImplementationWithinTheContractAndRunToRunIdentical 71.0 s, "
            "driver/ops.every_case_against_the_reference/layernorm_modulate_fp8 12.4 s, NssJit.EveryBroadcastClass 3.1 s"
            ) in text  # python_pytest's own line is left out: the XML has its tests
    assert "slowest pytest: test_torch_gpu::test_adaln_op_compile_fullgraph[rga_row_fp16] 3.0 s" in text


def test_op_of():
    assert summary.op_of("HostileQkNormRope.X", OPS) == "qknorm_rope"
    assert summary.op_of("NssBroadcast.Scalar", OPS) == "norm_scale_shift"
    assert summary.op_of("test_fallback.py::test_x[layernorm_modulate_fp8]", OPS) == "layernorm_modulate_fp8"
    assert summary.op_of("test_torch_gpu::test_adaln[ln_mod_fp8]", OPS) == "layernorm_modulate_fp8"
    assert summary.op_of("test_torch_gpu::test_adaln[ln_mod]", OPS) == "layernorm_modulate"
    assert summary.op_of("CubinCache.Corruption", OPS) is None
    assert summary.op_of("Transgression.X", OPS) is None  # "rga" inside a word is no abbreviation


def test_command_line():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "summary.py"), FIXTURE, "--ops", ",".join(OPS)],
                         capture_output=True, text=True, check=True).stdout
    assert out == summary.summarize(FIXTURE, OPS)
