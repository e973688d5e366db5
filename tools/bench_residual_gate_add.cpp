// `ditops bench residual_gate_add`: the workloads of SGLang's A/B script (flux_text ... sana_transposed,
// bf16 and fp16), cold L2, median of --reps; GB/s by
// the byte model (residual, update and gate read once, out written once) and the fraction of a
// device-to-device copy of the same bytes measured in the same run.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ditops/residual_gate_add.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "reference/half.h"
#include "tools/bench_common.h"

namespace ditops::cli {

namespace {

using jit::check_cu;

struct RgaCase {
  std::string name;
  std::vector<int64_t> shape, gate;
  bool transposed;
  DType dtype;
};

std::vector<RgaCase> bench_cases() {
  std::vector<RgaCase> cases;
  const std::vector<RgaCase> base = {
      {"flux_text (1,512,3072) row", {1, 512, 3072}, {1, 1, 3072}, false, DType::bf16},
      {"flux_image (1,4096,3072) row", {1, 4096, 3072}, {1, 1, 3072}, false, DType::bf16},
      {"flux_joint (1,4608,3072) row", {1, 4608, 3072}, {1, 1, 3072}, false, DType::bf16},
      {"flux2_joint (1,4608,6144) row", {1, 4608, 6144}, {1, 1, 6144}, false, DType::bf16},
      {"qwen_cfg (2,6912,3072) batch", {2, 6912, 3072}, {2, 1, 3072}, false, DType::bf16},
      {"wan (1,32760,5120) row", {1, 32760, 5120}, {1, 1, 5120}, false, DType::bf16},
      {"ernie (1,4216,4096) row", {1, 4216, 4096}, {1, 1, 4096}, false, DType::bf16},
      {"full_gate (1,512,4096)", {1, 512, 4096}, {1, 512, 4096}, false, DType::bf16},
      {"per_token (1,2560,512)", {1, 2560, 512}, {1, 2560, 1}, false, DType::bf16},
      {"odd_width (2,33,65) row", {2, 33, 65}, {1, 1, 65}, false, DType::bf16},
      {"batch_gate (2,4096,3072)", {2, 4096, 3072}, {2, 1, 3072}, false, DType::bf16},
      {"sana_transposed (1,32760,2240)", {1, 32760, 2240}, {1, 1, 2240}, true, DType::bf16},
      {"transposed_small (1,17,65)", {1, 17, 65}, {1, 1, 65}, true, DType::bf16},
      {"transposed_medium (2,513,256)", {2, 513, 256}, {1, 1, 256}, true, DType::bf16},
  };
  for (const auto& c : base) cases.push_back(c);
  for (const auto& c : base)
    if (c.name.rfind("flux_image", 0) == 0 || c.name.rfind("flux_joint", 0) == 0 || c.name.rfind("sana", 0) == 0) {
      RgaCase f = c;
      f.name += " fp16";
      f.dtype = DType::f16;
      cases.push_back(f);
    }
  return cases;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

TensorView view_of(void* data, DType dtype, const std::vector<int64_t>& shape, bool transposed) {
  TensorView v = TensorView::contiguous(data, dtype, {DeviceKind::cuda, 0}, shape);
  if (transposed) {
    v.strides[0] = shape[1] * shape[2];
    v.strides[1] = 1;
    v.strides[2] = shape[1];
  }
  return v;
}

// Non-zero pseudo-random values in [-2, 2) (a cheap generator: 73M elements fill in well under a
// second); the timing does not depend on the values, only exactness tests do.
void upload_random(DeviceBuffer& buffer, DType dtype, int64_t count, uint32_t seed) {
  std::vector<uint8_t> host(buffer.bytes);
  uint32_t state = seed * 747796405u + 2891336453u;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) * 0x1p-22f;
    ref::store_act(host.data(), i, dtype, v == 0.0f ? 0.5f : v);
  }
  buffer.upload(host.data());
}

}  // namespace

int run_bench_residual_gate_add(const Args& args) {
  if (!BenchRun::gpu_available("residual_gate_add")) return kExitNoGpu;
  BenchRun run("residual_gate_add", args);
  for (const RgaCase& c : bench_cases()) {
    const int64_t n = product(c.shape), gn = product(c.gate);
    const size_t es = dtype_size(c.dtype);
    DeviceBuffer r(n * es), u(n * es), g(gn * es), o(n * es);
    upload_random(r, c.dtype, n, 1);
    upload_random(u, c.dtype, n, 2);
    upload_random(g, c.dtype, gn, 3);
    const int64_t bytes = static_cast<int64_t>((3 * n + gn) * es);
    const double copy_us = run.copy_us(bytes);
    const std::string shape = shape_string(c.shape);
    run.record(c.name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
    const TensorView rv = view_of(r.get(), c.dtype, c.shape, c.transposed), uv = view_of(u.get(), c.dtype, c.shape, false),
                     gv = view_of(g.get(), c.dtype, c.gate, false), ov = view_of(o.get(), c.dtype, c.shape, c.transposed);
    for (const KernelSpec* spec : Registry::global().list("residual_gate_add")) {
      if (spec->provenance == Provenance::reference) continue;
      ResidualGateAddOptions opt;
      opt.dispatch.backend = spec->provenance;
      const ResidualGateAddCall call = match_residual_gate_add(rv, uv, gv, ov, opt);
      const DispatchReport report = explain_residual_gate_add(call);
      if (!report.chosen) continue;
      const double us = run.time_us([&] { residual_gate_add(rv, uv, gv, ov, opt); });
      run.record(c.name, shape, "ditops:" + std::string(provenance_name(spec->provenance)) + " " + report.template_key,
                 kColdL2, us, bytes, copy_us);
    }
    if (!c.transposed && n <= 512 * 4096) {
      // Short calls: also timed over rotated buffer sets (BenchRun::rotated_us).
      const int sets = BenchRun::rotation_sets(bytes);
      std::vector<std::unique_ptr<DeviceBuffer>> rs, us_, os;
      for (int i = 0; i < sets; ++i) {
        rs.push_back(std::make_unique<DeviceBuffer>(n * es));
        us_.push_back(std::make_unique<DeviceBuffer>(n * es));
        os.push_back(std::make_unique<DeviceBuffer>(n * es));
        upload_random(*rs.back(), c.dtype, n, 1);
        upload_random(*us_.back(), c.dtype, n, 2);
      }
      const double copy_rot = run.copy_rotated_us(bytes);
      run.record(c.name, shape, "device_copy", kRotatedGraph, copy_rot, bytes, copy_rot);
      const double us = run.rotated_us(sets, [&](int i, Stream stream) {
        residual_gate_add(view_of(rs[i]->get(), c.dtype, c.shape, false), view_of(us_[i]->get(), c.dtype, c.shape, false),
                          gv, view_of(os[i]->get(), c.dtype, c.shape, false), {}, stream);
      });
      run.record(c.name, shape, "ditops:jit", kRotatedGraph, us, bytes, copy_rot);
    }
  }
  {
    // Host cost of one call through the facade (matching, dispatch, launch) on a tiny problem.
    const std::vector<int64_t> shape = {1, 4, 64}, gshape = {1, 1, 64};
    DeviceBuffer r(256 * 2), u(256 * 2), g(64 * 2), o(256 * 2);
    const TensorView rv = view_of(r.get(), DType::bf16, shape, false), uv = view_of(u.get(), DType::bf16, shape, false),
                     gv = view_of(g.get(), DType::bf16, gshape, false), ov = view_of(o.get(), DType::bf16, shape, false);
    for (int i = 0; i < 200; ++i) residual_gate_add(rv, uv, gv, ov);
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    const int calls = 5000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) residual_gate_add(rv, uv, gv, ov);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    run.record_time("host overhead per call (match + dispatch + launch)", shape_string(shape), "ditops:c++ facade", us);
  }
  run.write_json();
  return 0;
}

const BenchRegistration kRegistered("residual_gate_add", run_bench_residual_gate_add);

}  // namespace ditops::cli
