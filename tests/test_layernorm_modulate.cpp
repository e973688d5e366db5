// The layernorm_modulate family beyond its driver cases (tests/cases/layernorm_modulate_cases.cpp:
// the shapes, amplitudes, mappings, chunk strides, special scales, fp8 scales, in place, overlaps
// and invalid inputs against float64, the eager steps from aten's statistics and the reference):
// what a case cannot express. The e4m3 converter over every code and midpoint; the statistics twin
// those oracles use (src/reference/aten_layer_norm.h) against an independent simulation of aten's
// 128 threads and against float64; explain on the CPU; NVRTC compiling the kernel keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "ditops/layernorm_modulate.h"
#include "jit/jit.h"
#include "ops/layernorm_modulate/layernorm_modulate_kernels.h"
#include "reference/aten_layer_norm.h"
#include "reference/half.h"

namespace ditops {
namespace {

using ref::bf16_to_float;
using ref::float_to_bf16_rne;

float bf16r(float v) { return bf16_to_float(float_to_bf16_rne(v)); }

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// ---------------------------------------------------------------- e4m3 ----

std::vector<std::pair<float, uint8_t>> finite_e4m3_values() {
  std::vector<std::pair<float, uint8_t>> out;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN codes
    out.push_back({e4m3fn_to_float(static_cast<uint8_t>(c)), static_cast<uint8_t>(c)});
  }
  return out;
}

TEST(E4m3, DecodesTheFormat) {
  EXPECT_EQ(e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3fn_to_float(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(e4m3fn_to_float(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(e4m3fn_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3fn_to_float(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3fn_to_float(0x7F)));
  EXPECT_TRUE(std::signbit(e4m3fn_to_float(0x80)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (const auto& [v, code] : finite_e4m3_values()) EXPECT_EQ(float_to_e4m3fn(v), code) << v;
}

TEST(E4m3, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c < 0x7E; ++c) {  // consecutive positive codes c, c+1 (both finite)
      const uint8_t lo = static_cast<uint8_t>(c | (sign << 7)), hi = static_cast<uint8_t>((c + 1) | (sign << 7));
      const double a = e4m3fn_to_float(lo), b = e4m3fn_to_float(hi);
      const float mid = static_cast<float>((a + b) / 2);  // exact: few significant bits
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
      const uint8_t even = (c & 1) ? hi : lo;
      EXPECT_EQ(float_to_e4m3fn(mid), even) << "midpoint " << mid;
      EXPECT_EQ(float_to_e4m3fn(std::nextafter(mid, 0.0f)), lo) << mid;
      EXPECT_EQ(float_to_e4m3fn(std::nextafter(mid, sign ? -1000.0f : 1000.0f)), hi) << mid;
    }
  }
}

TEST(E4m3, RangeEndsFollowC10) {
  EXPECT_EQ(float_to_e4m3fn(464.0f), 0x7E);   // midpoint 448|480: ties to the even 448
  EXPECT_EQ(float_to_e4m3fn(-464.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3fn(470.0f), 0x7F);   // rounds to the (NaN) code above 448, as c10
  EXPECT_EQ(float_to_e4m3fn(480.0f), 0x7F);
  EXPECT_EQ(float_to_e4m3fn(INFINITY), 0x7F);
  EXPECT_EQ(float_to_e4m3fn(-INFINITY), 0xFF);
  EXPECT_EQ(float_to_e4m3fn(NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3fn(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3fn(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal: even 0
  EXPECT_EQ(float_to_e4m3fn(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3fn(1e-40f), 0x00);                    // fp32 subnormal input
}

TEST(E4m3, RandomValuesMatchANearestSearch) {
  const auto values = finite_e4m3_values();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 8.9f);
  for (int i = 0; i < 200000; ++i) {
    float v = std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    if (std::fabs(v) >= 464.0f) continue;
    uint8_t best = 0;
    double best_d = 1e30;
    for (const auto& [e, code] : values) {
      if (std::signbit(e) != std::signbit(v)) continue;
      const double d = std::fabs(static_cast<double>(e) - v);
      if (d < best_d || (d == best_d && (code & 1) == 0)) {
        best_d = d;
        best = code;
      }
    }
    ASSERT_EQ(float_to_e4m3fn(v), best) << v;
  }
}

// ---------------------------------------------------------- statistics ----

// rcp4 on the GPU is MUFU.RCP (max error 1 ulp) plus one Newton step; the CPU twin and the
// kernels' folded constants use the IEEE 1/n. They agree on every count if every seed within
// 2 ulp of 1/n refines to the IEEE value.
TEST(AtenStats, NewtonStepFromAnyNearbySeedGivesTheIeeeReciprocalOfEveryCount) {
  for (int n = 1; n <= 65536; ++n) {
    const float x = static_cast<float>(n);
    const float rn = 1.0f / x;
    float seed = rn;
    for (int k = 0; k < 2; ++k) seed = std::nextafter(seed, 0.0f);
    for (int k = 0; k <= 4; ++k, seed = std::nextafter(seed, 2.0f)) {
      const float e = std::fmaf(x, seed, -1.0f);
      const float r = std::fmaf(seed, -e, seed);
      ASSERT_EQ(bits(r), bits(rn)) << "count " << n << " seed offset " << k - 2;
    }
    ASSERT_EQ(ref::rcp4(x), rn);
  }
}

// An independent simulation of aten's kernel: 128 threads with their own states, every warp's
// shuffle rounds done for all 32 lanes from a snapshot, then the shared-memory loop over
// offsets blockDim.y/2 .. 1 with the upper half writing and the lower half merging.
ref::WelfordState simulate_aten(const std::vector<float>& x) {
  const int n_vec = static_cast<int>(x.size() / 4);
  std::vector<ref::WelfordState> t(128);
  for (int tid = 0; tid < 128; ++tid)
    for (int v = tid; v < n_vec; v += 128)
      for (int e = 0; e < 4; ++e) {
        ref::WelfordState& s = t[static_cast<size_t>(tid)];
        const float val = x[static_cast<size_t>(4 * v + e)];
        const float delta = val - s.mean;
        const float count = s.count + 1.0f;
        const float mean = std::fmaf(delta, 1.0f / count, s.mean);
        s.m2 = std::fmaf(delta, val - mean, s.m2);
        s.mean = mean;
        s.count = count;
      }
  for (int offset = 16; offset >= 1; offset /= 2) {
    const std::vector<ref::WelfordState> snap = t;
    for (int tid = 0; tid < 128; ++tid) {
      const int lane = tid % 32;
      const int src = lane + offset < 32 ? tid + offset : tid;
      t[static_cast<size_t>(tid)] = ref::welford_combine(snap[static_cast<size_t>(tid)], snap[static_cast<size_t>(src)]);
    }
  }
  std::vector<ref::WelfordState> warp = {t[0], t[32], t[64], t[96]};
  for (int offset = 2; offset >= 1; offset /= 2)
    for (int w = 0; w < offset; ++w) warp[static_cast<size_t>(w)] = ref::welford_combine(warp[static_cast<size_t>(w)], warp[static_cast<size_t>(w + offset)]);
  return warp[0];
}

std::vector<float> random_bf16_row(int n, float center, float amplitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = bf16r(center + amplitude * dist(rng));
  return x;
}

TEST(AtenStats, TwinMatchesAnIndependentSimulationBitForBit) {
  // Full blocks, tails (N % 512 != 0), rows shorter than one warp's vectors, the model widths.
  for (int n : {4, 8, 12, 64, 124, 128, 132, 508, 512, 516, 1020, 2240, 3072, 4096, 5120, 6144, 8188, 8192}) {
    for (float amplitude : {1e-4f, 1.0f, 100.0f}) {
      const auto x = random_bf16_row(n, 0.5f * amplitude, amplitude, static_cast<uint32_t>(n));
      const ref::WelfordState a = ref::aten_row_welford(x.data(), n), b = simulate_aten(x);
      ASSERT_EQ(bits(a.mean), bits(b.mean)) << "N=" << n << " amp=" << amplitude;
      ASSERT_EQ(bits(a.m2), bits(b.m2)) << "N=" << n;
      ASSERT_EQ(a.count, static_cast<float>(n));
    }
  }
}

TEST(AtenStats, TheOrderIsVisible) {
  // A constant row: the combines scale the mean by na + nb, which is not exactly 1 for every
  // count, so some widths give a mean != the value. A plain sequential Welford gives the value.
  int off = 0;
  for (int n = 4; n <= 8192; n += 4) {
    const std::vector<float> x(static_cast<size_t>(n), 1.0f + 1.0f / 128.0f);
    const ref::WelfordState a = ref::aten_row_welford(x.data(), n);
    ASSERT_EQ(bits(a.mean), bits(simulate_aten(x).mean));
    off += a.mean != x[0];
  }
  EXPECT_GT(off, 0) << "no width shows the inter-warp scaling; the order test would be vacuous";
  // Head widths: the two combines with empty warps alone (N <= 128: only warp 0 has data).
  int heads_off = 0;
  for (int n = 4; n <= 128; n += 4) {
    const std::vector<float> x(static_cast<size_t>(n), 3.0f);
    heads_off += ref::aten_row_welford(x.data(), n).mean != 3.0f;
  }
  std::printf("constant rows whose aten mean is not the constant: %d of 2048 widths, %d of 32 head widths\n",
              off, heads_off);
}

TEST(AtenStats, AgreeWithFloat64TwoPassWithinStatedBounds) {
  // Bounds (fp32 Welford over N <= 8192 values, then one rsqrt): |mean - mean64| <= 2^-18 *
  // (|mean64| + sigma64) and |rstd / rstd64 - 1| <= 2^-14 for rows with sigma >= 1e-3 * |mean|.
  for (int n : {128, 516, 3072, 8192})
    for (float center : {0.0f, 1.0f, 100.0f})
      for (float amplitude : {1e-2f, 1.0f, 100.0f}) {
        const auto x = random_bf16_row(n, center, amplitude, 11u * static_cast<uint32_t>(n));
        double mean = 0, var = 0;
        for (float v : x) mean += v;
        mean /= n;
        for (float v : x) var += (v - mean) * (v - mean);
        var /= n;
        const double sigma = std::sqrt(var);
        if (sigma < 1e-3 * std::fabs(mean)) continue;
        const ref::RowStats st = ref::aten_row_stats(x.data(), n, 1e-6f);
        EXPECT_LE(std::fabs(st.mean - mean), std::ldexp(std::fabs(mean) + sigma, -18)) << n << " " << center;
        EXPECT_LE(std::fabs(st.rstd * std::sqrt(var + 1e-6) - 1.0), std::ldexp(1.0, -14)) << n << " " << center;
      }
}

TEST(AtenStats, RsqrtTwinIsCorrectlyRoundedWithTheSubnormalPath) {
  EXPECT_EQ(ref::aten_rsqrtf(4.0f), 0.5f);
  EXPECT_EQ(ref::aten_rsqrtf(0.0f), INFINITY);
  EXPECT_TRUE(std::isnan(ref::aten_rsqrtf(-1.0f)));
  const float sub = std::ldexp(1.0f, -140);  // subnormal: scaled path
  EXPECT_EQ(ref::aten_rsqrtf(sub), std::ldexp(1.0f, 70));
  EXPECT_EQ(ref::aten_rsqrtf(1e-6f), static_cast<float>(1.0L / std::sqrt(static_cast<long double>(1e-6f))));
}

// ---------------------------------------------------------------- explain ----

TEST(LayerNormModulateExplain, ListsEveryCandidateWithItsReason) {
  const int64_t S = 16, D = 3072;
  std::vector<uint16_t> x(S * D), mod(6 * D), out(S * D);
  std::vector<uint8_t> out8(S * D);
  const Device cpu{};
  const TensorView xv = TensorView::contiguous(x.data(), DType::bf16, cpu, {1, S, D});
  const TensorView scale = TensorView::contiguous(mod.data(), DType::bf16, cpu, {1, D});
  TensorView shift = scale;
  shift.data = mod.data() + D;
  const DispatchReport r = explain_layernorm_modulate(
      match_layernorm_modulate(xv, scale, shift, TensorView::contiguous(out.data(), DType::bf16, cpu, {1, S, D}), {}));
  ASSERT_NE(r.chosen, nullptr);
  EXPECT_EQ(r.chosen->name, "layernorm_modulate.reference");
  bool saw_jit = false;
  for (const auto& cand : r.candidates)
    if (cand.name == "layernorm_modulate.jit") {
      saw_jit = true;
      EXPECT_FALSE(cand.eligible);
      EXPECT_FALSE(cand.reason.empty());
    }
  EXPECT_TRUE(saw_jit);
  const std::string text = r.format();
  EXPECT_NE(text.find("layernorm_modulate.reference"), std::string::npos) << text;
  float one = 1.0f;
  const DispatchReport r8 = explain_layernorm_modulate(match_layernorm_modulate_fp8(
      xv, scale, shift, TensorView::contiguous(&one, DType::f32, cpu, {1}),
      TensorView::contiguous(out8.data(), DType::f8e4m3fn, cpu, {1, S, D}), {}));
  EXPECT_EQ(r8.op, "layernorm_modulate_fp8");
  EXPECT_GE(r8.candidates.size(), 3u);  // two jit variants + reference
}

// ------------------------------------------------------------ compilation ----

TEST(LayerNormModulateKernels, EveryKeyCompilesWithNvrtcForTheTargetArchs) {
  if (jit::nvrtc_version() == 0) GTEST_SKIP() << "NVRTC not loadable here";
  const auto dir = std::filesystem::temp_directory_path() / ("ditops_lnm_" + std::to_string(getpid()));
  setenv("DITOPS_CACHE_DIR", dir.c_str(), 1);
  reload_config();
  const auto requests = layernorm_modulate_all_requests();
  ASSERT_GT(requests.size(), 100u);
  // A spread of keys (every slot bucket, both mappings, even/uneven, bf16/fp8, shift, pdl,
  // alignment) per target; nvcc compiles the same headers in the AOT-style check of the device
  // script. Steps 9 and 31 are coprime with the 24 keys of a bucket, so the picks rotate.
  for (size_t i = 0; i < requests.size(); i += 9)
    EXPECT_FALSE(jit::get_cubin(requests[i], "sm_90a").empty()) << requests[i].template_key;
  for (const char* arch : {"sm_100a", "sm_120a"})
    for (size_t i = 0; i < requests.size(); i += 31)
      EXPECT_FALSE(jit::get_cubin(requests[i], arch).empty()) << arch << " " << requests[i].template_key;
  // Every qk-head key (one warp per head and 8 lanes per head for Dh = 128) on every target.
  int qk_keys = 0, head128_keys = 0;
  for (const auto& request : requests) {
    if (request.template_key.find("qk_head") == std::string::npos) continue;
    ++qk_keys;
    head128_keys += request.template_key.find("d128") != std::string::npos;
    for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
      EXPECT_FALSE(jit::get_cubin(request, arch).empty()) << arch << " " << request.template_key;
  }
  EXPECT_GE(qk_keys, 4);
  EXPECT_GE(head128_keys, 2);
  // The persistent CTA keys carry the measured knobs: even rows, prefetch up to 10 slots, and
  // __launch_bounds__(128, 6) up to 6 slots.
  bool saw_even_prefetch = false;
  for (const auto& request : requests)
    if (request.template_key.find("slots=6,cta,even,prefetch") != std::string::npos) {
      saw_even_prefetch = true;
      EXPECT_EQ(request.min_blocks, 6) << request.template_key;
    } else if (request.template_key.find("slots=12,cta") != std::string::npos) {
      EXPECT_EQ(request.template_key.find("prefetch"), std::string::npos) << request.template_key;
      EXPECT_EQ(request.min_blocks, 0) << request.template_key;
    }
  EXPECT_TRUE(saw_even_prefetch);
  EXPECT_FALSE(jit::get_cubin(aten_ln_selfcheck_request(), "sm_90a").empty());
  std::filesystem::remove_all(dir);
  unsetenv("DITOPS_CACHE_DIR");
  reload_config();
}

}  // namespace
}  // namespace ditops
