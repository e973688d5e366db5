// CPU tests of the layernorm_modulate family: the exact e4m3 converter, the aten statistics twin
// (against an independent simulation of aten's 128 threads and against float64), the eager
// rounding steps, argument matching, explain, and NVRTC compilation of the kernels.
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
#include "test_util.h"

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

// -------------------------------------------------------- the reference op ----

struct Case {
  int64_t B, S, D;
  int64_t scale_row_stride;  // >= D: a chunk view
  bool shift;
};

struct Host {
  std::vector<uint16_t> x, mod, out;
  std::vector<uint8_t> out8;
  TensorView xv, scale, shift, outv;
};

Host make_host(const Case& c, float amplitude, uint32_t seed, bool fp8 = false) {
  Host h;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  h.x.resize(static_cast<size_t>(c.B * c.S * c.D));
  for (auto& v : h.x) v = float_to_bf16_rne(amplitude * dist(rng) + 0.25f * amplitude);
  // adaLN projection [B, 2 * stride]: scale at column 0, shift at column stride.
  h.mod.resize(static_cast<size_t>(c.B * 2 * c.scale_row_stride));
  for (auto& v : h.mod) v = float_to_bf16_rne(0.5f * dist(rng));
  const Device cpu{};
  h.xv = TensorView::contiguous(h.x.data(), DType::bf16, cpu, {c.B, c.S, c.D});
  h.scale = TensorView::contiguous(h.mod.data(), DType::bf16, cpu, {c.B, c.D});
  h.scale.strides[0] = 2 * c.scale_row_stride;
  if (c.shift) {
    h.shift = h.scale;
    h.shift.data = h.mod.data() + c.scale_row_stride;
  }
  if (fp8) {
    h.out8.assign(static_cast<size_t>(c.B * c.S * c.D), 0xAA);
    h.outv = TensorView::contiguous(h.out8.data(), DType::f8e4m3fn, cpu, {c.B, c.S, c.D});
  } else {
    h.out.assign(static_cast<size_t>(c.B * c.S * c.D), 0xFFFF);
    h.outv = TensorView::contiguous(h.out.data(), DType::bf16, cpu, {c.B, c.S, c.D});
  }
  return h;
}

// The chain written out for one element (independent of the reference's code path).
float chain(float x, ref::RowStats st, float scale, const float* shift) {
  const float y = bf16r(st.rstd * (x - st.mean));
  const float op = bf16r(1.0f + scale);
  const float p = bf16r(y * op);
  return shift ? bf16r(p + *shift) : p;
}

TEST(LayerNormModulateReference, FollowsTheEagerRoundingSteps) {
  for (const Case& c : {Case{1, 7, 3072, 3072 * 3, true}, Case{2, 5, 2240, 2240 * 6, false},
                        Case{2, 3, 516, 516, true}, Case{1, 1, 128, 128 * 4, true}}) {
    Host h = make_host(c, 1.0f, 3);
    LayerNormModulateOptions o;
    o.eps = 1e-5f;
    EXPECT_EQ(layernorm_modulate(h.xv, h.scale, h.shift, h.outv, o), "layernorm_modulate.reference");
    for (int64_t r = 0; r < c.B * c.S; ++r) {
      const int64_t b = r / c.S;
      const ref::RowStats st = ref::aten_row_stats_bf16(h.x.data() + r * c.D, c.D, o.eps);
      for (int64_t i = 0; i < c.D; ++i) {
        const float sc = bf16_to_float(h.mod[static_cast<size_t>(b * 2 * c.scale_row_stride + i)]);
        const float sh = bf16_to_float(h.mod[static_cast<size_t>(b * 2 * c.scale_row_stride + c.scale_row_stride + i)]);
        const float expect = chain(bf16_to_float(h.x[static_cast<size_t>(r * c.D + i)]), st, sc, c.shift ? &sh : nullptr);
        ASSERT_EQ(h.out[static_cast<size_t>(r * c.D + i)], float_to_bf16_rne(expect)) << "row " << r << " col " << i;
      }
    }
  }
}

TEST(LayerNormModulateReference, SpecialScalesAndSignedZeros) {
  // Row [1, -1, 0, 0, ...]: mean is exactly 0, so the zero elements normalize to +0.
  const int64_t D = 8;
  std::vector<uint16_t> x = {0x3F80, 0xBF80, 0, 0, 0x3F80, 0xBF80, 0, 0};
  const Device cpu{};
  for (float s : {-2.0f, -1.0f, 0.0f, 1.0f}) {
    std::vector<uint16_t> scale(D, float_to_bf16_rne(s)), zero_shift(D, 0x0000), neg_zero_shift(D, 0x8000), out(D);
    auto run = [&](const std::vector<uint16_t>* shift) {
      TensorView sv = shift ? TensorView::contiguous(const_cast<uint16_t*>(shift->data()), DType::bf16, cpu, {1, D})
                            : TensorView{};
      layernorm_modulate(TensorView::contiguous(x.data(), DType::bf16, cpu, {1, 1, D}),
                         TensorView::contiguous(scale.data(), DType::bf16, cpu, {1, D}), sv,
                         TensorView::contiguous(out.data(), DType::bf16, cpu, {1, 1, D}));
    };
    run(nullptr);
    const ref::RowStats st = ref::aten_row_stats_bf16(x.data(), D, 1e-6f);
    ASSERT_EQ(st.mean, 0.0f);
    const float y1 = bf16r(st.rstd);  // normalized value of the 1.0 elements
    // scale -1: op = 0, products are zeros with the sign of y; scale 0: y; scale 1: 2y exactly.
    const uint16_t zero_code = s == -2.0f ? 0x8000 : 0x0000;  // y = +0 times op = 1 + s
    EXPECT_EQ(out[2], zero_code) << s;
    EXPECT_EQ(out[3], zero_code) << s;
    if (s == -1.0f) {
      EXPECT_EQ(out[0], 0x0000);
      EXPECT_EQ(out[1], 0x8000);
    } else {
      EXPECT_EQ(out[0], float_to_bf16_rne(bf16r(y1 * (1.0f + s))));
      EXPECT_EQ(out[1], float_to_bf16_rne(bf16r(-y1 * (1.0f + s))));
    }
    if (s == 1.0f) EXPECT_EQ(bf16_to_float(out[0]), 2.0f * y1);
    // A +0 shift turns -0 into +0 (the chain's `+ shift`); a -0 shift keeps it.
    run(&zero_shift);
    EXPECT_EQ(out[2], 0x0000) << s;
    run(&neg_zero_shift);
    EXPECT_EQ(out[2], zero_code) << s;
  }
}

TEST(LayerNormModulateReference, Fp8IsTheStaticQuantOfTheBf16Result) {
  const Case c{2, 9, 6144, 6144 * 2, true};
  for (float input_scale : {0.005f, 0.03125f, 0.4754464328289032f, 1.0f}) {
    Host h = make_host(c, 30.0f, 5);
    Host q = make_host(c, 30.0f, 5, true);
    float is = input_scale;
    const TensorView isv = TensorView::contiguous(&is, DType::f32, Device{}, {1});
    layernorm_modulate(h.xv, h.scale, h.shift, h.outv);
    EXPECT_EQ(layernorm_modulate_fp8(q.xv, q.scale, q.shift, isv, q.outv), "layernorm_modulate_fp8.reference");
    const float inv = 1.0f / input_scale;
    int saturated = 0;
    for (size_t i = 0; i < h.out.size(); ++i) {
      float v = bf16_to_float(h.out[i]) * inv;
      v = std::min(448.0f, std::max(-448.0f, v));
      saturated += std::fabs(v) == 448.0f;
      ASSERT_EQ(q.out8[i], float_to_e4m3fn(v)) << i;
    }
    if (input_scale == 0.005f) EXPECT_GT(saturated, 0) << "the clamp is not exercised";
  }
}

TEST(LayerNormModulateReference, QkHeadIsPerHeadLayerNormAndWorksInPlace) {
  const int64_t B = 2, S = 3, Hq = 4, Hk = 2, Dh = 40;
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<uint16_t> q(static_cast<size_t>(B * S * Hq * Dh)), k(static_cast<size_t>(B * S * Hk * Dh));
  for (auto& v : q) v = float_to_bf16_rne(dist(rng) + 1.0f);
  for (auto& v : k) v = float_to_bf16_rne(dist(rng));
  const std::vector<uint16_t> q0 = q, k0 = k;
  const Device cpu{};
  std::vector<uint16_t> qo(q.size()), ko(k.size());
  const TensorView qv = TensorView::contiguous(q.data(), DType::bf16, cpu, {B, S, Hq, Dh});
  const TensorView kv = TensorView::contiguous(k.data(), DType::bf16, cpu, {B, S, Hk, Dh});
  EXPECT_EQ(qk_head_layernorm(qv, kv, TensorView::contiguous(qo.data(), DType::bf16, cpu, {B, S, Hq, Dh}),
                              TensorView::contiguous(ko.data(), DType::bf16, cpu, {B, S, Hk, Dh})),
            "qk_head_layernorm.reference");
  auto check = [&](const std::vector<uint16_t>& in, const std::vector<uint16_t>& out) {
    for (size_t r = 0; r < in.size() / Dh; ++r) {
      const ref::RowStats st = ref::aten_row_stats_bf16(in.data() + r * Dh, Dh, 1e-6f);
      for (int64_t i = 0; i < Dh; ++i)
        ASSERT_EQ(out[r * Dh + i], float_to_bf16_rne(st.rstd * (bf16_to_float(in[r * Dh + i]) - st.mean)));
    }
  };
  check(q0, qo);
  check(k0, ko);
  qk_head_layernorm(qv, kv, qv, kv);  // in place
  EXPECT_EQ(q, qo);
  EXPECT_EQ(k, ko);
}

TEST(LayerNormModulateReference, InPlaceEqualsOutOfPlaceAndEmptyIsANoOp) {
  const Case c{1, 4, 1024, 1024, true};
  Host a = make_host(c, 1.0f, 21), b = make_host(c, 1.0f, 21);
  layernorm_modulate(a.xv, a.scale, a.shift, a.outv);
  layernorm_modulate(b.xv, b.scale, b.shift, b.xv);
  EXPECT_EQ(a.out, b.x);
  Host e = make_host(Case{1, 0, 64, 64, false}, 1.0f, 1);
  EXPECT_NO_THROW(layernorm_modulate(e.xv, e.scale, e.shift, e.outv));
}

// ------------------------------------------------------------- matching ----

using test_util::error_of;

TEST(LayerNormModulateMatching, MessagesNameTensorDimensionExpectedAndActual) {
  const Case c{2, 4, 96, 96, true};
  Host h = make_host(c, 1.0f, 1);
  const LayerNormModulateOptions o;
  auto msg = [&](TensorView x, TensorView scale, TensorView shift, TensorView out) {
    return error_of([&] { match_layernorm_modulate(x, scale, shift, out, o); });
  };
  EXPECT_EQ(msg(h.xv, h.scale, h.shift, h.outv), "");

  TensorView bad = h.xv;
  bad.shape[2] = 90;
  bad.strides[1] = 90;
  bad.strides[0] = 360;
  EXPECT_NE(msg(bad, h.scale, h.shift, h.outv).find("x.shape[2] (D) must be a multiple of 4"), std::string::npos);
  EXPECT_NE(msg(bad, h.scale, h.shift, h.outv).find("but is 90"), std::string::npos);

  TensorView big = h.xv;
  big.shape[2] = 8196;
  EXPECT_NE(msg(big, h.scale, h.shift, h.outv).find("[4, 8192]"), std::string::npos);

  TensorView sc = h.scale;
  sc.shape[1] = 64;
  const std::string scale_msg = msg(h.xv, sc, h.shift, h.outv);
  EXPECT_NE(scale_msg.find("scale.shape[1]"), std::string::npos) << scale_msg;
  EXPECT_NE(scale_msg.find("96"), std::string::npos) << scale_msg;
  EXPECT_NE(scale_msg.find("64"), std::string::npos) << scale_msg;

  TensorView sh = h.shift;
  sh.strides[1] = 2;
  EXPECT_NE(msg(h.xv, h.scale, sh, h.outv).find("shift.stride"), std::string::npos);

  TensorView f32x = h.xv;
  f32x.dtype = DType::f32;
  EXPECT_NE(msg(f32x, h.scale, h.shift, h.outv).find("x.dtype must be bf16 but is f32"), std::string::npos);

  TensorView shifted_out = h.xv;  // overlaps x by one element without being x
  shifted_out.data = h.x.data() + 1;
  EXPECT_NE(msg(h.xv, h.scale, h.shift, shifted_out).find("overlaps x"), std::string::npos);

  TensorView rows_overlap = h.outv;
  rows_overlap.strides[1] = 8;
  EXPECT_NE(msg(h.xv, h.scale, h.shift, rows_overlap).find("out.stride(1) must be >= D=96"), std::string::npos);

  float two[2] = {1, 1};
  std::vector<uint8_t> o8(static_cast<size_t>(2 * 4 * 96));
  const TensorView out8 = TensorView::contiguous(o8.data(), DType::f8e4m3fn, Device{}, {2, 4, 96});
  const std::string scale_numel = error_of([&] {
    match_layernorm_modulate_fp8(h.xv, h.scale, h.shift, TensorView::contiguous(two, DType::f32, Device{}, {2}),
                                 out8, o);
  });
  EXPECT_NE(scale_numel.find("input_scale must have exactly 1 element but has 2"), std::string::npos) << scale_numel;
  const std::string fp8_dtype = error_of([&] {
    match_layernorm_modulate_fp8(h.xv, h.scale, h.shift, TensorView::contiguous(two, DType::f32, Device{}, {1}),
                                 h.outv, o);
  });
  EXPECT_NE(fp8_dtype.find("out.dtype must be f8e4m3fn but is bf16"), std::string::npos) << fp8_dtype;
  EXPECT_TRUE(h.out == std::vector<uint16_t>(h.out.size(), 0xFFFF)) << "nothing may be written on bad input";
}

TEST(LayerNormModulateMatching, QkHeadChecks) {
  std::vector<uint16_t> q(2 * 3 * 4 * 136), k(q.size()), qo(q.size()), ko(q.size());
  const Device cpu{};
  auto view = [&](std::vector<uint16_t>& v, int64_t dh) {
    return TensorView::contiguous(v.data(), DType::bf16, cpu, {2, 3, 4, dh});
  };
  const LayerNormModulateOptions o;
  const std::string wide = error_of([&] { match_qk_head_layernorm(view(q, 136), view(k, 136), view(qo, 136), view(ko, 136), o); });
  EXPECT_NE(wide.find("q.shape[3] (head_dim) must be a multiple of 4 in [4, 128] but is 136"), std::string::npos) << wide;
  TensorView strided = view(q, 128);
  strided.strides[0] = 5000;  // batch does not collapse into tokens
  const std::string collapse = error_of([&] { match_qk_head_layernorm(strided, view(k, 128), view(qo, 128), view(ko, 128), o); });
  EXPECT_NE(collapse.find("q.stride(0) must be S * stride(1) = 1536"), std::string::npos) << collapse;
  const std::string alias = error_of([&] { match_qk_head_layernorm(view(q, 128), view(k, 128), view(qo, 128), view(qo, 128), o); });
  EXPECT_NE(alias.find("must not overlap"), std::string::npos) << alias;
}

TEST(LayerNormModulateExplain, ListsEveryCandidateWithItsReason) {
  const Case c{1, 16, 3072, 3072 * 6, true};
  Host h = make_host(c, 1.0f, 1);
  const DispatchReport r = explain_layernorm_modulate(match_layernorm_modulate(h.xv, h.scale, h.shift, h.outv, {}));
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
  Host q = make_host(c, 1.0f, 1, true);
  const DispatchReport r8 = explain_layernorm_modulate(match_layernorm_modulate_fp8(
      q.xv, q.scale, q.shift, TensorView::contiguous(&one, DType::f32, Device{}, {1}), q.outv, {}));
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
