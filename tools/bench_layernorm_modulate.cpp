// `ditops bench layernorm_modulate`: LayerNorm + modulate (bf16 and fp8 out) and per-head QK
// LayerNorm at the model shapes, cold L2, median of --reps runs, both row mappings beside the
// automatic choice, against a device copy of the same bytes measured in the same run.
// Byte model: x read once, out written once, the [B, D] scale/shift rows read once.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ditops/layernorm_modulate.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "reference/half.h"
#include "tools/bench_common.h"

namespace ditops::cli {

namespace {

struct LnCase {
  std::string name;
  int64_t B, S, D;
  bool shift;
};

std::vector<uint16_t> random_bf16(size_t n, float amplitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, amplitude);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = ref::float_to_bf16_rne(dist(rng));
  return v;
}

}  // namespace

int run_bench_layernorm_modulate(const Args& args) {
  if (!BenchRun::gpu_available("layernorm_modulate")) return kExitNoGpu;
  BenchRun run("layernorm_modulate", args);
  const Device dev{DeviceKind::cuda, 0};
  const std::vector<LnCase> cases = {
      {"FLUX.1 (1,4608,3072)", 1, 4608, 3072, true},
      {"Qwen-Image CFG (2,6912,3072)", 2, 6912, 3072, true},
      {"Wan (1,32760,5120)", 1, 32760, 5120, true},
      {"FLUX.1 text (1,512,3072)", 1, 512, 3072, true},
      {"GLM-Image (1,4096,4096)", 1, 4096, 4096, true},
      {"GLM-Image no shift (1,4096,4096)", 1, 4096, 4096, false},
  };
  for (const LnCase& c : cases) {
    const size_t n = static_cast<size_t>(c.B * c.S * c.D);
    DeviceBuffer x(n * 2), out(n * 2), mod(static_cast<size_t>(c.B * 6 * c.D) * 2);
    x.upload(random_bf16(n, 1.0f, 1).data());
    mod.upload(random_bf16(static_cast<size_t>(c.B * 6 * c.D), 0.3f, 2).data());
    const TensorView xv = TensorView::contiguous(x.get(), DType::bf16, dev, {c.B, c.S, c.D});
    const TensorView ov = TensorView::contiguous(out.get(), DType::bf16, dev, {c.B, c.S, c.D});
    TensorView scale = TensorView::contiguous(mod.get(), DType::bf16, dev, {c.B, c.D});
    scale.strides[0] = 6 * c.D;  // chunk(6) views of the adaLN projection
    TensorView shift;
    if (c.shift) {
      shift = scale;
      shift.data = static_cast<uint16_t*>(mod.get()) + c.D;
    }
    const int64_t bytes = 4 * static_cast<int64_t>(n) + (c.shift ? 4 : 2) * c.B * c.D;
    const std::string shape = shape_string({c.B, c.S, c.D});
    const double copy_us = run.copy_us(bytes);
    run.record(c.name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
    for (LnRowMapping m : {LnRowMapping::automatic, LnRowMapping::warp, LnRowMapping::cta}) {
      LayerNormModulateOptions o;
      o.mapping = m;
      const double us = run.time_us([&] { layernorm_modulate(xv, scale, shift, ov, o); });
      run.record(c.name, shape, std::string("ditops:jit:") + ln_row_mapping_name(m), kColdL2, us, bytes, copy_us);
    }
    if (c.B * c.S <= 512) {
      // Short calls: also timed over rotated buffer sets (BenchRun::rotated_us).
      const int sets = BenchRun::rotation_sets(bytes);
      std::vector<std::unique_ptr<DeviceBuffer>> xs, outs;
      for (int i = 0; i < sets; ++i) {
        xs.push_back(std::make_unique<DeviceBuffer>(n * 2));
        outs.push_back(std::make_unique<DeviceBuffer>(n * 2));
        jit::check_cu(jit::require_cuda_driver().cuMemcpyDtoD(xs.back()->ptr, x.ptr, n * 2), "cuMemcpyDtoD");
      }
      const double copy_rot = run.copy_rotated_us(bytes);
      run.record(c.name, shape, "device_copy", kRotatedGraph, copy_rot, bytes, copy_rot);
      const double us = run.rotated_us(sets, [&](int i, Stream stream) {
        layernorm_modulate(TensorView::contiguous(xs[i]->get(), DType::bf16, dev, {c.B, c.S, c.D}), scale, shift,
                           TensorView::contiguous(outs[i]->get(), DType::bf16, dev, {c.B, c.S, c.D}), {}, stream);
      });
      run.record(c.name, shape, "ditops:jit:automatic", kRotatedGraph, us, bytes, copy_rot);
    }
  }
  {
    // FLUX.2 fp8 producer: D = 6144, input_scale 0.03125.
    for (int64_t rows : {512, 4608}) {
      const int64_t D = 6144;
      const size_t n = static_cast<size_t>(rows * D);
      DeviceBuffer x(n * 2), out(n), mod(static_cast<size_t>(6 * D) * 2), scale_buf(4);
      x.upload(random_bf16(n, 1.0f, 3).data());
      mod.upload(random_bf16(static_cast<size_t>(6 * D), 0.3f, 4).data());
      const float input_scale = 0.03125f;
      scale_buf.upload(&input_scale);
      TensorView scale = TensorView::contiguous(mod.get(), DType::bf16, dev, {1, D});
      TensorView shift = scale;
      shift.data = static_cast<uint16_t*>(mod.get()) + D;
      const TensorView xv = TensorView::contiguous(x.get(), DType::bf16, dev, {1, rows, D});
      const TensorView ov = TensorView::contiguous(out.get(), DType::f8e4m3fn, dev, {1, rows, D});
      const TensorView sv = TensorView::contiguous(scale_buf.get(), DType::f32, dev, {1});
      const int64_t bytes = 3 * static_cast<int64_t>(n) + 4 * D;
      const std::string name = "FLUX.2 fp8 (" + std::to_string(rows) + " rows, D=6144)";
      const std::string shape = shape_string({1, rows, D});
      const double copy_us = run.copy_us(bytes);
      run.record(name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
      for (LnRowMapping m : {LnRowMapping::automatic, LnRowMapping::warp, LnRowMapping::cta}) {
        LayerNormModulateOptions o;
        o.mapping = m;
        const double us = run.time_us([&] { layernorm_modulate_fp8(xv, scale, shift, sv, ov, o); });
        run.record(name, shape, std::string("ditops:jit:fp8:") + ln_row_mapping_name(m), kColdL2, us, bytes, copy_us);
      }
    }
  }
  {
    // GLM-Image per-head QK LayerNorm (1, 4360, 32, 128), q and k out of place.
    const int64_t B = 1, S = 4360, H = 32, Dh = 128;
    const size_t n = static_cast<size_t>(B * S * H * Dh);
    DeviceBuffer q(n * 2), k(n * 2), qo(n * 2), ko(n * 2);
    q.upload(random_bf16(n, 2.0f, 5).data());
    k.upload(random_bf16(n, 2.0f, 6).data());
    auto view = [&](DeviceBuffer& b) { return TensorView::contiguous(b.get(), DType::bf16, dev, {B, S, H, Dh}); };
    const int64_t bytes = 8 * static_cast<int64_t>(n);
    const std::string name = "GLM-Image qk-head (1,4360,32,128)";
    const std::string shape = shape_string({B, S, H, Dh});
    const double copy_us = run.copy_us(bytes);
    run.record(name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
    const double us = run.time_us([&] { qk_head_layernorm(view(q), view(k), view(qo), view(ko)); });
    run.record(name, shape, "ditops:jit:qk_head", kColdL2, us, bytes, copy_us);
  }
  run.write_json();
  return 0;
}

const BenchRegistration kRegisteredLayerNormModulate("layernorm_modulate", run_bench_layernorm_modulate);

}  // namespace ditops::cli
