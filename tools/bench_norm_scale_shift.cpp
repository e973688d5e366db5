// `ditops bench norm_scale_shift`: cold L2, CUDA events, median; GB/s by the byte model (each
// input read once, each output written once; broadcast rows counted once) and the fraction of a
// device copy of the same bytes measured in the same run. Eager PyTorch and torch.compile are
// beside it in bench/norm_scale_shift_torch.py (same shapes).
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ditops/norm_scale_shift.h"
#include "jit/jit.h"
#include "reference/half.h"
#include "tools/bench_common.h"

namespace ditops::cli {

namespace {

struct NssBenchCase {
  const char* name;
  int64_t B, S, D;
};

const NssBenchCase kCases[] = {
    {"FLUX 1x4608x3072", 1, 4608, 3072},
    {"Qwen-Image CFG 2x6912x3072", 2, 6912, 3072},
    {"Wan 1x32760x5120", 1, 32760, 5120},
    {"512 tokens x3072", 1, 512, 3072},
};

enum class Variant { plain, residual, fp8, nvfp4 };
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::plain: return "LN+mod";
    case Variant::residual: return "residual+LN+mod";
    case Variant::fp8: return "LN+mod+fp8";
    case Variant::nvfp4: return "residual+LN+mod->nvfp4";
  }
  return "?";
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float amplitude) {
  std::normal_distribution<float> normal(0.0f, amplitude);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = ref::float_to_bf16_rne(normal(rng));
  return v;
}

// Fills dst with the first `bytes` of src (device to device).
void check_cu_copy(DeviceBuffer& dst, const DeviceBuffer& src, size_t bytes) {
  jit::check_cu(jit::require_cuda_driver().cuMemcpyDtoD(dst.ptr, src.ptr, bytes), "cuMemcpyDtoD");
}

}  // namespace

int run_bench_norm_scale_shift(const Args& args) {
  if (!BenchRun::gpu_available("norm_scale_shift")) return kExitNoGpu;
  BenchRun run("norm_scale_shift", args);
  const Device dev{DeviceKind::cuda, 0};
  std::mt19937 rng(3);
  for (const NssBenchCase& c : kCases) {
    const int64_t n = c.B * c.S * c.D, rows = c.B * c.S, padded = (rows + 127) / 128 * 128;
    DeviceBuffer x(n * 2), r(n * 2), y(n * 2), ro(n * 2), q(n), packed(n / 2), scales(padded * c.D / 16),
        mod(3 * c.B * c.D * 2), scalars(8);
    x.upload(random_bf16(n, rng, 1.0f).data());
    r.upload(random_bf16(n, rng, 1.0f).data());
    mod.upload(random_bf16(3 * c.B * c.D, rng, 0.2f).data());
    const float host_scalars[2] = {0.03125f, 0.625f};
    scalars.upload(host_scalars);
    auto rows_view = [&](void* p, DType dt) { return TensorView::contiguous(p, dt, dev, {c.B, c.S, c.D}); };
    // scale, shift, gate: [B, 1, D] rows of one adaLN projection buffer.
    auto mod_view = [&](int i) {
      return TensorView::contiguous(static_cast<char*>(mod.get()) + i * c.B * c.D * 2, DType::bf16, dev, {c.B, 1, c.D});
    };
    for (Variant v : {Variant::plain, Variant::residual, Variant::fp8, Variant::nvfp4}) {
      NormScaleShiftInputs in;
      NormScaleShiftOutputs out;
      in.x = rows_view(x.get(), DType::bf16);
      in.scale = mod_view(0);
      in.shift = mod_view(1);
      int64_t bytes = 2 * n + 2 * c.B * c.D * 2;  // x, scale, shift
      if (v != Variant::nvfp4) {
        out.y = rows_view(y.get(), DType::bf16);
        bytes += 2 * n;
      }
      if (v == Variant::residual || v == Variant::nvfp4) {
        in.residual = rows_view(r.get(), DType::bf16);
        in.gate = mod_view(2);
        out.residual_out = rows_view(ro.get(), DType::bf16);
        bytes += 4 * n + c.B * c.D * 2;
      }
      if (v == Variant::fp8) {
        in.input_scale = TensorView::contiguous(scalars.get(), DType::f32, dev, {1});
        out.fp8 = rows_view(q.get(), DType::f8e4m3fn);
        bytes += n;
      }
      if (v == Variant::nvfp4) {
        in.global_scale = TensorView::contiguous(static_cast<char*>(scalars.get()) + 4, DType::f32, dev, {1});
        out.nvfp4_packed = TensorView::contiguous(packed.get(), DType::u8, dev, {rows, c.D / 2});
        out.nvfp4_scales = TensorView::contiguous(scales.get(), DType::u8, dev, {padded, c.D / 16});
        bytes += n / 2 + padded * c.D / 16;
      }
      const double copy_us = run.copy_us(bytes);
      const std::string case_name = std::string(c.name) + " " + variant_name(v);
      const std::string shape = shape_string({c.B, c.S, c.D});
      run.record(case_name, shape, "device_copy", kColdL2, copy_us, bytes, copy_us);
      for (NssNumerics numerics : {NssNumerics::eager, NssNumerics::sglang}) {
        NormScaleShiftOptions o;
        o.numerics = numerics;
        o.dispatch.backend = Provenance::jit;
        try {
          const double us = run.time_us([&] { norm_scale_shift(in, out, o); });
          run.record(case_name, shape, std::string("ditops:jit:") + nss_numerics_name(numerics), kColdL2, us, bytes, copy_us);
        } catch (const Error& e) {
          std::printf("%s %s: %s\n", case_name.c_str(), nss_numerics_name(numerics), e.what());
        }
      }
      if (rows <= 512 && (v == Variant::plain || v == Variant::residual)) {
        // Short calls: also timed over rotated buffer sets (BenchRun::rotated_us).
        const int sets = BenchRun::rotation_sets(bytes);
        std::vector<std::unique_ptr<DeviceBuffer>> buffers;
        std::vector<std::pair<NormScaleShiftInputs, NormScaleShiftOutputs>> calls;
        for (int i = 0; i < sets; ++i) {
          NormScaleShiftInputs in_i = in;
          NormScaleShiftOutputs out_i = out;
          // Inputs get copies of x and residual; outputs are only written.
          for (const auto& [t, source] : {std::pair<TensorView*, const DeviceBuffer*>{&in_i.x, &x}, {&in_i.residual, &r},
                                          {&out_i.y, nullptr}, {&out_i.residual_out, nullptr}}) {
            if (!t->data) continue;
            buffers.push_back(std::make_unique<DeviceBuffer>(n * 2));
            if (source) check_cu_copy(*buffers.back(), *source, n * 2);
            t->data = buffers.back()->get();
          }
          calls.emplace_back(in_i, out_i);
        }
        const double copy_rot = run.copy_rotated_us(bytes);
        run.record(case_name, shape, "device_copy", kRotatedGraph, copy_rot, bytes, copy_rot);
        NormScaleShiftOptions o;
        o.dispatch.backend = Provenance::jit;
        const double us =
            run.rotated_us(sets, [&](int i, Stream stream) { norm_scale_shift(calls[i].first, calls[i].second, o, stream); });
        run.record(case_name, shape, "ditops:jit:eager", kRotatedGraph, us, bytes, copy_rot);
      }
    }
  }
  run.write_json();
  return 0;
}

const BenchRegistration kRegisteredNss("norm_scale_shift", run_bench_norm_scale_shift);

}  // namespace ditops::cli
