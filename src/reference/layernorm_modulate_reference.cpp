// CPU reference of layernorm_modulate, layernorm_modulate_fp8 and qk_head_layernorm: the portable
// oracle every CUDA implementation is compared with.
//
// Statistics: ref::aten_row_stats (aten's order; rstd correctly rounded, see aten_layer_norm.h).
// Then, per element, the eager chain's rounding steps (docs/layernorm_modulate.md), each one
// IEEE binary32 operation (this file is compiled with -ffp-contract=off) followed by an exact
// bf16 round-to-nearest-even:
//   y   = bf16(rstd * (x - mean))                  F.layer_norm's store (no FMA)
//   op  = bf16(1 + scale)                          `1 + scale` materialized in bf16
//   p   = bf16(y * op)                             the bf16 multiply
//   out = has_shift ? bf16(p + shift) : p          the bf16 add (absent: -0 survives)
//   fp8 = e4m3(clamp(float(out) * inv, -448, 448)) inv = 1 / input_scale (IEEE; NaN propagates)
//   fp8_rowwise: the row's out values, then reference/fp8_rowwise.h's recipe (scale, e4m3 by division)
// qk_head_layernorm stores y.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "ditops/layernorm_modulate.h"
#include "reference/aten_layer_norm.h"
#include "reference/fp8_rowwise.h"
#include "reference/half.h"

namespace ditops {

uint8_t float_to_e4m3fn(float value) {
  const uint32_t bits = ref::float_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  // NaN, infinities and everything from 480 up (the midpoint between 448, the largest finite
  // value, and 512, which does not exist) become the NaN code 0x7F, as c10 converts.
  if (abs >= 0x43F00000u) return static_cast<uint8_t>(sign | 0x7Fu);
  const float a = ref::bits_float(abs);
  if (abs < 0x3C800000u) {  // a < 2^-6: subnormal e4m3, quantum 2^-9
    const float s = a * 512.0f;  // exact (scaling by a power of two, no overflow)
    uint32_t n = static_cast<uint32_t>(s);  // truncation, exact for s < 8
    const float frac = s - static_cast<float>(n);  // exact
    if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
    return static_cast<uint8_t>(sign | n);  // n == 8 is the smallest normal, 0x08: correct code
  }
  // Normal: exponent in [-6, 8], keep 3 of the 23 mantissa bits, ties to even. A carry out of
  // the mantissa moves into the exponent field, which is the right next value.
  const uint32_t exponent = (abs >> 23) - 127u + 7u;
  uint32_t keep = (abs >> 20) & 7u;
  const uint32_t rest = abs & 0xFFFFFu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) ++keep;
  return static_cast<uint8_t>(sign | ((exponent << 3) + keep));
}

float e4m3fn_to_float(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return std::copysign(NAN, sign);
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

namespace {

float bf16_round(float v) { return ref::bf16_to_float(ref::float_to_bf16_rne(v)); }

float clamp_fp8_range(float v) {
  if (std::isnan(v)) return v;  // torch.clamp propagates NaN
  return v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v);
}

const uint16_t* bf16_at(const TensorView& t, int64_t offset) {
  return static_cast<const uint16_t*>(t.data) + offset;
}

// Rows [begin, end) of a bf16_out / fp8_out call.
void modulate_rows(const LayerNormModulateCall& c, float inv, int64_t begin, int64_t end) {
  const int D = c.dim;
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / c.seq, s = r % c.seq;
    const uint16_t* x = bf16_at(c.x, b * c.x.strides[0] + s * c.x.strides[1]);
    for (int i = 0; i < D; ++i) row[static_cast<size_t>(i)] = ref::bf16_to_float(x[i]);
    const ref::RowStats st = ref::aten_row_stats(row.data(), D, c.options.eps);
    if (c.write_stats) {
      float* stats = static_cast<float*>(c.options.stats_out.data) + 2 * r;
      stats[0] = st.mean;
      stats[1] = st.rstd;
    }
    const uint16_t* scale = bf16_at(c.scale, b * c.scale.strides[0]);
    const uint16_t* shift = c.has_shift ? bf16_at(c.shift, b * c.shift.strides[0]) : nullptr;
    const int64_t out_offset = b * c.out.strides[0] + s * c.out.strides[1];
    uint16_t amax = 0;
    for (int i = 0; i < D; ++i) {
      const float y = bf16_round(st.rstd * (row[static_cast<size_t>(i)] - st.mean));
      const float op = bf16_round(1.0f + ref::bf16_to_float(scale[i]));
      float v = bf16_round(y * op);
      if (shift) v = bf16_round(v + ref::bf16_to_float(shift[i]));
      if (c.kind == LnModulateKind::fp8_out) {
        static_cast<uint8_t*>(c.out.data)[out_offset + i] = float_to_e4m3fn(clamp_fp8_range(v * inv));
      } else if (c.kind == LnModulateKind::fp8_rowwise) {
        row[static_cast<size_t>(i)] = v;  // x's value is not read again
        amax = std::max(amax, ref::magnitude_bits(ref::float_to_bf16_rne(v)));
      } else {
        static_cast<uint16_t*>(c.out.data)[out_offset + i] = ref::float_to_bf16_rne(v);
      }
    }
    if (c.kind == LnModulateKind::fp8_rowwise) {  // the rowwise recipe of the held bf16 row
      const float scale_of_row = ref::fp8_rowwise_scale(amax, DType::bf16);
      static_cast<float*>(c.out_scale.data)[r] = scale_of_row;
      for (int i = 0; i < D; ++i)
        static_cast<uint8_t*>(c.out.data)[out_offset + i] = ref::fp8_rowwise_e4m3(row[static_cast<size_t>(i)], scale_of_row);
    }
  }
}

// Rows [begin, end) of one side of a qk_head call (rows ordered token-major, then head).
void head_rows(const LayerNormModulateCall& c, const TensorView& in, const TensorView& out,
               int heads, int64_t begin, int64_t end) {
  const int D = c.dim;
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t r = begin; r < end; ++r) {
    const int64_t t = r / heads, h = r % heads;
    const uint16_t* x = bf16_at(in, t * in.strides[1] + h * in.strides[2]);
    for (int i = 0; i < D; ++i) row[static_cast<size_t>(i)] = ref::bf16_to_float(x[i]);
    const ref::RowStats st = ref::aten_row_stats(row.data(), D, c.options.eps);
    uint16_t* y = static_cast<uint16_t*>(out.data) + t * out.strides[1] + h * out.strides[2];
    for (int i = 0; i < D; ++i)
      y[i] = ref::float_to_bf16_rne(st.rstd * (row[static_cast<size_t>(i)] - st.mean));
  }
}

template <typename F>
void parallel_rows(int64_t rows, int64_t row_cost, F&& f) {
  const int64_t work = rows * row_cost;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(1, work / (1 << 18))));
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(rows, 1)));
  if (threads <= 1) {
    f(0, rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (rows + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    const int64_t b = i * per, e = std::min(rows, b + per);
    if (b < e) pool.emplace_back([&f, b, e] { f(b, e); });
  }
  for (auto& t : pool) t.join();
}

}  // namespace

void layernorm_modulate_reference(const LayerNormModulateCall& c) {
  auto on_cpu = [](const TensorView& t) { return !t.data || t.device.kind == DeviceKind::cpu; };
  if (!on_cpu(c.x) || !on_cpu(c.out) || !on_cpu(c.scale) || !on_cpu(c.shift) ||
      !on_cpu(c.input_scale) || !on_cpu(c.x2) || !on_cpu(c.out2) || !on_cpu(c.out_scale))
    throw Error("layernorm_modulate reference: every tensor must be on the cpu");
  if (c.dim <= 0 || c.dim % 4 != 0) throw Error("layernorm_modulate reference: bad D");
  if (c.kind == LnModulateKind::qk_head) {
    parallel_rows(c.rows, c.dim, [&](int64_t b, int64_t e) { head_rows(c, c.x, c.out, c.heads, b, e); });
    parallel_rows(c.rows2, c.dim, [&](int64_t b, int64_t e) { head_rows(c, c.x2, c.out2, c.heads2, b, e); });
    return;
  }
  float inv = 1.0f;
  if (c.kind == LnModulateKind::fp8_out) inv = 1.0f / *static_cast<const float*>(c.input_scale.data);
  parallel_rows(c.rows, c.dim, [&](int64_t b, int64_t e) { modulate_rows(c, inv, b, e); });
}

}  // namespace ditops
