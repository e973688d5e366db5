// Tests of the qknorm_rope CPU reference (src/reference/qknorm_rope_reference.cpp) and of the
// 16-bit conversions it relies on (src/reference/half.h).
//
// Two independent oracles, both written here without the reference's code:
//   * float64: rms = sqrt(mean(x^2) + eps), n = x / rms * w, y = n0*c -+ n1*s in double, with a
//     tolerance derived from the roundings the contract performs (see `tolerance` below);
//   * the exact chain: docs/qknorm_rope.md re-transcribed op by op (products via exact double
//     products rounded once to fp32, 16-bit rounding via frexp/nearbyint in double, the sums of
//     squares with separately written trees), compared bit for bit.
// The float64 oracle catches wrong pairing / cache indexing / signs / positions / strides; the
// exact chain catches wrong reduction orders and wrong rounding points, which stay far below any
// float64 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ditops/qknorm_rope.h"
#include "reference/half.h"
#include "rounding_oracle.h"

namespace {

using ditops::DType;
using ditops::QkNormOrder;
using ditops::QkNormRopeCall;
using ditops::QkNormWeightRounding;
using ditops::QkRounding;
using ditops::TensorView;

const char* name_of(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    default: return "?";
  }
}

size_t bytes_of(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::i64: return 8;
    default: return 2;
  }
}

// ---------------------------------------------------------------------------------------------
// Independent 16-bit formats, in double arithmetic (no bit tricks shared with half.h).

struct Format {
  int precision;      // significant bits including the implicit one
  int min_exponent;   // exponent of the smallest normal
  int exponent_bits;
  double max_finite;
};

Format format_of(DType t) {
  if (t == DType::f16) return {11, -14, 5, 65504.0};
  return {8, -126, 8, std::ldexp(255.0 / 128.0, 127)};  // bf16: 0x7F7F = 1.9921875 * 2^127
}

// Unit roundoff (half an ulp, relative) of the 16-bit dtype.
double unit_roundoff(DType t) { return std::ldexp(1.0, -format_of(t).precision); }

// Round to nearest even into the format (subnormals, overflow to inf, NaN stays NaN).
double round_format(double v, DType t) {
  if (std::isnan(v) || std::isinf(v) || v == 0.0) return v;
  const Format f = format_of(t);
  int k = 0;
  std::frexp(std::fabs(v), &k);  // |v| = m * 2^k, m in [0.5, 1): leading bit at 2^(k-1)
  const int e = std::max(k - 1, f.min_exponent);
  const double quantum = std::ldexp(1.0, e - (f.precision - 1));
  const double r = std::nearbyint(v / quantum) * quantum;  // exact scaling, RNE (default mode)
  if (std::fabs(r) > f.max_finite) return std::copysign(INFINITY, v);
  return r;
}

// Value of a 16-bit pattern from the format definition.
double decode(uint16_t bits, DType t) {
  const Format f = format_of(t);
  const int mant_bits = f.precision - 1;
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> mant_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = bits & ((1 << mant_bits) - 1);
  if (exponent == (1 << f.exponent_bits) - 1) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - bias - mant_bits);
  return sign * std::ldexp(mantissa + (1 << mant_bits), exponent - bias - mant_bits);
}

uint16_t encode(float v, DType t) {
  return t == DType::f16 ? ditops::ref::float_to_fp16_rne(v) : ditops::ref::float_to_bf16_rne(v);
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---------------------------------------------------------------------------------------------
// HalfConversion

TEST(HalfConversion, Fp16AllPatternsWidenExactlyAndRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = ditops::ref::fp16_to_float(static_cast<uint16_t>(h));
    const double want = decode(static_cast<uint16_t>(h), DType::f16);
    ASSERT_TRUE(same_value(f, want)) << std::hex << h;
    const uint16_t back = ditops::ref::float_to_fp16_rne(f);
    if (std::isnan(want)) {
      ASSERT_TRUE((back & 0x7C00) == 0x7C00 && (back & 0x3FF) != 0 && (back & 0x200)) << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000);
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfConversion, Bf16AllPatternsWidenExactlyAndRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = ditops::ref::bf16_to_float(static_cast<uint16_t>(h));
    const double want = decode(static_cast<uint16_t>(h), DType::bf16);
    ASSERT_TRUE(same_value(f, want)) << std::hex << h;
    const uint16_t back = ditops::ref::float_to_bf16_rne(f);
    if (std::isnan(want)) {
      ASSERT_TRUE((back & 0x7F80) == 0x7F80 && (back & 0x40)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000);
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfConversion, NarrowingMatchesIndependentRounding) {
  std::vector<float> values = {
      0.f, -0.f, 1.f, -1.f, 65504.f, 65519.996f, 65520.f, -65520.f, 65536.f, 1e10f, FLT_MAX,
      -FLT_MAX, INFINITY, -INFINITY, std::ldexp(1.f, -14), std::ldexp(1.f, -24),
      std::ldexp(1.f, -25), std::nextafter(std::ldexp(1.f, -25), 1.f), std::ldexp(3.f, -26),
      std::ldexp(5.f, -26), std::ldexp(1023.5f, -24), std::ldexp(1.f, -14) - std::ldexp(1.f, -26),
      1.f + std::ldexp(1.f, -11), 1.f + std::ldexp(3.f, -11), 1.f + std::ldexp(1.f, -8),
      1.f + std::ldexp(3.f, -8), std::ldexp(1.f, -126), std::ldexp(1.f, -149),
      std::ldexp(255.5f / 128.f, 127), std::ldexp(255.25f / 128.f, 127)};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = any_bits(rng);
    if (i % 2) bits = (bits & 0x87FFFFFFu) | 0x30000000u;  // concentrate on fp16's range
    float f;
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  for (DType t : {DType::f16, DType::bf16}) {
    for (float f : values) {
      const uint16_t got = encode(f, t);
      const double want = round_format(f, t);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(decode(got, t))) << name_of(t);
        continue;
      }
      ASSERT_TRUE(same_value(decode(got, t), want))
          << name_of(t) << " " << std::hexfloat << f << " got " << decode(got, t) << " want "
          << want;
    }
  }
  // Signaling NaNs whose payload lives only in the low bits stay NaN (and become quiet).
  for (uint32_t bits : {0x7F800001u, 0xFF800001u, 0x7F801000u, 0x7FC00000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    EXPECT_TRUE(std::isnan(ditops::ref::bf16_to_float(ditops::ref::float_to_bf16_rne(f))));
    EXPECT_TRUE(std::isnan(ditops::ref::fp16_to_float(ditops::ref::float_to_fp16_rne(f))));
  }
}

TEST(HalfConversion, LoadStoreAct) {
  uint16_t h[2] = {};
  float f[2] = {};
  ditops::ref::store_act(h, 1, DType::f16, 1.5f);
  EXPECT_EQ(h[1], 0x3E00);
  EXPECT_EQ(ditops::ref::load_act(h, 1, DType::f16), 1.5f);
  ditops::ref::store_act(h, 0, DType::bf16, -2.f);
  EXPECT_EQ(h[0], 0xC000);
  EXPECT_EQ(ditops::ref::load_act(h, 0, DType::bf16), -2.f);
  ditops::ref::store_act(f, 1, DType::f32, 0.1f);
  EXPECT_EQ(ditops::ref::load_act(f, 1, DType::f32), 0.1f);
  EXPECT_THROW(ditops::ref::load_act(f, 0, DType::u8), ditops::Error);
}

// ---------------------------------------------------------------------------------------------
// Problem construction: q/k rows in one 16-bit buffer (separate padded q and k regions, or one
// packed QKV buffer), weights, a cos/sin cache and positions, all filled from fixed seeds.

struct Spec {
  DType act = DType::bf16;
  DType cache = DType::f32;
  DType pos = DType::i64;
  int D = 128;
  int R = 128;
  bool neox = false;
  bool full = false;
  bool per_channel = false;  // full width with different cos/sin on every channel
  QkRounding rounding = QkRounding::rounded;
  QkNormOrder order = QkNormOrder::aten;
  QkNormWeightRounding weight_rounding = QkNormWeightRounding::once;
  int64_t T = 9;
  int Hq = 3;
  int Hk = 1;
  float eps = 1e-6f;
  double amp = 1.0;
  bool packed = false;        // q and k are views into one [T, (Hq + 2 Hk) D + gap] buffer
  int64_t token_gap = 8;      // extra elements after each token's row block (untouched)
  int64_t head_pad = 0;       // head stride D + head_pad (not packed only; untouched)
  int64_t P = 67;             // cache rows
  int64_t cache_pad = 0;      // extra elements per cache row
  int64_t pos_stride = 1;
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream o;
    o << name_of(act) << " D=" << D << " R=" << R << (neox ? " neox" : " interleaved")
      << (full ? (per_channel ? " full(per-channel)" : " full") : " compact") << " cache="
      << name_of(cache) << " pos=" << name_of(pos) << " rounding="
      << (rounding == QkRounding::rounded ? "rounded" : "fp32")
      << " order=" << ditops::qk_norm_order_name(order)
      << " weight_rounding=" << ditops::qk_norm_weight_rounding_name(weight_rounding) << " T=" << T
      << " Hq=" << Hq << " Hk=" << Hk << " eps=" << eps << " amp=" << amp
      << (packed ? " packed" : "") << " gap=" << token_gap << " head_pad=" << head_pad
      << " seed=" << seed;
    return o.str();
  }
};

TensorView make_view(void* data, DType dtype, std::vector<int64_t> shape,
                     std::vector<int64_t> strides) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = {ditops::DeviceKind::cpu, 0};
  v.rank = static_cast<int>(shape.size());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

struct Problem {
  Spec s;
  std::vector<uint16_t> act;         // q, k (and V, gaps) live here
  std::vector<uint16_t> act_before;  // the inputs
  std::vector<char> is_row;          // elements a q/k row owns (everything else: untouched)
  int64_t q_offset = 0, k_offset = 0, q_token_stride = 0, k_token_stride = 0, head_stride = 0;
  std::vector<uint16_t> q_weight, k_weight;
  std::vector<unsigned char> cache;  // default cache storage ([P, width + pad])
  std::vector<int64_t> positions;    // positions[t] (the values the call sees)
  std::vector<unsigned char> position_storage;
  QkNormRopeCall call;

  int64_t row_offset(int64_t t, int h, bool is_q) const {
    return is_q ? q_offset + t * q_token_stride + h * head_stride
                : k_offset + t * k_token_stride + h * head_stride;
  }
  double cache_value(int64_t position, int64_t index) const {
    const TensorView& c = call.cos_sin_cache;
    return ditops::ref::load_act(c.data, position * c.stride(0) + index, c.dtype);
  }
  double weight(bool is_q, int i) const {
    return decode(is_q ? q_weight[i] : k_weight[i], s.act);
  }
};

void store_positions(Problem& p, std::vector<int64_t> values) {
  const Spec& s = p.s;
  p.positions = std::move(values);
  const int64_t slots = s.T * s.pos_stride;
  p.position_storage.assign(std::max<int64_t>(1, slots) * bytes_of(s.pos), 0);
  std::mt19937 rng(s.seed + 99);
  for (int64_t i = 0; i < slots; ++i) {  // the skipped slots hold other (valid) positions
    const int64_t v = (i % s.pos_stride == 0) ? p.positions[i / s.pos_stride]
                                              : static_cast<int64_t>(rng() % s.P);
    if (s.pos == DType::i64) {
      std::memcpy(p.position_storage.data() + i * 8, &v, 8);
    } else {
      const int32_t v32 = static_cast<int32_t>(v);
      std::memcpy(p.position_storage.data() + i * 4, &v32, 4);
    }
  }
  p.call.positions =
      make_view(p.position_storage.data(), s.pos, {s.T}, {s.pos_stride});
}

// Writes one cache row (width = R or 2R) in the cache dtype at `row`.
void fill_cache_row(const Spec& s, void* row, int64_t position, const std::vector<double>& phase) {
  const int half = s.R / 2;
  auto put = [&](int64_t index, double value) {
    ditops::ref::store_act(row, index, s.cache, static_cast<float>(value));
  };
  if (!s.full) {
    for (int j = 0; j < half; ++j) {
      const double angle = static_cast<double>(position) * std::pow(10000.0, -2.0 * j / s.R);
      put(j, std::cos(angle));
      put(half + j, std::sin(angle));
    }
    return;
  }
  for (int c = 0; c < s.R; ++c) {
    // The compact frequency of the channel's pair, so full == compact unless per_channel.
    const int j = s.neox ? c % half : c / 2;
    double angle = static_cast<double>(position) * std::pow(10000.0, -2.0 * j / s.R);
    if (s.per_channel) angle += phase[c];
    put(c, std::cos(angle));
    put(s.R + c, std::sin(angle));
  }
}

Problem make_problem(const Spec& s) {
  Problem p;
  p.s = s;
  std::mt19937 rng(s.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  const int64_t D = s.D;

  // Layout.
  int64_t total = 0;
  p.head_stride = s.packed ? D : D + s.head_pad;
  if (s.packed) {
    const int64_t width = (s.Hq + 2 * s.Hk) * D + s.token_gap;
    p.q_offset = 0;
    p.k_offset = s.Hq * D;
    p.q_token_stride = p.k_token_stride = width;
    total = s.T * width;
  } else {
    p.q_token_stride = s.Hq * p.head_stride + s.token_gap;
    p.k_token_stride = s.Hk * p.head_stride + 2 * s.token_gap;
    p.q_offset = 4;  // a few leading elements that must stay untouched too
    p.k_offset = p.q_offset + s.T * p.q_token_stride + 4;
    total = p.k_offset + s.T * p.k_token_stride + 4;
  }
  total = std::max<int64_t>(total, 16);
  p.act.resize(total);
  p.is_row.assign(total, 0);
  // Everything (V, gaps, padding) starts as random finite 16-bit values; rows get N(0,1)*amp.
  for (auto& e : p.act) e = encode(static_cast<float>(normal(rng)), s.act);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int hh = 0; hh < s.Hq + s.Hk; ++hh) {
      const bool is_q = hh < s.Hq;
      const int64_t base = p.row_offset(t, is_q ? hh : hh - s.Hq, is_q);
      for (int64_t i = 0; i < D; ++i) {
        uint16_t v;
        do {  // never zero
          v = encode(static_cast<float>(normal(rng) * s.amp), s.act);
        } while ((v & 0x7FFF) == 0);
        p.act[base + i] = v;
        p.is_row[base + i] = 1;
      }
    }
  }
  p.act_before = p.act;

  for (auto* w : {&p.q_weight, &p.k_weight}) {
    w->resize(D);
    for (auto& e : *w) {
      const double sign = (rng() & 1) ? 1.0 : -1.0;
      e = encode(static_cast<float>(sign * uniform(rng)), s.act);
    }
  }

  // Cache.
  const int64_t width = s.full ? 2 * s.R : s.R;
  const int64_t row_stride = width + s.cache_pad;
  p.cache.assign(s.P * row_stride * bytes_of(s.cache), 0);
  std::vector<double> phase(s.R);
  for (auto& ph : phase) ph = normal(rng) * 3.0;
  for (int64_t r = 0; r < s.P; ++r) {
    fill_cache_row(s, p.cache.data() + r * row_stride * bytes_of(s.cache), r, phase);
    for (int64_t i = width; i < row_stride; ++i) {  // padding: something that would hurt
      ditops::ref::store_act(p.cache.data(), r * row_stride + i, s.cache, 1e4f);
    }
  }

  // The call, filled by hand (no facade).
  QkNormRopeCall& c = p.call;
  c.q = make_view(p.act.data() + p.q_offset, s.act, {s.T, s.Hq, D},
                  {p.q_token_stride, p.head_stride, 1});
  c.k = make_view(p.act.data() + p.k_offset, s.act, {s.T, s.Hk, D},
                  {p.k_token_stride, p.head_stride, 1});
  c.q_weight = make_view(p.q_weight.data(), s.act, {D}, {1});
  c.k_weight = make_view(p.k_weight.data(), s.act, {D}, {1});
  c.cos_sin_cache = make_view(p.cache.data(), s.cache, {s.P, width}, {row_stride, 1});
  c.options.is_neox = s.neox;
  c.options.eps = s.eps;
  c.options.rope_dim = s.R;
  c.options.cache_full_width = s.full;
  c.options.rounding = s.rounding;
  c.options.norm_order = s.order;
  c.options.norm_weight_rounding = s.weight_rounding;
  c.num_tokens = s.T;
  c.num_q_heads = s.Hq;
  c.num_k_heads = s.Hk;
  c.head_dim = s.D;
  c.rope_dim = s.R;

  std::vector<int64_t> positions(s.T);
  for (auto& v : positions) v = static_cast<int64_t>(rng() % s.P);
  store_positions(p, positions);
  return p;
}

// ---------------------------------------------------------------------------------------------
// The exact chain of docs/qknorm_rope.md, written independently of the reference.

// fp32 product as one rounding: the double product of two floats is exact.
float mul32(float a, float b) { return static_cast<float>(static_cast<double>(a) * b); }
float rne16(double v, DType t) { return static_cast<float>(round_format(v, t)); }

// shfl_down semantics over 32 lanes (lanes read their partner before it is overwritten when
// walking upwards); returns lane 0.
float shfl_down_tree(std::vector<float> s) {
  s.resize(32, 0.f);
  for (int offset = 16; offset > 0; offset >>= 1)
    for (int lane = 0; lane + offset < 32; ++lane) s[lane] = s[lane] + s[lane + offset];
  return s[0];
}

float fma_chain(const std::vector<float>& x, int begin, int count) {
  float p = 0.f;
  for (int i = begin; i < begin + count; ++i) p = std::fma(x[i], x[i], p);
  return p;
}

float aten_sum(const std::vector<float>& x) {
  const int threads = static_cast<int>(x.size()) / 4;
  std::vector<float> warp0, warp1;
  for (int v = 0; v < threads; ++v) (v < 32 ? warp0 : warp1).push_back(fma_chain(x, 4 * v, 4));
  const float w0 = shfl_down_tree(warp0);
  const float w1 = shfl_down_tree(warp1);  // +0 when there is a single warp
  return w0 + w1;                           // inter-warp: offset 2 adds +0, offset 1
}

float warp_sum(const std::vector<float>& x) {  // XOR butterfly, all lanes simultaneously
  const int group = static_cast<int>(x.size()) / 32;
  std::vector<float> s(32);
  for (int lane = 0; lane < 32; ++lane) s[lane] = fma_chain(x, lane * group, group);
  for (int mask = 16; mask > 0; mask >>= 1) {
    std::vector<float> next(32);
    for (int lane = 0; lane < 32; ++lane) next[lane] = s[lane] + s[lane ^ mask];
    s = next;
  }
  return s[0];
}

// x.float().pow(2).mean(-1)'s order (docs/qknorm_rope.md §1): each square rounded to fp32, 32
// threads, at D = 128 thread t adds its four elements 4t .. 4t+3 left to right, at D = 64 its
// elements t and t + 32; then the shfl_down tree.
float aten_mean_sum(const std::vector<float>& x) {
  const int D = static_cast<int>(x.size());
  std::vector<float> sq(D), threads(32);
  for (int i = 0; i < D; ++i) sq[i] = mul32(x[i], x[i]);
  for (int t = 0; t < 32; ++t)
    threads[t] = D == 64 ? sq[t] + sq[t + 32] : ((sq[4 * t] + sq[4 * t + 1]) + sq[4 * t + 2]) + sq[4 * t + 3];
  return shfl_down_tree(threads);
}

float factor_of(float total, int D, float eps) {
  const float ms = total / static_cast<float>(D);
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(ms + eps)));
}

// The exact output row (as fp32 values of the 16-bit results).
std::vector<float> exact_row(const Spec& s, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& cos,
                             const std::vector<float>& sin) {
  const float total = s.order == QkNormOrder::aten ? aten_sum(x)
                      : s.order == QkNormOrder::warp ? warp_sum(x) : aten_mean_sum(x);
  const float f = factor_of(total, s.D, s.eps);
  const bool twice = s.weight_rounding == QkNormWeightRounding::twice;
  std::vector<float> n(s.D), y(s.D);
  for (int i = 0; i < s.D; ++i) {
    if (s.rounding == QkRounding::rounded && twice)
      n[i] = rne16(mul32(rne16(mul32(x[i], f), s.act), w[i]), s.act);
    else
      n[i] = s.rounding == QkRounding::rounded ? rne16(mul32(w[i], mul32(f, x[i])), s.act)
                                               : mul32(x[i], mul32(f, w[i]));
    y[i] = rne16(n[i], s.act);
  }
  auto term = [&](float a, float c, float b, float sn, bool minus) -> float {
    if (s.rounding == QkRounding::fp32) {
      const float bs = mul32(b, sn);
      return rne16(std::fma(a, c, minus ? -bs : bs), s.act);
    }
    if (s.cache == DType::f32) {
      const float ac = mul32(a, c), bs = mul32(b, sn);
      return rne16(minus ? ac - bs : ac + bs, s.act);
    }
    const float p1 = rne16(mul32(a, c), s.act), p2 = rne16(mul32(b, sn), s.act);
    return rne16(minus ? p1 - p2 : p1 + p2, s.act);
  };
  const int half = s.R / 2;
  for (int j = 0; j < half; ++j) {
    const int i0 = s.neox ? j : 2 * j, i1 = s.neox ? j + half : 2 * j + 1;
    y[i0] = term(n[i0], cos[i0], n[i1], sin[i0], true);
    y[i1] = term(n[i1], cos[i1], n[i0], sin[i1], false);
  }
  return y;
}

// Per-channel cos/sin (channel c < R) of a token, per the cache layout.
void channel_cos_sin(const Problem& p, int64_t position, std::vector<float>* cos,
                     std::vector<float>* sin) {
  const Spec& s = p.s;
  const int half = s.R / 2;
  cos->assign(s.D, 0.f);
  sin->assign(s.D, 0.f);
  for (int c = 0; c < s.R; ++c) {
    if (s.full) {
      (*cos)[c] = static_cast<float>(p.cache_value(position, c));
      (*sin)[c] = static_cast<float>(p.cache_value(position, s.R + c));
    } else {
      const int j = s.neox ? c % half : c / 2;
      (*cos)[c] = static_cast<float>(p.cache_value(position, j));
      (*sin)[c] = static_cast<float>(p.cache_value(position, half + j));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Checking.

// |ref - f64| bound for one output. In rounded mode the norm is rounded to the dtype (relative
// error <= u each, u = unit roundoff), a 16-bit cache rounds each product (<= u each), and the
// final store rounds once more (<= u |y|); the fp32 ops add ~D * 2^-24 relative at most. So
//   |err| <= 2u (|a c| + |b s|) + u |y| + O(2^-17) (|a c| + |b s|)
// which holds under cancellation (the |a c| + |b s| term, not |y|); a weight rounding twice adds
// u to the norm, 3u (...) at most. We allow 3u(...) + 2u|y|
// (2u|y| >= 1 ulp of the dtype at |y|) + 1e-5 (...) + a floor for fp16 subnormals. A wrong pair,
// sign, cos/sin index, position, eps or stride costs O(|a c| + |b s|), far above this.
double tolerance(DType act, double magnitude, double y) {
  const double u = unit_roundoff(act);
  const double floor = act == DType::f16 ? std::ldexp(3.0, -24) : 1e-30;
  return 3 * u * magnitude + 2 * u * std::fabs(y) + 1e-5 * magnitude + floor;
}

struct CheckResult {
  int64_t f64_failures = 0;
  int64_t exact_failures = 0;
  int64_t untouched_failures = 0;
  std::string first;
};

CheckResult check_problem(const Problem& p, bool exact = true) {
  const Spec& s = p.s;
  CheckResult r;
  auto note = [&](const std::string& m) {
    if (r.first.empty()) r.first = m;
  };
  for (size_t i = 0; i < p.act.size(); ++i) {
    if (!p.is_row[i] && p.act[i] != p.act_before[i]) {
      ++r.untouched_failures;
      note("element " + std::to_string(i) + " outside every q/k row was written");
    }
  }
  std::vector<float> x(s.D), w(s.D), cos, sin;
  for (int64_t t = 0; t < s.T; ++t) {
    channel_cos_sin(p, p.positions[t], &cos, &sin);
    for (int hh = 0; hh < s.Hq + s.Hk; ++hh) {
      const bool is_q = hh < s.Hq;
      const int h = is_q ? hh : hh - s.Hq;
      const int64_t base = p.row_offset(t, h, is_q);
      // float64 formula.
      double ss = 0;
      for (int i = 0; i < s.D; ++i) {
        x[i] = static_cast<float>(decode(p.act_before[base + i], s.act));
        w[i] = static_cast<float>(p.weight(is_q, i));
        ss += static_cast<double>(x[i]) * x[i];
      }
      const double rms = std::sqrt(ss / s.D + static_cast<double>(s.eps));
      std::vector<double> n(s.D), want(s.D), magnitude(s.D);
      for (int i = 0; i < s.D; ++i) {
        n[i] = x[i] / rms * w[i];
        want[i] = n[i];
        magnitude[i] = std::fabs(n[i]);
      }
      const int half = s.R / 2;
      for (int j = 0; j < half; ++j) {
        const int i0 = s.neox ? j : 2 * j, i1 = s.neox ? j + half : 2 * j + 1;
        want[i0] = n[i0] * cos[i0] - n[i1] * sin[i0];
        want[i1] = n[i1] * cos[i1] + n[i0] * sin[i1];
        magnitude[i0] = std::fabs(n[i0] * cos[i0]) + std::fabs(n[i1] * sin[i0]);
        magnitude[i1] = std::fabs(n[i1] * cos[i1]) + std::fabs(n[i0] * sin[i1]);
      }
      const std::vector<float> bits = exact ? exact_row(s, x, w, cos, sin) : std::vector<float>();
      for (int i = 0; i < s.D; ++i) {
        const double got = decode(p.act[base + i], s.act);
        const double tol = tolerance(s.act, magnitude[i], want[i]);
        auto where = [&] {
          return std::string(is_q ? "q" : "k") + "[" + std::to_string(t) + "," +
                 std::to_string(h) + "," + std::to_string(i) + "]";
        };
        if (!(std::fabs(got - want[i]) <= tol)) {
          ++r.f64_failures;
          std::ostringstream m;
          m << where() << " got " << got << " f64 " << want[i] << " tol " << tol;
          note(m.str());
        }
        if (exact && !same_value(got, bits[i])) {
          ++r.exact_failures;
          std::ostringstream m;
          m << where() << " got " << std::hexfloat << got << " exact chain " << bits[i];
          note(m.str());
        }
      }
    }
  }
  return r;
}

void expect_ok(const CheckResult& r, const std::string& what) {
  EXPECT_EQ(r.untouched_failures, 0) << what << ": " << r.first;
  EXPECT_EQ(r.f64_failures, 0) << what << ": " << r.first;
  EXPECT_EQ(r.exact_failures, 0) << what << ": " << r.first;
}

void run_and_check(const Spec& s, bool exact = true) {
  Problem p = make_problem(s);
  ditops::qknorm_rope_reference(p.call);
  expect_ok(check_problem(p, exact), s.describe());
}

std::vector<int> rope_dims(int D, bool neox) {
  if (D == 64) return neox ? std::vector<int>{64, 32, 16} : std::vector<int>{64, 32, 48, 2};
  return {D, D / 2, 96};
}

// ---------------------------------------------------------------------------------------------
// qknorm_rope_reference

// Every combination of dtype, head_dim, rope_dim, pairing, cache layout, cache dtype, rounding
// mode and norm order against float64 and the exact chain. Positions dtype, amplitude, eps,
// layout (packed or not, token gaps) and position strides rotate across the cases.
TEST(QkNormRopeReference, SweepMatchesFloat64AndExactChain) {
  int index = 0;
  const double amps[] = {1.0, 1e-3, 40.0};
  const float epss[] = {1e-6f, 1e-5f, 1e-2f};
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128, 256})
      for (bool neox : {false, true})
        for (int R : rope_dims(D, neox))
          for (bool full : {false, true})
            for (DType cache : {DType::f32, act})
              for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32})
                for (QkNormOrder order : {QkNormOrder::aten, QkNormOrder::warp}) {
                  Spec s;
                  s.act = act;
                  s.D = D;
                  s.R = R;
                  s.neox = neox;
                  s.full = full;
                  s.cache = cache;
                  s.rounding = rounding;
                  s.order = order;
                  s.pos = index % 2 ? DType::i32 : DType::i64;
                  s.amp = amps[index % 3];
                  s.eps = epss[(index / 3) % 3];
                  s.packed = index % 4 == 1;
                  s.token_gap = index % 5 == 0 ? 0 : 8;
                  s.head_pad = index % 6 == 2 ? 24 : 0;
                  s.pos_stride = index % 7 == 3 ? 3 : 1;
                  s.cache_pad = index % 3 == 2 ? 5 : 0;
                  s.T = 9;
                  s.Hq = 3;
                  s.Hk = 2;
                  s.seed = 1000 + index;
                  ++index;
                  run_and_check(s);
                }
}

TEST(QkNormRopeReference, GqaAndOddTokenCounts) {
  const std::pair<int, int> heads[] = {{8, 2}, {3, 1}, {1, 1}, {2, 4}, {24, 24}};
  int index = 0;
  for (int64_t T : {1, 9, 129})
    for (auto [hq, hk] : heads) {
      Spec s;
      s.T = T;
      s.Hq = hq;
      s.Hk = hk;
      s.act = index % 2 ? DType::f16 : DType::bf16;
      s.D = index % 3 == 0 ? 128 : (index % 3 == 1 ? 64 : 256);
      s.R = s.D;
      s.neox = index % 2 == 0;
      s.pos = index % 2 ? DType::i64 : DType::i32;
      s.P = 300;
      s.seed = 77 + index++;
      run_and_check(s);
    }
}

// q and k are views into one packed [T, (Hq + 2 Hk) D + gap] projection: token strides = the
// packed width, head stride D. V and the gap must not be touched.
TEST(QkNormRopeReference, PackedQkvViewsLeaveVAndGapsUntouched) {
  for (int64_t gap : {0, 8, 13}) {
    for (DType act : {DType::bf16, DType::f16}) {
      Spec s;
      s.packed = true;
      s.token_gap = gap;
      s.act = act;
      s.T = 33;
      s.Hq = 4;
      s.Hk = 2;
      s.D = 128;
      s.R = 64;
      s.neox = true;
      s.seed = 5 + static_cast<uint32_t>(gap);
      Problem p = make_problem(s);
      ASSERT_EQ(p.call.q.stride(0), (s.Hq + 2 * s.Hk) * s.D + gap);
      ASSERT_EQ(p.call.k.stride(0), p.call.q.stride(0));
      ditops::qknorm_rope_reference(p.call);
      const CheckResult r = check_problem(p);
      expect_ok(r, s.describe());
      // Explicitly: the V block of every token is bit-identical.
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t v = t * p.q_token_stride + (s.Hq + s.Hk) * s.D;
        for (int64_t i = 0; i < s.Hk * s.D + gap; ++i)
          ASSERT_EQ(p.act[v + i], p.act_before[v + i]) << "token " << t << " V/gap elem " << i;
      }
    }
  }
}

// A full-width cache holding the compact cache's values twice gives bit-identical results.
TEST(QkNormRopeReference, FullWidthCacheEqualToCompactGivesIdenticalBits) {
  int index = 0;
  for (bool neox : {false, true})
    for (int D : {64, 128, 256})
      for (DType cache : {DType::f32, DType::bf16})
        for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
          Spec s;
          s.neox = neox;
          s.D = D;
          s.R = D == 64 ? 32 : 96;
          s.cache = cache;
          s.rounding = rounding;
          s.T = 17;
          s.seed = 300 + index++;
          Problem compact = make_problem(s);
          s.full = true;
          Problem full = make_problem(s);
          ASSERT_EQ(compact.act_before, full.act_before);
          ASSERT_EQ(compact.positions, full.positions);
          ditops::qknorm_rope_reference(compact.call);
          ditops::qknorm_rope_reference(full.call);
          EXPECT_EQ(compact.act, full.act) << s.describe();
          EXPECT_NE(compact.act, compact.act_before) << s.describe();
        }
}

// Full-width caches whose cos/sin differ on every channel (also between the two channels of a
// pair): float64 with per-channel cos/sin, and the exact chain.
TEST(QkNormRopeReference, FullWidthPerChannelCosSin) {
  int index = 0;
  for (bool neox : {false, true})
    for (DType act : {DType::bf16, DType::f16})
      for (DType cache : {DType::f32, act})
        for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
          Spec s;
          s.full = true;
          s.per_channel = true;
          s.neox = neox;
          s.act = act;
          s.cache = cache;
          s.rounding = rounding;
          s.D = 128;
          s.R = neox ? 64 : 96;
          s.T = 21;
          s.seed = 400 + index++;
          Problem p = make_problem(s);
          // The pair partners really do see different cos/sin.
          std::vector<float> c, sn;
          channel_cos_sin(p, p.positions[0], &c, &sn);
          const int partner = neox ? s.R / 2 : 1;
          ASSERT_NE(c[0], c[partner]);
          ASSERT_NE(sn[0], sn[partner]);
          ditops::qknorm_rope_reference(p.call);
          expect_ok(check_problem(p), s.describe());
        }
}

// Head stride larger than D (the same for q and k) and token strides that are not a multiple of
// anything in particular: the padding between heads stays untouched.
TEST(QkNormRopeReference, PaddedHeadAndTokenStrides) {
  for (int64_t head_pad : {8, 24}) {
    Spec s;
    s.head_pad = head_pad;
    s.token_gap = 3;
    s.T = 11;
    s.Hq = 3;
    s.Hk = 2;
    s.D = 64;
    s.R = 64;
    s.seed = 450 + static_cast<uint32_t>(head_pad);
    Problem p = make_problem(s);
    ASSERT_EQ(p.call.q.stride(1), s.D + head_pad);
    ASSERT_EQ(p.call.k.stride(1), s.D + head_pad);
    ditops::qknorm_rope_reference(p.call);
    expect_ok(check_problem(p), s.describe());
  }
}

TEST(QkNormRopeReference, CacheRowStrideAndPositionStride) {
  for (DType pos : {DType::i32, DType::i64}) {
    Spec s;
    s.pos = pos;
    s.cache_pad = 37;
    s.pos_stride = 5;
    s.T = 40;
    s.full = pos == DType::i64;
    s.seed = 500;
    Problem p = make_problem(s);
    ASSERT_EQ(p.call.cos_sin_cache.stride(0), (s.full ? 2 * s.R : s.R) + 37);
    ditops::qknorm_rope_reference(p.call);
    expect_ok(check_problem(p), s.describe());
  }
}

// Positions up to 2^20 + 7 into a cache of P = 2^20 + 8 rows of 64 fp32 (256 MiB of address
// space; the allocation is left uninitialized, so only the rows written here become resident).
TEST(QkNormRopeReference, LargePositionsSparseCache) {
  for (DType pos : {DType::i32, DType::i64}) {
    Spec s;
    s.pos = pos;
    s.D = 128;
    s.R = 64;
    s.T = 16;
    s.P = 67;
    s.seed = 600;
    Problem p = make_problem(s);
    const int64_t rows = (int64_t{1} << 20) + 8;
    std::unique_ptr<float[]> big(new float[rows * s.R]);  // uninitialized on purpose
    std::vector<int64_t> positions(s.T);
    std::vector<double> no_phase(s.R);
    for (int64_t t = 0; t < s.T; ++t) {
      positions[t] = t % 2 ? rows - 1 - t : 1000003 + 3001 * t;
      fill_cache_row(s, big.get() + positions[t] * s.R, positions[t], no_phase);
    }
    p.s.P = rows;
    store_positions(p, positions);
    p.call.cos_sin_cache = make_view(big.get(), DType::f32, {rows, s.R}, {s.R, 1});
    ditops::qknorm_rope_reference(p.call);
    expect_ok(check_problem(p), s.describe());
  }
}

// int64 positions beyond 2^32 (3e9 + t): the cache view's base pointer is placed so that
// base + position * row_stride lands in a small real buffer. Truncating positions to 32 bits
// (or multiplying in 32 bits) reads far outside it.
TEST(QkNormRopeReference, Int64PositionsBeyond32Bits) {
  Spec s;
  s.pos = DType::i64;
  s.D = 64;
  s.R = 64;
  s.T = 8;
  s.seed = 700;
  Problem p = make_problem(s);
  const int64_t first = 3000000000LL + 12345;
  const int64_t rows = 8, row_stride = 2 * s.R;  // padded rows
  std::vector<float> block(rows * row_stride);
  std::vector<int64_t> positions(s.T);
  std::vector<double> no_phase(s.R);
  for (int64_t t = 0; t < s.T; ++t) {
    positions[t] = first + (t * 5) % rows;
    fill_cache_row(s, block.data() + (positions[t] - first) * row_stride, positions[t],
                   no_phase);
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(block.data()) -
                         static_cast<uintptr_t>(first * row_stride) * sizeof(float);
  p.s.P = first + rows;
  store_positions(p, positions);
  p.call.cos_sin_cache = make_view(reinterpret_cast<void*>(base), DType::f32,
                                   {first + rows, s.R}, {row_stride, 1});
  ditops::qknorm_rope_reference(p.call);
  expect_ok(check_problem(p), s.describe());
}

TEST(QkNormRopeReference, EmptyTokensIsANoOp) {
  Spec s;
  s.T = 0;
  Problem p = make_problem(s);
  ditops::qknorm_rope_reference(p.call);
  EXPECT_EQ(p.act, p.act_before);
  // Null data pointers: nothing may be dereferenced.
  QkNormRopeCall empty = p.call;
  empty.q.data = empty.k.data = empty.positions.data = nullptr;
  empty.cos_sin_cache.data = nullptr;
  EXPECT_NO_THROW(ditops::qknorm_rope_reference(empty));
}

TEST(QkNormRopeReference, RejectsCallsItCannotRunSafely) {
  Spec s;
  Problem p = make_problem(s);
  QkNormRopeCall bad = p.call;
  bad.q.device = {ditops::DeviceKind::cuda, 0};
  EXPECT_THROW(ditops::qknorm_rope_reference(bad), ditops::Error);
  bad = p.call;
  bad.head_dim = 96;
  EXPECT_THROW(ditops::qknorm_rope_reference(bad), ditops::Error);
  bad = p.call;
  bad.rope_dim = 130;
  EXPECT_THROW(ditops::qknorm_rope_reference(bad), ditops::Error);
  EXPECT_EQ(p.act, p.act_before);
}

// (a) At D = 128 the aten and warp orders are the same computation: identical bits.
TEST(QkNormRopeReference, AtenAndWarpOrdersIdenticalAtD128) {
  for (DType act : {DType::bf16, DType::f16})
    for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
      Spec s;
      s.act = act;
      s.rounding = rounding;
      s.D = 128;
      s.R = 128;
      s.T = 256;
      s.Hq = 4;
      s.Hk = 4;
      s.seed = 800;
      Problem aten = make_problem(s);
      s.order = QkNormOrder::warp;
      Problem warp = make_problem(s);
      ditops::qknorm_rope_reference(aten.call);
      ditops::qknorm_rope_reference(warp.call);
      EXPECT_EQ(aten.act, warp.act) << s.describe();
    }
}

// (b) At D = 64 and 256 the orders are different computations: both stay within the float64
// tolerance (and match their own exact chain), and on enough rows they do differ somewhere
// (otherwise one order would be silently running the other).
TEST(QkNormRopeReference, AtenAndWarpOrdersMayDifferAtD64AndD256) {
  for (int D : {64, 256}) {
    Spec s;
    s.act = DType::f16;
    s.rounding = QkRounding::fp32;
    s.D = D;
    s.R = D / 2;
    s.T = 512;
    s.Hq = 4;
    s.Hk = 4;
    s.seed = 900 + D;
    Problem aten = make_problem(s);
    s.order = QkNormOrder::warp;
    Problem warp = make_problem(s);
    ditops::qknorm_rope_reference(aten.call);
    ditops::qknorm_rope_reference(warp.call);
    expect_ok(check_problem(aten), "aten " + s.describe());
    expect_ok(check_problem(warp), "warp " + s.describe());
    EXPECT_NE(aten.act, warp.act) << "D=" << D << ": the orders never differed";
  }
}

// (c) Rounded mode, partial rotary: channels >= R are exactly rne16(w * (factor * x)) with the
// factor from a plain-loop aten-order sum of squares written right here. The data is checked to
// be sensitive: a plain sequential sum (and the warp order at D != 128) gives a different factor
// on some rows, so a wrong reduction order in the reference cannot pass.
TEST(QkNormRopeReference, PassThroughChannelsBitExactWithAtenOrderSum) {
  for (int D : {64, 256}) {
    for (DType act : {DType::bf16, DType::f16}) {
      Spec s;
      s.act = act;
      s.D = D;
      s.R = D == 64 ? 32 : 96;
      s.neox = D == 64;
      s.T = 300;
      s.Hq = 2;
      s.Hk = 2;
      s.seed = 1100 + D;
      Problem p = make_problem(s);
      ditops::qknorm_rope_reference(p.call);
      int64_t sequential_differs = 0, warp_differs = 0, mismatches = 0;
      for (int64_t t = 0; t < s.T; ++t) {
        for (int hh = 0; hh < s.Hq + s.Hk; ++hh) {
          const bool is_q = hh < s.Hq;
          const int64_t base = p.row_offset(t, is_q ? hh : hh - s.Hq, is_q);
          std::vector<float> x(D);
          for (int i = 0; i < D; ++i) x[i] = static_cast<float>(decode(p.act_before[base + i], act));
          // aten order, as plain loops: partials of 4, per virtual warp the shfl_down tree
          // written as "lane v adds lane v + offset", then warp0 + warp1.
          float warp_total[2] = {0.f, 0.f};
          for (int w = 0; w < D / 128 + (D < 128 ? 1 : 0); ++w) {
            float lane[32] = {};
            for (int v = 0; v < 32 && 32 * w + v < D / 4; ++v) {
              float acc = 0.f;
              for (int g = 0; g < 4; ++g) {
                const float e = x[4 * (32 * w + v) + g];
                acc = std::fma(e, e, acc);
              }
              lane[v] = acc;
            }
            for (int offset = 16; offset >= 1; offset /= 2)
              for (int v = 0; v < offset; ++v) lane[v] = lane[v] + lane[v + offset];
            warp_total[w] = lane[0];
          }
          const float f = factor_of(warp_total[0] + warp_total[1], D, s.eps);
          float sequential = 0.f;
          for (int i = 0; i < D; ++i) sequential = std::fma(x[i], x[i], sequential);
          sequential_differs += factor_of(sequential, D, s.eps) != f;
          warp_differs += factor_of(warp_sum(x), D, s.eps) != f;
          for (int i = s.R; i < D; ++i) {
            const float w = static_cast<float>(p.weight(is_q, i));
            const float want = rne16(mul32(w, mul32(f, x[i])), act);
            const double got = decode(p.act[base + i], act);
            if (!same_value(got, want)) ++mismatches;
          }
        }
      }
      EXPECT_EQ(mismatches, 0) << s.describe();
      EXPECT_GT(sequential_differs, 0) << "data not sensitive to the order: " << s.describe();
      EXPECT_GT(warp_differs, 0) << "data not sensitive to the order: " << s.describe();
    }
  }
}

// (d) Many rows (5000 tokens x (2 + 2) heads = 20000 rows: the multithreaded path) give exactly
// what running each token on its own gives, and two runs are identical.
TEST(QkNormRopeReference, MultithreadedEqualsPerTokenAndIsDeterministic) {
  for (QkNormOrder order : {QkNormOrder::aten, QkNormOrder::warp}) {
    Spec s;
    s.T = 5000;
    s.Hq = 2;
    s.Hk = 2;
    s.D = 256;
    s.R = 96;
    s.order = order;
    s.packed = true;
    s.P = 4096;
    s.pos_stride = 2;
    s.seed = 1200;
    Problem whole = make_problem(s);
    Problem again = make_problem(s);
    Problem single = make_problem(s);
    ditops::qknorm_rope_reference(whole.call);
    ditops::qknorm_rope_reference(again.call);
    EXPECT_EQ(whole.act, again.act);
    for (int64_t t = 0; t < s.T; ++t) {
      QkNormRopeCall one = single.call;
      one.num_tokens = 1;
      one.q.shape[0] = one.k.shape[0] = one.positions.shape[0] = 1;
      one.q.data = single.act.data() + single.q_offset + t * single.q_token_stride;
      one.k.data = single.act.data() + single.k_offset + t * single.k_token_stride;
      one.positions.data =
          single.position_storage.data() + t * s.pos_stride * bytes_of(s.pos);
      ditops::qknorm_rope_reference(one);
    }
    EXPECT_EQ(whole.act, single.act);
    expect_ok(check_problem(whole, /*exact=*/false), s.describe());
  }
}

// ---------------------------------------------------------------------------------------------
// diffusers' RMSNorm chain: norm_order=aten_mean, norm_weight_rounding=twice (and once)

// The new modes across dtypes, head dims, pairings, cache layouts and dtypes against float64 and
// the exact chain; twice with the other orders too (a defined function, no eager chain).
TEST(QkNormRopeReference, DiffusersModesSweepMatchesFloat64AndExactChain) {
  int index = 0;
  const double amps[] = {1.0, 1e-3, 40.0};
  const float epss[] = {1e-6f, 1e-5f, 1e-2f};
  struct Mode {
    QkNormOrder order;
    QkNormWeightRounding weight_rounding;
  };
  const Mode modes[] = {{QkNormOrder::aten_mean, QkNormWeightRounding::twice},
                        {QkNormOrder::aten_mean, QkNormWeightRounding::once},
                        {QkNormOrder::aten, QkNormWeightRounding::twice},
                        {QkNormOrder::warp, QkNormWeightRounding::twice}};
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128})
      for (bool neox : {false, true})
        for (int R : {D, D / 2})
          for (bool full : {false, true})
            for (DType cache : {DType::f32, act})
              for (const Mode& mode : modes) {
                Spec s;
                s.act = act;
                s.D = D;
                s.R = R;
                s.neox = neox;
                s.full = full;
                s.cache = cache;
                s.order = mode.order;
                s.weight_rounding = mode.weight_rounding;
                s.pos = index % 2 ? DType::i32 : DType::i64;
                s.amp = amps[index % 3];
                s.eps = epss[(index / 3) % 3];
                s.packed = index % 4 == 1;
                s.token_gap = index % 5 == 0 ? 0 : 8;
                s.T = 9;
                s.Hq = 3;
                s.Hk = 2;
                s.seed = 5000 + index++;
                run_and_check(s);
              }
  for (QkNormOrder order : {QkNormOrder::aten, QkNormOrder::warp}) {  // D = 256 (not aten_mean)
    Spec s;
    s.D = 256;
    s.R = 256;
    s.order = order;
    s.weight_rounding = QkNormWeightRounding::twice;
    s.seed = 5900 + static_cast<uint32_t>(order);
    run_and_check(s);
  }
}

// diffusers' RMSNorm (diffusers/models/normalization.py, RMSNorm.forward, 16-bit weight) as torch
// 2.11 runs it on CUDA, then the eager RoPE chain, emulated op by op in double with every rounding
// explicit (tests/rounding_oracle.h); docs/qknorm_rope.md §6 derives the reduction's order.
//   variance = x.to(float32).pow(2).mean(-1, keepdim=True)
//   y = (x * torch.rsqrt(variance + eps)).to(weight.dtype) * weight
//   out = (y.float() * cos + rotate(y).float() * sin).to(x.dtype)   (fp32 cache)
namespace diffusers_chain {

using ditops::testing_oracle::round_dtype;
using ditops::testing_oracle::round_f32;

// Reduce.cuh for an fp32 row of D values (one output per row, many rows): block.x = 32 threads
// split the row; D >= 128 takes input_vectorized_thread_reduce_impl (aligned vectors of 4 at
// vector index t, t + 32, ..., one accumulator per component), D = 64 thread_reduce_impl
// (vt0 = 4 accumulators, element t + 32 i into accumulator i); the accumulators combine left to
// right, then block_x_reduce's shfl_down (offsets 16 .. 1, lanes past the warp read themselves).
double mean_of_squares(const std::vector<double>& x) {
  const int D = static_cast<int>(x.size());
  std::vector<double> square(D);
  for (int i = 0; i < D; ++i) square[i] = round_f32(x[i] * x[i]);  // pow(2): base * base
  double lane[32];
  for (int t = 0; t < 32; ++t) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    if (D >= 128) {
      for (int v = t; 4 * v + 3 < D; v += 32)
        for (int i = 0; i < 4; ++i) acc[i] = round_f32(acc[i] + square[4 * v + i]);
    } else {
      int idx = t;
      for (int i = 0; i < 4 && idx < D; ++i, idx += 32) acc[i] = round_f32(acc[i] + square[idx]);
    }
    lane[t] = round_f32(round_f32(round_f32(acc[0] + acc[1]) + acc[2]) + acc[3]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    double next[32];
    for (int t = 0; t < 32; ++t) next[t] = round_f32(lane[t] + (t + offset < 32 ? lane[t + offset] : lane[t]));
    std::copy(next, next + 32, lane);
  }
  const double factor = round_f32(1.0 / D);  // MeanOps' factor: outputs / inputs in float
  return round_f32(lane[0] * factor);
}

// One row's output (as doubles holding 16-bit values); cos/sin per channel.
std::vector<double> row(const std::vector<double>& x, const std::vector<double>& w, const std::vector<float>& cos,
                        const std::vector<float>& sin, int R, bool neox, float eps, DType act) {
  const int D = static_cast<int>(x.size());
  const double variance = mean_of_squares(x);
  // rsqrt correctly rounded (the GPU's rsqrtf may differ by an ulp: docs/qknorm_rope.md §4).
  const double factor = round_f32(1.0 / std::sqrt(round_f32(variance + static_cast<double>(eps))));
  std::vector<double> n(D), out(D);
  for (int i = 0; i < D; ++i) {
    const double y = round_dtype(round_f32(x[i] * factor), act);  // fp32 product, .to(weight.dtype)
    n[i] = round_dtype(round_f32(y * w[i]), act);                // 16-bit tensor multiply
    out[i] = n[i];
  }
  const int half = R / 2;
  for (int c = 0; c < R; ++c) {
    const bool first = neox ? c < half : c % 2 == 0;  // rotate(y)[c] = -partner or +partner
    const int partner = neox ? (first ? c + half : c - half) : (first ? c + 1 : c - 1);
    const double rotated = first ? -n[partner] : n[partner];
    out[c] = round_dtype(round_f32(round_f32(n[c] * cos[c]) + round_f32(rotated * sin[c])), act);
  }
  return out;
}

}  // namespace diffusers_chain

TEST(QkNormRopeReference, DiffusersRmsNormTwiceMatchesStepByStepChain) {
  int index = 0;
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128})
      for (bool neox : {false, true})
        for (double amp : {1.0, 1e-2, 30.0}) {
          Spec s;
          s.act = act;
          s.D = D;
          s.R = neox ? D : D / 2;
          s.neox = neox;
          s.full = !neox;  // FLUX-style per-channel cos/sin, or a compact NeoX cache
          s.order = QkNormOrder::aten_mean;
          s.weight_rounding = QkNormWeightRounding::twice;
          s.amp = amp;
          s.eps = index % 2 ? 1e-6f : 1e-5f;
          s.T = 40;
          s.Hq = 3;
          s.Hk = 2;
          s.seed = 6000 + index++;
          Problem p = make_problem(s);
          ditops::qknorm_rope_reference(p.call);
          int64_t mismatches = 0;
          std::string first;
          std::vector<float> cos, sin;
          for (int64_t t = 0; t < s.T; ++t) {
            channel_cos_sin(p, p.positions[t], &cos, &sin);
            for (int hh = 0; hh < s.Hq + s.Hk; ++hh) {
              const bool is_q = hh < s.Hq;
              const int64_t base = p.row_offset(t, is_q ? hh : hh - s.Hq, is_q);
              std::vector<double> x(D), w(D);
              for (int i = 0; i < D; ++i) {
                x[i] = decode(p.act_before[base + i], act);
                w[i] = p.weight(is_q, i);
              }
              const std::vector<double> want = diffusers_chain::row(x, w, cos, sin, s.R, neox, s.eps, act);
              for (int i = 0; i < D; ++i) {
                const double got = decode(p.act[base + i], act);
                if (!same_value(got, want[i])) {
                  if (mismatches++ == 0) {
                    std::ostringstream m;
                    m << "token " << t << " head " << hh << " channel " << i << " got " << std::hexfloat << got
                      << " chain " << want[i];
                    first = m.str();
                  }
                }
              }
            }
          }
          EXPECT_EQ(mismatches, 0) << s.describe() << ": " << first;
        }
}

// The option is not a no-op: on random weights the two roundings of the weight multiply give
// different outputs somewhere; with weights of exactly 1 they are the same computation.
TEST(QkNormRopeReference, WeightRoundingOnceAndTwiceDifferOnRandomWeights) {
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128}) {
      Spec s;
      s.act = act;
      s.D = D;
      s.R = D;
      s.order = QkNormOrder::aten_mean;
      s.T = 64;
      s.Hq = 4;
      s.Hk = 4;
      s.seed = 7000 + D;
      Problem once = make_problem(s);
      s.weight_rounding = QkNormWeightRounding::twice;
      Problem twice = make_problem(s);
      ASSERT_EQ(once.act_before, twice.act_before);
      ASSERT_EQ(once.q_weight, twice.q_weight);
      ditops::qknorm_rope_reference(once.call);
      ditops::qknorm_rope_reference(twice.call);
      int64_t differ = 0;
      for (size_t i = 0; i < once.act.size(); ++i) differ += once.act[i] != twice.act[i];
      EXPECT_GT(differ, 0) << s.describe();

      Problem unit_once = make_problem(s), unit_twice = make_problem(s);
      unit_once.call.options.norm_weight_rounding = QkNormWeightRounding::once;
      for (Problem* p : {&unit_once, &unit_twice})
        for (auto* w : {&p->q_weight, &p->k_weight}) std::fill(w->begin(), w->end(), encode(1.0f, act));
      ditops::qknorm_rope_reference(unit_once.call);
      ditops::qknorm_rope_reference(unit_twice.call);
      EXPECT_EQ(unit_once.act, unit_twice.act) << "weights of 1: " << s.describe();
    }
}

// The aten_mean order against F.rms_norm's (aten): the square of a 16-bit value is exact in
// fp32, so rounding it first changes nothing and only the grouping can differ. At D = 64 it does
// (elements t and t + 32 against four consecutive ones): the outputs differ on some rows. At
// D = 128 both add four consecutive squares left to right, then the same tree: the same bits.
TEST(QkNormRopeReference, AtenMeanOrderAgainstAtenOrder) {
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128}) {
      Spec s;
      s.act = act;
      s.rounding = QkRounding::fp32;  // the factor's last bit reaches the outputs unrounded
      s.D = D;
      s.R = D;
      s.T = 512;
      s.Hq = 4;
      s.Hk = 4;
      s.seed = 7100 + D;
      Problem aten = make_problem(s);
      s.order = QkNormOrder::aten_mean;
      Problem mean = make_problem(s);
      ditops::qknorm_rope_reference(aten.call);
      ditops::qknorm_rope_reference(mean.call);
      expect_ok(check_problem(mean), "aten_mean " + s.describe());
      if (D == 64)
        EXPECT_NE(aten.act, mean.act) << s.describe() << ": the orders never differed";
      else
        EXPECT_EQ(aten.act, mean.act) << s.describe();
    }
}

}  // namespace
