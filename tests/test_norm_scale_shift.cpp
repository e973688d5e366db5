// norm_scale_shift beyond its driver cases (tests/cases/norm_scale_shift_cases.cpp: every broadcast
// class, norm, numerics, affine, residual, quantized output, Wan's float32 chains, overlaps and
// invalid inputs against the residual, float64 and quantization oracles and the reference): what a
// case cannot express. The E4M3/E2M1 converters (exhaustive over bf16 inputs and every midpoint,
// against a nearest-value search written here) and the NVFP4 128x4 swizzle, which the
// quantization oracle uses; the matcher's classes; the eager modulation's rounding steps from the
// reference's own statistics, exactly; explain; the kernel keys, their schedules, and NVRTC
// compiling them for sm_90a, sm_100a and sm_120a (skipped where NVRTC is missing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/op.h"
#include "jit/jit.h"
#include "jit/nvrtc.h"
#include "kernels/norm_scale_shift.cuh"
#include "ops/norm_scale_shift/norm_scale_shift_kernels.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops {
namespace {

const Device kCpu{DeviceKind::cpu, 0};

// ------------------------------------------------------------------ converters

// Nearest representable magnitude by search; ties to the even code; beyond the max: the max.
uint8_t nearest_code(double a, const std::vector<double>& magnitudes) {
  if (a >= magnitudes.back()) return static_cast<uint8_t>(magnitudes.size() - 1);  // saturate
  size_t best = 0;
  for (size_t c = 1; c < magnitudes.size(); ++c) {
    const double d = std::fabs(a - magnitudes[c]), db = std::fabs(a - magnitudes[best]);
    if (d < db || (d == db && (c % 2 == 0) && (best % 2 == 1))) best = c;
  }
  return static_cast<uint8_t>(best);
}

std::vector<double> e4m3_magnitudes() {  // codes 0..126 (127 is NaN)
  std::vector<double> m;
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, f = c & 7;
    m.push_back(e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10));
  }
  return m;
}

std::vector<double> e2m1_magnitudes() { return {0, 0.5, 1, 1.5, 2, 3, 4, 6}; }

// Every bf16 value, every midpoint between neighbouring codes and the floats next to it.
std::vector<float> probe_values(const std::vector<double>& magnitudes) {
  std::vector<float> v;
  for (uint32_t b = 0; b < 65536; ++b) v.push_back(ref::bf16_to_float(static_cast<uint16_t>(b)));
  for (size_t c = 0; c + 1 < magnitudes.size(); ++c) {
    const float mid = static_cast<float>((magnitudes[c] + magnitudes[c + 1]) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  const float top = static_cast<float>(magnitudes.back());
  for (float x : {top, std::nextafter(top, 1e30f), top * 1.04f, top * 1.1f, INFINITY}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

TEST(NssConverters, E4m3MatchesNearestValueSearchEverywhere) {
  const auto mags = e4m3_magnitudes();
  int64_t checked = 0;
  for (float x : probe_values(mags)) {
    const uint8_t got = ref::float_to_e4m3_satfinite(x);
    if (std::isnan(x)) {
      EXPECT_EQ(got & 0x7F, 0x7F) << x;
      continue;
    }
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const uint8_t want = static_cast<uint8_t>(sign | nearest_code(std::fabs(static_cast<double>(x)), mags));
    ASSERT_EQ(got, want) << "x=" << x;
    ++checked;
  }
  EXPECT_GT(checked, 65000);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(ref::float_to_e4m3_satfinite(ref::e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(ref::float_to_e4m3_satfinite(464.0f), 0x7E);   // saturates rather than NaN
  EXPECT_EQ(ref::float_to_e4m3_satfinite(-1e9f), 0xFE);
  EXPECT_EQ(ref::float_to_e4m3_satfinite(0x1p-10f), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(ref::float_to_e4m3_satfinite(0x1.8p-9f), 0x02);  // tie 1.5 * 2^-9 -> 2 * 2^-9
}

TEST(NssConverters, E2m1MatchesNearestValueSearchEverywhere) {
  const auto mags = e2m1_magnitudes();
  for (float x : probe_values(mags)) {
    if (std::isnan(x)) continue;
    const uint8_t sign = std::signbit(x) ? 8 : 0;
    const uint8_t want = static_cast<uint8_t>(sign | nearest_code(std::fabs(static_cast<double>(x)), mags));
    ASSERT_EQ(ref::float_to_e2m1_satfinite(x), want) << "x=" << x;
  }
  // The ties spelled out (round half to even code).
  const std::pair<float, float> ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}};
  for (auto [x, v] : ties) EXPECT_EQ(ref::e2m1_to_float(ref::float_to_e2m1_satfinite(x)), v) << x;
  EXPECT_EQ(ref::float_to_e2m1_satfinite(-0.1f), 0x8);  // the sign survives a round to zero
  EXPECT_EQ(ref::float_to_e2m1_satfinite(1e30f), 0x7);
}

// ------------------------------------------------------------------ swizzle

TEST(NssSwizzle, OffsetsFollowThe128x4LayoutAndCoverThePaddedTensor) {
  // Hand-computed anchors for 192 scale columns (D = 3072).
  EXPECT_EQ(nvfp4_scale_offset(0, 0, 192), 0);
  EXPECT_EQ(nvfp4_scale_offset(0, 1, 192), 1);
  EXPECT_EQ(nvfp4_scale_offset(0, 4, 192), 512);
  EXPECT_EQ(nvfp4_scale_offset(1, 0, 192), 16);
  EXPECT_EQ(nvfp4_scale_offset(32, 0, 192), 4);
  EXPECT_EQ(nvfp4_scale_offset(127, 191, 192), 47 * 512 + 31 * 16 + 3 * 4 + 3);
  EXPECT_EQ(nvfp4_scale_offset(128, 0, 192), 48 * 512);
  for (int64_t cols : {4, 8, 192, 320}) {
    for (int64_t rows : {1, 127, 128, 130, 300}) {
      const int64_t padded = (rows + 127) / 128 * 128;
      std::set<int64_t> seen;
      for (int64_t m = 0; m < padded; ++m)
        for (int64_t k = 0; k < cols; ++k) {
          const int64_t o = nvfp4_scale_offset(m, k, cols);
          ASSERT_GE(o, 0);
          ASSERT_LT(o, padded * cols);
          // 512-byte tiles: rows 32 apart interleave by 4 bytes, 4 columns are adjacent bytes.
          ASSERT_EQ(o % 4, k % 4);
          seen.insert(o);
        }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), padded * cols) << "cols " << cols << " rows " << rows;
    }
  }
}

// ------------------------------------------------------------------ problem builder

struct Buf {
  std::vector<uint8_t> bytes;
  TensorView view;
  Buf() = default;
  Buf(DType dt, std::vector<int64_t> shape, size_t extra_bytes = 0) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    bytes.assign(static_cast<size_t>(n) * dtype_size(dt) + extra_bytes + 64, 0);
    view = TensorView::contiguous(bytes.data(), dt, kCpu, shape);
  }
  float get(int64_t i) const { return ref::load_act(view.data, i, view.dtype); }
  void set(int64_t i, float v) { ref::store_act(view.data, i, view.dtype, v); }
  int64_t numel() const { return view.numel(); }
};

void fill_random(Buf& b, std::mt19937& rng, float amplitude, float offset = 0.0f) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, offset + amplitude * n(rng));
}

float y_at(const Buf& y, int64_t i) { return y.get(i); }

// ------------------------------------------------------------------ broadcast classes

struct Problem {
  int64_t B = 2, S = 6, D = 64;
  DType dt = DType::bf16;
  Buf x, y;
  Problem(int64_t b, int64_t s, int64_t d, DType t, uint32_t seed, float amp = 1.0f)
      : B(b), S(s), D(d), dt(t), x(t, {b, s, d}), y(t, {b, s, d}) {
    std::mt19937 rng(seed);
    fill_random(x, rng, amp, 0.3f * amp);
  }
};

TEST(NssBroadcast, MatchedClassesAreReported) {
  Problem p(2, 6, 64, DType::bf16, 1);
  Buf a(DType::bf16, {2, 3, 1, 64}), c(DType::bf16, {64}), t(DType::bf16, {1, 6, 64});
  NormScaleShiftInputs in;
  in.x = p.x.view;
  in.scale = a.view;
  in.shift = t.view;
  NormScaleShiftOutputs out;
  out.y = p.y.view;
  auto call = match_norm_scale_shift(in, out, {});
  EXPECT_EQ(call.scale.kind, NssOperand::Kind::frame);
  EXPECT_EQ(call.scale.frame_len, 2);
  EXPECT_EQ(call.scale.frame_stride, 64);
  EXPECT_EQ(call.shift.kind, NssOperand::Kind::token);
  EXPECT_EQ(call.shift.batch_stride, 0);
  in.scale = c.view;
  EXPECT_EQ(match_norm_scale_shift(in, out, {}).scale.kind, NssOperand::Kind::channel);
}

// ------------------------------------------------------------------ the eager modulation

// Affine and modulation follow the eager op-by-op rounding (checked by recomputation from the
// statistics the reference's own LayerNorm produces with scale 0).
TEST(NssStatistics, EagerModulationRoundsEachOp) {
  const int64_t D = 128;
  Problem p(1, 3, D, DType::bf16, 3);
  std::mt19937 rng(9);
  Buf zero(DType::bf16, {D}), scale(DType::bf16, {D}), shift(DType::bf16, {D}), w(DType::bf16, {D}),
      b(DType::bf16, {D}), norm_only(DType::bf16, {1, 3, D});
  fill_random(scale, rng, 0.5f);
  fill_random(shift, rng, 0.5f);
  fill_random(w, rng, 0.3f, 1.0f);
  fill_random(b, rng, 0.1f);
  NormScaleShiftInputs in;
  in.x = p.x.view;
  in.scale = scale.view;
  in.shift = shift.view;
  in.weight = w.view;
  in.bias = b.view;
  NormScaleShiftOutputs out;
  out.y = p.y.view;
  norm_scale_shift(in, out, {});
  // LayerNorm alone gives rne(rstd*(x-mean)); affine uses the unrounded product, so compare the
  // modulation step only where the affine is the identity: run again with w = 1, b = 0.
  for (int64_t c = 0; c < D; ++c) {
    w.set(c, 1.0f);
    b.set(c, 0.0f);
  }
  norm_scale_shift(in, out, {});
  in.scale = zero.view;
  in.shift = TensorView{};
  in.weight = TensorView{};
  in.bias = TensorView{};
  out.y = norm_only.view;
  norm_scale_shift(in, out, {});
  for (int64_t i = 0; i < 3 * D; ++i) {
    const int64_t c = i % D;
    const float y0 = norm_only.get(i);
    const float op = ref::round_to(DType::bf16, 1.0f + scale.get(c));
    const float y1 = ref::round_to(DType::bf16, y0 * op);
    ASSERT_EQ(p.y.get(i), ref::round_to(DType::bf16, y1 + shift.get(c))) << i;
  }
}

// ------------------------------------------------------------------ matching

TEST(NssMatching, ExplainChoosesTheReferenceOnTheCpu) {
  Problem p(1, 4, 64, DType::bf16, 1);
  Buf s(DType::bf16, {64});
  NormScaleShiftInputs in;
  in.x = p.x.view;
  in.scale = s.view;
  NormScaleShiftOutputs out;
  out.y = p.y.view;
  const auto report = explain_norm_scale_shift(match_norm_scale_shift(in, out, {}));
  ASSERT_NE(report.chosen, nullptr);
  EXPECT_EQ(report.chosen->name, "norm_scale_shift.reference");
  bool saw_jit = false;
  for (const auto& cand : report.candidates)
    if (cand.name == "norm_scale_shift.jit") {
      saw_jit = true;
      EXPECT_FALSE(cand.eligible);
    }
  EXPECT_TRUE(saw_jit);
  EXPECT_NE(report.format().find("norm_scale_shift.reference"), std::string::npos);
}

// The fp8_rowwise output through the C++ facade, where no binding adds the missing half of the pair:
// both tensors or an error; its kernel key and template argument (kQuant 4); on a simulated sm_90
// the rowwise implementation takes the call and the others refuse it, and the other way round.
TEST(NssMatching, Fp8RowwiseNeedsBothOutputsAndHasAnImplementationOfItsOwn) {
  Problem p(2, 3, 64, DType::bf16, 1);
  Buf s(DType::f32, {2, 1, 64}), q(DType::f8e4m3fn, {2, 3, 64}), sc(DType::f32, {2, 3, 1});
  NormScaleShiftInputs in;
  in.x = p.x.view;
  in.scale = s.view;
  NormScaleShiftOutputs out;
  out.fp8_rowwise = q.view;
  NormScaleShiftOptions opt;
  opt.numerics = NssNumerics::float32;
  try {
    match_norm_scale_shift(in, out, opt);
    ADD_FAILURE() << "fp8_rowwise without fp8_scale accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_rowwise needs both fp8_rowwise and fp8_scale"), std::string::npos)
        << e.what();
  }
  out.fp8_rowwise = {};
  out.fp8_scale = sc.view;
  EXPECT_THROW(match_norm_scale_shift(in, out, opt), Error);
  out.fp8_rowwise = q.view;
  const NormScaleShiftCall call = match_norm_scale_shift(in, out, opt);
  EXPECT_EQ(call.quant, NssQuant::fp8_rowwise);
  EXPECT_FALSE(call.store_y);
  EXPECT_EQ(norm_scale_shift(in, out, opt), "norm_scale_shift.reference");
  EXPECT_GT(sc.get(0), 0.0f) << "no scale written";
  NssKernelKey key;
  key.numerics = NssNumerics::float32;
  key.dim = 5120;
  key.quant = NssKernelQuant::fp8_rowwise;
  EXPECT_NE(key.to_string().find("float32,plain,affine=0,fp8_rowwise,pdl"), std::string::npos) << key.to_string();
  NssKernelKey fp8 = key;
  fp8.quant = NssKernelQuant::fp8;
  EXPECT_NE(key.packed(), fp8.packed());
  const std::string args = nss_kernel_request(key).template_args;
  EXPECT_NE(args.find(", 0, 4, true,"), std::string::npos) << args;  // affine 0, kQuant 4, pdl

  // Dispatch on a simulated sm_90 (CUDA views never read).
  const OpDescription& d = op("norm_scale_shift");
  const Device dev{DeviceKind::cuda, 0};
  uintptr_t next = uintptr_t{1} << 40;
  GenericCall c = generic_call(d);
  const auto set = [&](const char* name, DType dt, std::vector<int64_t> shape) {
    const TensorView v = TensorView::contiguous(reinterpret_cast<void*>(next), dt, dev, shape);
    next += (static_cast<uintptr_t>(v.span_bytes()) + 4095) / 4096 * 4096;
    c.tensors[d.tensor_index(name)] = v;
    c.given[d.tensor_index(name)] = true;
  };
  set("x", DType::bf16, {1, 8, 5120});
  set("scale", DType::f32, {1, 1, 5120});
  set("shift", DType::f32, {1, 1, 5120});
  set("fp8_rowwise", DType::f8e4m3fn, {1, 8, 5120});
  set("fp8_scale", DType::f32, {1, 8, 1});
  c.options[d.option_index("numerics")] = std::string("float32");
  const DeviceInfo sm90 = simulated_device_info(dev, 90, 132);
  const auto reason = [](const DispatchReport& r, const std::string& name) {
    for (const CandidateReport& cand : r.candidates)
      if (cand.name == name) return cand.reason;
    return std::string("absent");
  };
  DispatchReport r = explain("norm_scale_shift", c, sm90);
  ASSERT_NE(r.chosen, nullptr) << r.format();
  EXPECT_EQ(r.chosen->name, "norm_scale_shift.jit_fp8_rowwise") << r.format();
  EXPECT_NE(reason(r, "norm_scale_shift.jit_float32").find("is norm_scale_shift.jit_fp8_rowwise's"), std::string::npos)
      << r.format();
  c.given[d.tensor_index("fp8_rowwise")] = c.given[d.tensor_index("fp8_scale")] = false;
  c.tensors[d.tensor_index("fp8_rowwise")] = c.tensors[d.tensor_index("fp8_scale")] = TensorView{};
  set("y", DType::bf16, {1, 8, 5120});
  r = explain("norm_scale_shift", c, sm90);
  ASSERT_NE(r.chosen, nullptr) << r.format();
  EXPECT_EQ(r.chosen->name, "norm_scale_shift.jit_float32") << r.format();
  EXPECT_NE(reason(r, "norm_scale_shift.jit_fp8_rowwise").find("the fp8_rowwise output only"), std::string::npos)
      << r.format();
}

// ------------------------------------------------------------------ NVRTC

std::vector<NssKernelKey> compile_keys(bool hardware_fp4) {
  std::vector<NssKernelKey> keys;
  auto add = [&](NssKernelKey k) { keys.push_back(k); };
  NssKernelKey k;  // bf16, 3072, layer, eager
  add(k);
  k.residual = true;
  k.quant = NssKernelQuant::fp8;
  add(k);
  k.quant = hardware_fp4 ? NssKernelQuant::fp4_hardware : NssKernelQuant::fp4_software;
  add(k);
  k.numerics = NssNumerics::sglang;
  add(k);
  k.quant = NssKernelQuant::fp8;
  add(k);
  NssKernelKey r;
  r.norm = NormType::rms;
  r.affine = 1;
  r.dim = 5120;
  add(r);  // 10 plain slots: operands in shared memory, prefetch
  r.residual = true;
  r.quant = hardware_fp4 ? NssKernelQuant::fp4_hardware : NssKernelQuant::fp4_software;
  add(r);  // 10 nvfp4 slots: operands in shared memory
  NssKernelKey a;
  a.act = DType::f16;
  a.affine = 2;
  a.dim = 2240;
  a.pdl = false;
  add(a);
  NssKernelKey f;
  f.act = DType::f32;
  f.dim = 4096;
  f.residual = true;
  add(f);
  NssKernelKey wide;  // 10 slots with the residual: the prefetching schedule
  wide.dim = 5120;
  wide.residual = true;
  add(wide);
  NssKernelKey split;  // 6 residual slots: a row over 256 threads (LayerNorm, RMSNorm with affine)
  split.residual = true;
  add(split);
  split.norm = NormType::rms;
  split.affine = 2;
  add(split);
  NssKernelKey small;
  small.dim = 64;
  small.quant = NssKernelQuant::fp4_software;
  add(small);
  return keys;
}

TEST(NssJit, KernelKeysCompileForEveryTargetArch) {
  if (jit::nvrtc_version() == 0) GTEST_SKIP() << "NVRTC not loadable here";
  int compiled = 0;
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
    const bool hw = std::string(arch) != "sm_90a";
    for (const auto& key : compile_keys(hw)) {
      std::vector<uint8_t> cubin;
      ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(nss_kernel_request(key), "e"), "nss.cu", arch,
                                                 jit::embedded_sources()))
          << key.to_string() << " for " << arch;
      ASSERT_GT(cubin.size(), 1000u);
      ++compiled;
    }
  }
  std::printf("compiled %d (key, arch) pairs\n", compiled);
}

// The eager kernel's persistent CTAs find each row's (batch, token) by adding the grid step to the
// previous row's, not by dividing (kernels/norm_scale_shift.cuh): every row a CTA visits must
// get row / S and row % S, also where a step crosses one or many batches (the GPU grids have too
// few rows for a CTA to take a second row of another batch).
TEST(NssJit, RowPositionsAdvancedByTheStepEqualDivision) {
  int checked = 0;
  for (long long seq : {1LL, 2LL, 7LL, 9LL, 33LL, 257LL, 1031LL, 4608LL, 6912LL, 32760LL})
    for (long long step : {1LL, 5LL, 9LL, 132LL, 516LL, 768LL, 922LL, 924LL, 13829LL}) {
      const RowPosition stride = row_position(step, seq);
      for (long long first : {0LL, 1LL, step / 2, step - 1}) {
        const long long rows = 2 * seq + 5 * step + 3;
        RowPosition at = row_position(first, seq);
        for (long long row = first; row < rows; row += step) {
          ASSERT_EQ(at.b, row / seq) << "S " << seq << " step " << step << " row " << row;
          ASSERT_EQ(at.s, row % seq) << "S " << seq << " step " << step << " row " << row;
          at = advance_row_position(at, stride, seq);
          ++checked;
        }
      }
    }
  // row_position itself: rows of the first two batches skip the division, later rows divide.
  for (long long seq : {1LL, 2LL, 7LL, 512LL, 4608LL})
    for (long long row = 0; row < 3 * seq + 3; ++row) {
      const RowPosition at = row_position(row, seq);
      ASSERT_EQ(at.b, row / seq) << "S " << seq << " row " << row;
      ASSERT_EQ(at.s, row % seq) << "S " << seq << " row " << row;
      ++checked;
    }
  EXPECT_GT(checked, 1000);
}

// The eager kernel's persistent-loop knobs follow the measured rules (norm_scale_shift_op.cpp)
// and reach the request: prefetch, shared operands and split as the last template arguments, the
// launch bounds' block size and minimum.
TEST(NssJit, EagerScheduleFollowsTheMeasuredRules) {
  NssKernelKey k;  // bf16 D=3072: 6 slots
  k.residual = true;  // residual rows: split over 256 threads, 4 CTAs (runs 50-51)
  NssEagerSchedule s = nss_eager_schedule(k);
  EXPECT_FALSE(s.prefetch);
  EXPECT_EQ(s.split, 2);
  EXPECT_EQ(s.min_blocks, 4);
  KernelRequest r = nss_kernel_request(k);
  EXPECT_EQ(r.max_threads, 256);
  EXPECT_EQ(r.min_blocks, 4);
  EXPECT_EQ(r.template_args.substr(r.template_args.size() - 17), ", false, false, 2") << r.template_args;
  k.residual = false;  // plain rows: 128 threads, 7
  s = nss_eager_schedule(k);
  EXPECT_EQ(s.split, 1);
  EXPECT_EQ(s.min_blocks, 7);
  EXPECT_EQ(nss_kernel_request(k).max_threads, 128);
  k.residual = true;
  k.quant = NssKernelQuant::fp8;  // quantizing keys keep 6, unsplit
  EXPECT_EQ(nss_eager_schedule(k).min_blocks, 6);
  EXPECT_EQ(nss_eager_schedule(k).split, 1);
  k.quant = NssKernelQuant::fp4_software;  // issue-bound nvfp4 rows: 5 (run 38); split lost (runs 50-51)
  EXPECT_EQ(nss_eager_schedule(k).min_blocks, 5);
  EXPECT_FALSE(nss_eager_schedule(k).shared_operands);
  EXPECT_EQ(nss_eager_schedule(k).split, 1);
  k.dim = 5120;  // 10 nvfp4 slots: operands in shared memory, no prefetch, 5 (run 46)
  s = nss_eager_schedule(k);
  EXPECT_FALSE(s.prefetch);
  EXPECT_TRUE(s.shared_operands);
  EXPECT_EQ(s.min_blocks, 5);
  k.quant = NssKernelQuant::none;  // 10 residual slots: prefetch, 3, operands in registers
  s = nss_eager_schedule(k);
  EXPECT_TRUE(s.prefetch);
  EXPECT_FALSE(s.shared_operands);
  EXPECT_EQ(s.min_blocks, 3);
  r = nss_kernel_request(k);
  EXPECT_EQ(r.min_blocks, 3);
  EXPECT_EQ(r.template_args.substr(r.template_args.size() - 16), ", true, false, 1") << r.template_args;
  k.residual = false;  // 10 plain slots: shared memory and prefetch, 5
  s = nss_eager_schedule(k);
  EXPECT_TRUE(s.prefetch);
  EXPECT_TRUE(s.shared_operands);
  EXPECT_EQ(s.min_blocks, 5);
  r = nss_kernel_request(k);
  EXPECT_EQ(r.template_args.substr(r.template_args.size() - 15), ", true, true, 1") << r.template_args;
  k.quant = NssKernelQuant::fp8;  // fp8 10 slots: not re-measured, registers, 6
  s = nss_eager_schedule(k);
  EXPECT_FALSE(s.prefetch);
  EXPECT_FALSE(s.shared_operands);
  EXPECT_EQ(s.min_blocks, 6);
  k.quant = NssKernelQuant::none;
  k.act = DType::f32;
  k.dim = 4096;  // 8 fp32 slots = 16 in 16-bit words: ptxas decides
  s = nss_eager_schedule(k);
  EXPECT_FALSE(s.prefetch);
  EXPECT_FALSE(s.shared_operands);
  EXPECT_EQ(s.min_blocks, 0);
  k.dim = 2048;  // 8 fp32-word slots: fp32 not measured with shared operands
  EXPECT_FALSE(nss_eager_schedule(k).shared_operands);
  // sglang numerics: warp per row, no schedule arguments (8 template arguments against 11).
  auto arguments = [](const std::string& args) { return 1 + std::count(args.begin(), args.end(), ','); };
  EXPECT_EQ(arguments(r.template_args), 11) << r.template_args;
  NssKernelKey g;
  g.numerics = NssNumerics::sglang;
  r = nss_kernel_request(g);
  EXPECT_EQ(r.min_blocks, 0);
  EXPECT_EQ(arguments(r.template_args), 8) << r.template_args;
}

// numerics=float32 (fp32 operands beside a 16-bit x): the schedule keeps ptxas from spilling
// (sm_90a, nvcc -Xptxas -v: docs/tuning/norm_scale_shift.md) and reaches the request as the last
// three template arguments (kFloat32, kModulate, kStreamOperands).
TEST(NssJit, Float32ChainScheduleHoldsItsOperandsWhereTheyFit) {
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  NssKernelKey k;
  k.numerics = NssNumerics::float32;
  k.dim = 1536;  // Wan 1.3B, 3 slots: registers
  NssEagerSchedule s = nss_eager_schedule(k);
  EXPECT_FALSE(s.prefetch || s.shared_operands || s.stream_operands);
  EXPECT_EQ(s.split, 1);
  EXPECT_EQ(s.min_blocks, 7);
  KernelRequest r = nss_kernel_request(k);
  EXPECT_TRUE(ends_with(r.template_args, "false, false, 1, true, true, false")) << r.template_args;
  k.dim = 5120;  // Wan 14B, 10 slots: scale and shift (fp32) in shared memory, prefetch, 5
  s = nss_eager_schedule(k);
  EXPECT_TRUE(s.prefetch && s.shared_operands && !s.stream_operands);
  EXPECT_EQ(s.min_blocks, 5);
  k.residual = true;  // the residual rows: the gate in registers, 3
  s = nss_eager_schedule(k);
  EXPECT_TRUE(s.prefetch && s.shared_operands);
  EXPECT_EQ(s.min_blocks, 3);
  k.modulate = false;  // norm2 behind the gated residual: nothing to hold in shared memory
  k.affine = 2;
  s = nss_eager_schedule(k);
  EXPECT_FALSE(s.shared_operands);
  r = nss_kernel_request(k);
  EXPECT_TRUE(ends_with(r.template_args, "true, false, 1, true, false, false")) << r.template_args;
  EXPECT_NE(k.to_string().find("float32,residual,affine=2,noquant,pdl,nomod"), std::string::npos) << k.to_string();
  NssKernelKey modulated = k;
  modulated.modulate = true;
  EXPECT_NE(modulated.packed(), k.packed());
  k.dim = 8192;  // 16 slots: operands streamed from memory at each use
  s = nss_eager_schedule(k);
  EXPECT_TRUE(s.stream_operands && !s.shared_operands && !s.prefetch);
  EXPECT_TRUE(ends_with(nss_kernel_request(k).template_args, ", true, false, true")) << nss_kernel_request(k).template_args;
  k.dim = 3072;  // 6 slots with scale and shift: fewer CTAs for their registers
  k.modulate = true;
  EXPECT_EQ(nss_eager_schedule(k).min_blocks, 3);
  k.residual = false;
  k.affine = 0;
  EXPECT_EQ(nss_eager_schedule(k).min_blocks, 5);
}

// numerics=float32's matching: f32 operands beside a 16-bit x, the modulation optional (norm2),
// an f32 x taking the eager fp32 kernel (the same chain), and the key's numerics and modulation.
TEST(NssMatching, Float32ChainTakesFloat32OperandsAndOptionalModulation) {
  Problem p(2, 9, 64, DType::bf16, 1);
  Buf w(DType::f32, {64}), b(DType::f32, {64}), g(DType::f32, {2, 1, 64}), r(DType::bf16, {2, 9, 64}),
      ro(DType::bf16, {2, 9, 64});
  NormScaleShiftInputs in;
  in.x = p.x.view;
  in.residual = r.view;
  in.gate = g.view;
  in.weight = w.view;
  in.bias = b.view;
  NormScaleShiftOutputs out;
  out.y = p.y.view;
  out.residual_out = ro.view;
  NormScaleShiftOptions opt;
  opt.numerics = NssNumerics::float32;
  const NormScaleShiftCall call = match_norm_scale_shift(in, out, opt);
  EXPECT_FALSE(call.modulate);
  EXPECT_EQ(call.affine, 2);
  EXPECT_EQ(norm_scale_shift(in, out, opt), "norm_scale_shift.reference");
  opt.numerics = NssNumerics::eager;  // f32 operands beside bf16 x: the eager numerics refuses them
  try {
    match_norm_scale_shift(in, out, opt);
    ADD_FAILURE() << "f32 gate accepted with numerics=eager";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate.dtype must be bf16 (as x; f32 operands beside a 16-bit x: "
                                         "numerics=float32) but is f32"),
              std::string::npos)
        << e.what();
  }
}

TEST(NssJit, HardwareE2m1KeyIsRefusedOnSm90) {
  if (jit::nvrtc_version() == 0) GTEST_SKIP() << "NVRTC not loadable here";
  NssKernelKey k;
  k.quant = NssKernelQuant::fp4_hardware;
  EXPECT_THROW(jit::nvrtc_compile(jit::wrapper_source(nss_kernel_request(k), "e"), "nss.cu", "sm_90a",
                                  jit::embedded_sources()),
               Error);
}

}  // namespace
}  // namespace ditops
