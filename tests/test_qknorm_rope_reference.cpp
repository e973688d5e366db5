// The qknorm_rope CPU reference beyond its driver cases (tests/cases/qknorm_rope_cases.cpp: every
// dtype, head dim, rotary width, pairing, cache layout, rounding and order, padded and packed
// layouts, GQA, many rows and the relations between options, against three oracles: float64, the
// exact chain of docs/qknorm_rope.md and diffusers' chain), what a case cannot express: the 16-bit
// conversions the reference relies on (src/reference/half.h) against an independent decoding and
// rounding; positions far beyond any buffer a case allocates (a sparse cache of 2^20 rows, int64
// positions past 2^32 through a shifted base pointer), each giving the bytes of the same rows held
// in a small cache; null data pointers of an empty call; calls the reference itself refuses.
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

// `p`'s call on a small cache holding the cache rows its tokens read (`rows` of `rows_of`), each
// token's position remapped to its row there: the bytes `p` must give.
std::vector<uint16_t> same_rows_in_a_small_cache(const Problem& p, const std::vector<int64_t>& rows,
                                                 const float* rows_of, int64_t row_stride) {
  const Spec& s = p.s;
  const int64_t width = s.full ? 2 * s.R : s.R;
  std::vector<float> small(static_cast<size_t>(s.T * width));
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t i = 0; i < width; ++i)
      small[t * width + i] = rows_of[rows[t] * row_stride + i];
  Problem q = p;
  std::vector<int64_t> remapped(s.T);
  for (int64_t t = 0; t < s.T; ++t) remapped[t] = t;
  q.s.P = s.T;
  store_positions(q, remapped);
  q.call.q.data = q.act.data() + q.q_offset;
  q.call.k.data = q.act.data() + q.k_offset;
  q.call.q_weight.data = q.q_weight.data();
  q.call.k_weight.data = q.k_weight.data();
  q.call.cos_sin_cache = make_view(small.data(), DType::f32, {s.T, width}, {width, 1});
  ditops::qknorm_rope_reference(q.call);
  return q.act;
}
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
    const std::vector<uint16_t> want = same_rows_in_a_small_cache(p, positions, big.get(), s.R);
    ditops::qknorm_rope_reference(p.call);
    EXPECT_EQ(p.act, want) << s.describe();
    EXPECT_NE(p.act, p.act_before) << s.describe();
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
  std::vector<int64_t> in_block(s.T);
  for (int64_t t = 0; t < s.T; ++t) in_block[t] = positions[t] - first;
  const std::vector<uint16_t> want = same_rows_in_a_small_cache(p, in_block, block.data(), row_stride);
  ditops::qknorm_rope_reference(p.call);
  EXPECT_EQ(p.act, want) << s.describe();
  EXPECT_NE(p.act, p.act_before) << s.describe();
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

}  // namespace
