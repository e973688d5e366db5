// The layernorm_modulate test driver on the GPU (skipped without one): every CUDA implementation
// and both row mappings against the CPU reference on the same inputs, plus exact checks:
//   * the GPU mean equals the CPU twin's mean bit for bit (same operations; only rstd may differ,
//     MUFU.RSQ vs a correctly rounded rsqrt, by <= 2 fp32 ulp);
//   * given the GPU's own (mean, rstd) (stats_out), the CPU chain of rounding steps reproduces
//     every output bit (bf16 and fp8 with the IEEE reciprocal);
//   * the warp and CTA mappings give identical bits;
//   * rcp4(n) == 1.0f / n on the device for every count up to 2^24 (the kernels fold that
//     constant), and rsqrt.approx.f32 equals its explicit subnormal form.
// Bit-exactness against eager PyTorch itself is checked by bench/layernorm_modulate_torch.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ditops/layernorm_modulate.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/layernorm_modulate_params.h"
#include "ops/layernorm_modulate/layernorm_modulate_kernels.h"
#include "reference/aten_layer_norm.h"
#include "reference/half.h"

namespace ditops {

namespace {

using jit::check_cu;
using ref::bf16_to_float;
using ref::float_to_bf16_rne;

struct Buffer {
  CUdeviceptr ptr = 0;
  explicit Buffer(size_t n) { check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, n ? n : 16), "alloc"); }
  ~Buffer() { jit::require_cuda_driver().cuMemFree(ptr); }
  void* get() const { return reinterpret_cast<void*>(ptr); }
  template <typename T>
  void put(const std::vector<T>& v) { check_cu(jit::require_cuda_driver().cuMemcpyHtoD(ptr, v.data(), v.size() * sizeof(T)), "h2d"); }
  template <typename T>
  void get_to(std::vector<T>& v) { check_cu(jit::require_cuda_driver().cuMemcpyDtoH(v.data(), ptr, v.size() * sizeof(T)), "d2h"); }
};

bool have_gpu() {
  const jit::CudaDriver* d = jit::cuda_driver();
  return d && d->device_count > 0;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

int ulp_distance(float a, float b) {
  const int32_t ia = static_cast<int32_t>(bits(a)), ib = static_cast<int32_t>(bits(b));
  return std::abs(ia - ib);
}

float bf16r(float v) { return bf16_to_float(float_to_bf16_rne(v)); }

class LayerNormModulateGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);  // the buffers below are allocated before any op call binds it
  }
};

struct Case {
  int64_t B, S, D;
  int chunks;  // scale/shift are chunks of a [B, chunks * D] projection
  bool shift;
  float amplitude, eps;
};

struct Result {
  std::vector<uint16_t> out;
  std::vector<uint8_t> out8;
  std::vector<float> stats;
  std::string impl;
};

struct Inputs {
  std::vector<uint16_t> x, mod;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  Inputs in;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  in.x.resize(static_cast<size_t>(c.B * c.S * c.D));
  for (auto& v : in.x) v = float_to_bf16_rne(c.amplitude * (n(rng) + 0.3f));
  for (size_t i = 0; i < in.x.size(); i += 97) in.x[i] = (i & 1) ? 0x8000 : 0x0000;  // signed zeros
  in.mod.resize(static_cast<size_t>(c.B * c.chunks * c.D));
  for (auto& v : in.mod) v = float_to_bf16_rne(0.3f * n(rng));
  for (size_t i = 0; i < in.mod.size(); i += 31) in.mod[i] = float_to_bf16_rne(static_cast<float>(static_cast<int>(i % 3) - 1));
  for (size_t i = 5; i < in.mod.size(); i += 41) in.mod[i] = 0x8000;
  return in;
}

// Runs the op on the GPU; fp8 when input_scale > 0.
Result run_gpu(const Case& c, const Inputs& in, LnRowMapping mapping, float input_scale, Fp8Reciprocal recip,
               bool in_place = false) {
  const Device dev{DeviceKind::cuda, 0};
  const bool fp8 = input_scale > 0.0f;
  Buffer gx(in.x.size() * 2), gmod(in.mod.size() * 2), gout(in.x.size() * 2), gstats(static_cast<size_t>(c.B * c.S * 8)),
      gscale(4);
  gx.put(in.x);
  gmod.put(in.mod);
  gscale.put(std::vector<float>{input_scale});
  TensorView x = TensorView::contiguous(gx.get(), DType::bf16, dev, {c.B, c.S, c.D});
  TensorView scale = TensorView::contiguous(gmod.get(), DType::bf16, dev, {c.B, c.D});
  scale.strides[0] = c.chunks * c.D;
  TensorView shift;
  if (c.shift) {
    shift = scale;
    shift.data = static_cast<uint16_t*>(gmod.get()) + c.D;
  }
  TensorView out = in_place ? x : TensorView::contiguous(gout.get(), fp8 ? DType::f8e4m3fn : DType::bf16, dev, {c.B, c.S, c.D});
  LayerNormModulateOptions o;
  o.eps = c.eps;
  o.mapping = mapping;
  o.fp8_reciprocal = recip;
  o.stats_out = TensorView::contiguous(gstats.get(), DType::f32, dev, {c.B, c.S, 2});
  o.dispatch.backend = Provenance::jit;
  Result r;
  r.impl = fp8 ? layernorm_modulate_fp8(x, scale, shift, TensorView::contiguous(gscale.get(), DType::f32, dev, {1}), out, o)
               : layernorm_modulate(x, scale, shift, out, o);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
  r.stats.resize(static_cast<size_t>(c.B * c.S * 2));
  gstats.get_to(r.stats);
  if (fp8) {
    r.out8.resize(in.x.size());
    gout.get_to(r.out8);
  } else {
    r.out.resize(in.x.size());
    (in_place ? gx : gout).get_to(r.out);
  }
  return r;
}

TEST_F(LayerNormModulateGpu, StatsAndOutputsAgainstTheReference) {
  std::vector<Case> cases;
  for (auto [B, S, D] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 128}, {1, 37, 2240}, {2, 300, 3072}, {1, 129, 4096},
                         {1, 64, 5120}, {1, 33, 6144}, {1, 9, 8192}, {2, 17, 516}, {3, 5, 12}})
    for (auto [amp, eps] : {std::pair<float, float>{1e-4f, 1e-6f}, {1.0f, 1e-6f}, {100.0f, 1e-5f}})
      for (bool shift : {true, false}) cases.push_back({B, S, D, shift ? 6 : 4, shift, amp, eps});
  int64_t total = 0, differ = 0;
  for (const Case& c : cases) {
    const Inputs in = make_inputs(c, static_cast<uint32_t>(c.D + c.S));
    Result warp = run_gpu(c, in, LnRowMapping::warp, 0.0f, Fp8Reciprocal::ieee);
    Result cta = run_gpu(c, in, LnRowMapping::cta, 0.0f, Fp8Reciprocal::ieee);
    Result automatic = run_gpu(c, in, LnRowMapping::automatic, 0.0f, Fp8Reciprocal::ieee);
    const std::string where = "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
                              " amp=" + std::to_string(c.amplitude) + " shift=" + std::to_string(c.shift);
    ASSERT_EQ(warp.impl, "layernorm_modulate.jit");
    ASSERT_EQ(warp.out, cta.out) << "warp and cta mappings differ, " << where;
    ASSERT_EQ(warp.stats, cta.stats) << where;
    ASSERT_EQ(warp.out, automatic.out) << where;
    for (int64_t r = 0; r < c.B * c.S; ++r) {
      const int64_t b = r / c.S;
      const ref::RowStats cpu = ref::aten_row_stats_bf16(in.x.data() + r * c.D, c.D, c.eps);
      const ref::RowStats gpu{warp.stats[static_cast<size_t>(2 * r)], warp.stats[static_cast<size_t>(2 * r + 1)]};
      ASSERT_EQ(bits(gpu.mean), bits(cpu.mean)) << "row " << r << " " << where;
      ASSERT_LE(ulp_distance(gpu.rstd, cpu.rstd), 2) << "row " << r << " " << where;
      for (int64_t i = 0; i < c.D; ++i) {
        const size_t at = static_cast<size_t>(r * c.D + i);
        const float x = bf16_to_float(in.x[at]);
        const float sc = bf16_to_float(in.mod[static_cast<size_t>(b * c.chunks * c.D + i)]);
        const float sh = bf16_to_float(in.mod[static_cast<size_t>(b * c.chunks * c.D + c.D + i)]);
        auto chain = [&](ref::RowStats st) {
          const float p = bf16r(bf16r(st.rstd * (x - st.mean)) * bf16r(1.0f + sc));
          return float_to_bf16_rne(c.shift ? bf16r(p + sh) : p);
        };
        // Exact: the chain from the GPU's own statistics.
        ASSERT_EQ(warp.out[at], chain(gpu)) << "row " << r << " col " << i << " " << where;
        // Close: against the CPU statistics (rstd may differ in its last bits).
        const uint16_t expect = chain(cpu);
        ++total;
        if (warp.out[at] != expect) {
          ++differ;
          const float a = bf16_to_float(warp.out[at]), e = bf16_to_float(expect);
          const float yop = std::fabs(bf16r(cpu.rstd * (x - cpu.mean)) * bf16r(1.0f + sc));
          ASSERT_LE(std::fabs(a - e), std::ldexp(yop + std::fabs(e), -6) + 1e-30f) << where << " col " << i;
        }
      }
    }
  }
  std::printf("bf16 outputs differing from the CPU reference (rstd rounding): %lld of %lld\n",
              static_cast<long long>(differ), static_cast<long long>(total));
  EXPECT_LE(differ, total / 100);
}

TEST_F(LayerNormModulateGpu, Fp8BytesAreTheStaticQuantOfTheBf16Output) {
  for (const Case& c : {Case{1, 127, 6144, 6, true, 3.0f, 1e-6f}, Case{2, 40, 3072, 4, false, 1.0f, 1e-6f}})
    for (float s : {0.005f, 0.03125f, 0.25f, 0.4754464328289032f, 1.0f}) {
      const Inputs in = make_inputs(c, 77);
      const Result bf = run_gpu(c, in, LnRowMapping::automatic, 0.0f, Fp8Reciprocal::ieee);
      for (LnRowMapping m : {LnRowMapping::warp, LnRowMapping::cta}) {
        const Result q = run_gpu(c, in, m, s, Fp8Reciprocal::ieee);
        const Result qf = run_gpu(c, in, m, s, Fp8Reciprocal::div_full);
        EXPECT_EQ(q.impl, "layernorm_modulate_fp8.jit");
        EXPECT_EQ(qf.impl, "layernorm_modulate_fp8.jit_div_full");
        const float inv = 1.0f / s;
        int64_t full_differs = 0;
        for (size_t i = 0; i < bf.out.size(); ++i) {
          float v = bf16_to_float(bf.out[i]) * inv;
          v = std::min(448.0f, std::max(-448.0f, v));
          ASSERT_EQ(q.out8[i], float_to_e4m3fn(v)) << "s=" << s << " i=" << i;
          if (qf.out8[i] != q.out8[i]) {
            ++full_differs;  // div.full's inverse may differ by an ulp: at most one code apart
            ASSERT_LE(std::abs(static_cast<int>(qf.out8[i] & 0x7F) - static_cast<int>(q.out8[i] & 0x7F)), 1);
          }
        }
        std::printf("fp8 s=%g: div_full bytes differing from ieee: %lld\n", s, static_cast<long long>(full_differs));
      }
    }
}

TEST_F(LayerNormModulateGpu, InPlaceEqualsOutOfPlace) {
  const Case c{2, 33, 3072, 6, true, 1.0f, 1e-6f};
  const Inputs in = make_inputs(c, 5);
  for (LnRowMapping m : {LnRowMapping::warp, LnRowMapping::cta})
    EXPECT_EQ(run_gpu(c, in, m, 0.0f, Fp8Reciprocal::ieee, true).out, run_gpu(c, in, m, 0.0f, Fp8Reciprocal::ieee).out);
}

TEST_F(LayerNormModulateGpu, QkHeadAgainstTheReference) {
  const Device dev{DeviceKind::cuda, 0}, cpu{};
  for (auto [B, S, Hq, Hk, Dh] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 129, 32, 32, 128}, {2, 37, 3, 5, 40},
                                  {1, 129, 5, 5, 64}, {1, 7, 2, 1, 4}, {1, 1, 1, 1, 124}}) {
    std::mt19937 rng(static_cast<uint32_t>(Dh + S));
    std::normal_distribution<float> n(0.0f, 4.0f);
    std::vector<uint16_t> q(static_cast<size_t>(B * S * Hq * Dh)), k(static_cast<size_t>(B * S * Hk * Dh));
    for (auto& v : q) v = float_to_bf16_rne(n(rng) + 1.0f);
    for (auto& v : k) v = float_to_bf16_rne(n(rng));
    std::vector<uint16_t> rq(q.size()), rk(k.size()), gq(q.size()), gk(k.size());
    qk_head_layernorm(TensorView::contiguous(q.data(), DType::bf16, cpu, {B, S, Hq, Dh}),
                      TensorView::contiguous(k.data(), DType::bf16, cpu, {B, S, Hk, Dh}),
                      TensorView::contiguous(rq.data(), DType::bf16, cpu, {B, S, Hq, Dh}),
                      TensorView::contiguous(rk.data(), DType::bf16, cpu, {B, S, Hk, Dh}));
    Buffer bq(q.size() * 2), bk(k.size() * 2);
    bq.put(q);
    bk.put(k);
    const TensorView vq = TensorView::contiguous(bq.get(), DType::bf16, dev, {B, S, Hq, Dh});
    const TensorView vk = TensorView::contiguous(bk.get(), DType::bf16, dev, {B, S, Hk, Dh});
    LayerNormModulateOptions o;
    o.dispatch.backend = Provenance::jit;
    EXPECT_EQ(qk_head_layernorm(vq, vk, vq, vk, o), "qk_head_layernorm.jit");  // in place
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    bq.get_to(gq);
    bk.get_to(gk);
    int64_t differ = 0;
    for (size_t i = 0; i < gq.size(); ++i) {
      if (gq[i] == rq[i]) continue;
      ++differ;
      ASSERT_LE(std::fabs(bf16_to_float(gq[i]) - bf16_to_float(rq[i])), std::ldexp(std::fabs(bf16_to_float(rq[i])), -7) + 1e-30f);
    }
    for (size_t i = 0; i < gk.size(); ++i) {
      if (gk[i] == rk[i]) continue;
      ++differ;
      ASSERT_LE(std::fabs(bf16_to_float(gk[i]) - bf16_to_float(rk[i])), std::ldexp(std::fabs(bf16_to_float(rk[i])), -7) + 1e-30f);
    }
    EXPECT_LE(differ, static_cast<int64_t>(gq.size() + gk.size()) / 50) << "Dh=" << Dh;
  }
}

TEST_F(LayerNormModulateGpu, PrimitivesRcp4IsTheIeeeReciprocalAndRsqrtHasTheSubnormalPath) {
  const int count = 1 << 24;
  std::vector<float> rsqrt_in;
  for (int e = -149; e < -120; ++e) rsqrt_in.push_back(std::ldexp(1.0f, e));
  for (int e = -149; e < -120; ++e) rsqrt_in.push_back(std::ldexp(1.37f, e));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ex(-30.0f, 30.0f);
  for (int i = 0; i < 4096; ++i) rsqrt_in.push_back(std::exp2(ex(rng)));
  Buffer rcp(static_cast<size_t>(count) * 4), rin(rsqrt_in.size() * 4), rout(rsqrt_in.size() * 8);
  rin.put(rsqrt_in);
  AtenLnSelfcheckParams p{static_cast<float*>(rcp.get()), static_cast<const float*>(rin.get()),
                          static_cast<float*>(rout.get()), count, static_cast<int>(rsqrt_in.size())};
  const jit::LoadedKernel& k = jit::jit_kernel(aten_ln_selfcheck_request(), 0);
  jit::bind_primary_context(0);
  jit::launch(k, static_cast<unsigned>(count / 256), 256, &p, sizeof p, nullptr, false);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
  std::vector<float> r(static_cast<size_t>(count)), out(rsqrt_in.size() * 2);
  rcp.get_to(r);
  rout.get_to(out);
  for (int n = 1; n <= count; ++n) ASSERT_EQ(bits(r[static_cast<size_t>(n - 1)]), bits(1.0f / static_cast<float>(n))) << n;
  int rsqrt_off = 0;
  for (size_t i = 0; i < rsqrt_in.size(); ++i) {
    EXPECT_EQ(bits(out[2 * i]), bits(out[2 * i + 1])) << rsqrt_in[i];
    rsqrt_off = std::max(rsqrt_off, ulp_distance(out[2 * i], ref::aten_rsqrtf(rsqrt_in[i])));
  }
  std::printf("rsqrt.approx.f32 vs correctly rounded: max %d ulp\n", rsqrt_off);
  EXPECT_LE(rsqrt_off, 2);
}

}  // namespace
}  // namespace ditops
