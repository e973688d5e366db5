// CPU reference of norm_scale_shift: the portable oracle every CUDA implementation is compared with.
//
// Contract: docs/norm_scale_shift.md, followed operation by operation, for the eager, sglang and
// float32 numerics (this file is compiled with
// -ffp-contract=off; every FMA of the contract is an explicit std::fma). The only places where the
// GPU may legitimately differ are its approximate instructions, which are correctly rounded here:
// rsqrtf (LayerNorm/RMSNorm rstd, up to 2 fp32 ulp: reference/aten_layer_norm.h), rcp.approx.ftz
// (NVFP4 scales) and div.full.f32 (fp8 inv = 1/input_scale): reference/fp8_fp4.h. fp8_rowwise is
// the recipe of reference/fp8_rowwise.h over the row's rounded y.
// The call is assumed validated by the facade (match_norm_scale_shift).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ditops/norm_scale_shift.h"
#include "reference/aten_layer_norm.h"
#include "reference/fp8_fp4.h"
#include "reference/fp8_rowwise.h"
#include "reference/half.h"

namespace ditops {
namespace {

constexpr int kWarp = 32;

const char* at(const TensorView& t, int64_t element_offset) {
  return static_cast<const char*>(t.data) + element_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

// Element offset of (b, s) in a [B, S, D] view (the last stride is 1).
int64_t row_offset(const TensorView& t, int64_t b, int64_t s) { return b * t.strides[0] + s * t.strides[1]; }

struct OperandRow {
  const NssOperand* op = nullptr;
  const void* base = nullptr;  // element (b, s, 0)
  DType dtype = DType::bf16;
  float value(int64_t c, float absent) const {
    if (op->kind == NssOperand::Kind::absent) return absent;
    return ref::load_act(base, op->per_channel() ? c : 0, dtype);
  }
};

OperandRow operand_row(const NssOperand& op, DType dtype, int64_t b, int64_t s) {
  OperandRow r;
  r.op = &op;
  r.dtype = dtype;
  if (op.kind != NssOperand::Kind::absent)
    r.base = static_cast<const char*>(op.data) +
             (b * op.batch_stride + (s / op.frame_len) * op.frame_stride + s * op.token_stride) *
                 static_cast<int64_t>(dtype_size(dtype));
  return r;
}

// aten's RMS sum of squares (F.rms_norm, torch 2.11): 128 virtual threads, thread t accumulates
// fma(e, e, ss) over its vec4s t, t+128, ... in order; shfl_down tree per warp of 32; then the
// inter-warp tree (w0 + w2) + (w1 + w3).
float aten_rms_total(const float* v, int d) {
  const int n_vec = d / 4;
  float warp_total[4];
  for (int w = 0; w < 4; ++w) {
    float lanes[kWarp];
    for (int l = 0; l < kWarp; ++l) {
      float ss = 0.0f;
      for (int vec = w * kWarp + l; vec < n_vec; vec += 128)
        for (int e = 0; e < 4; ++e) ss = std::fma(v[4 * vec + e], v[4 * vec + e], ss);
      lanes[l] = ss;
    }
    for (int o = kWarp / 2; o >= 1; o /= 2)
      for (int l = 0; l < o; ++l) lanes[l] = lanes[l] + lanes[l + o];
    warp_total[w] = lanes[0];
  }
  return (warp_total[0] + warp_total[2]) + (warp_total[1] + warp_total[3]);
}

// x.float().pow(2).mean(-1)'s sum on CUDA (torch 2.11's generic reduction, a contiguous fp32 row
// of 128 <= d < 8192 elements in a tensor of `rows` rows): W threads per row, W = min(p2(d/4),
// 512 / min(p2(rows), 16)) (p2: the largest power of two <= n, at most 512); thread v adds the
// rounded squares of vec4s v, v + W, ... into four accumulators, combined in order; then
// v += v + off for off = W/2 .. 1.
float aten_mean_total(const float* v, int d, int64_t rows) {
  const auto floor_pow2 = [](int64_t n) {
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    return static_cast<int>(p);
  };
  const int n_vec = d / 4;
  const int width = n_vec < 512 ? floor_pow2(n_vec) : 512;
  const int height = rows < 16 ? floor_pow2(rows) : 16;
  const int threads = std::min(width, 512 / height);
  std::vector<float> partial(threads);
  for (int t = 0; t < threads; ++t) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int vec = t; vec < n_vec; vec += threads)
      for (int e = 0; e < 4; ++e) acc[e] = acc[e] + v[4 * vec + e] * v[4 * vec + e];
    partial[t] = ((acc[0] + acc[1]) + acc[2]) + acc[3];
  }
  for (int off = threads / 2; off >= 1; off /= 2)
    for (int t = 0; t < off; ++t) partial[t] = partial[t] + partial[t + off];
  return partial[0];
}

// SGLang's CTA sum: thread t of d/16 sums term(16t .. 16t+15) sequentially from +0; each warp of
// 32 threads reduces by butterfly (lane 0's value = the shfl_down tree, threads past the row hold
// +0); warp 0 reduces the warp totals over 32 slots the same way (empty slots +0).
template <typename Term>
float sglang_block_sum(int d, const Term& term) {
  const int threads = d / 16;
  const int warps = (threads + kWarp - 1) / kWarp;
  float slot[kWarp] = {};
  for (int w = 0; w < warps; ++w) {
    float lanes[kWarp];
    for (int l = 0; l < kWarp; ++l) {
      const int t = w * kWarp + l;
      float sum = 0.0f;
      if (t < threads)
        for (int i = 0; i < 16; ++i) sum = term(16 * t + i, sum);
      lanes[l] = sum;
    }
    for (int o = kWarp / 2; o >= 1; o /= 2)
      for (int l = 0; l < o; ++l) lanes[l] = lanes[l] + lanes[l + o];
    slot[w] = lanes[0];
  }
  for (int o = kWarp / 2; o >= 1; o /= 2)
    for (int l = 0; l < o; ++l) slot[l] = slot[l] + slot[l + o];
  return slot[0];
}

void process_row(const NormScaleShiftCall& c, int64_t row, std::vector<float>& v, std::vector<float>& y) {
  const DType dt = c.in.x.dtype;
  const int d = c.dim;
  const int64_t b = row / c.seq, s = row % c.seq;
  const bool sglang = c.options.numerics == NssNumerics::sglang;
  // numerics=float32: every operand f32, every operation fp32, y and v rounded once to dt.
  const bool float32 = c.options.numerics == NssNumerics::float32;
  const OperandRow scale = operand_row(c.scale, c.in.scale.data ? c.in.scale.dtype : dt, b, s);
  const OperandRow shift = operand_row(c.shift, c.in.shift.data ? c.in.shift.dtype : dt, b, s);
  const OperandRow gate = operand_row(c.gate, c.in.gate.data ? c.in.gate.dtype : dt, b, s);

  const char* x = at(c.in.x, row_offset(c.in.x, b, s));
  for (int i = 0; i < d; ++i) v[i] = ref::load_act(x, i, dt);
  if (c.residual) {
    const char* r = at(c.in.residual, row_offset(c.in.residual, b, s));
    char* ro = const_cast<char*>(at(c.out.residual_out, row_offset(c.out.residual_out, b, s)));
    for (int i = 0; i < d; ++i) {
      const float rv = ref::load_act(r, i, dt);
      const float g = gate.value(i, 1.0f);
      v[i] = sglang    ? ref::round_to(dt, std::fma(v[i], g, rv))
             : float32 ? ref::round_to(dt, rv + v[i] * g)
                       : ref::round_to(dt, rv + ref::round_to(dt, v[i] * g));
    }
    for (int i = 0; i < d; ++i) ref::store_act(ro, i, dt, v[i]);
  }

  const float eps = c.options.eps;
  if (sglang) {
    const float inv_d = 1.0f / static_cast<float>(d);
    const float mean = sglang_block_sum(d, [&](int i, float acc) { return acc + v[i]; }) * inv_d;
    const float var = sglang_block_sum(d, [&](int i, float acc) {
                        const float dv = v[i] - mean;
                        return std::fma(dv, dv, acc);
                      }) * inv_d;
    const float factor = ref::aten_rsqrtf(var + eps);
    for (int i = 0; i < d; ++i) {
      const float norm = ref::round_to(dt, (v[i] - mean) * factor);
      const float op = 1.0f + scale.value(i, 0.0f);
      y[i] = ref::round_to(dt, c.shift.kind != NssOperand::Kind::absent ? std::fma(norm, op, shift.value(i, 0.0f))
                                                                         : norm * op);
    }
  } else {
    float mean = 0.0f, rstd;
    if (c.options.norm == NormType::rms && c.options.norm_order == NssNormOrder::aten_mean) {
      // aten's MeanOps factor: fp32(rows) / fp32(rows * d), not 1/d, where rows * d has more than
      // 24 significant bits.
      const float factor = static_cast<float>(c.rows) / static_cast<float>(c.rows * d);
      rstd = ref::aten_rsqrtf(aten_mean_total(v.data(), d, c.rows) * factor + eps);
    } else if (c.options.norm == NormType::rms) {
      rstd = ref::aten_rsqrtf(aten_rms_total(v.data(), d) / static_cast<float>(d) + eps);
    } else {
      const ref::RowStats st = ref::aten_row_stats(v.data(), d, eps);
      mean = st.mean;
      rstd = st.rstd;
    }
    for (int i = 0; i < d; ++i) {
      const float n = rstd * (v[i] - mean);
      float a = n;
      if (c.affine >= 1) {
        const float w = ref::load_act(c.in.weight.data, i, c.in.weight.dtype);
        a = c.affine == 2 ? std::fma(w, n, ref::load_act(c.in.bias.data, i, c.in.bias.dtype)) : w * n;
      }
      if (float32) {  // the modulation in fp32 on the unrounded norm, one rounding
        float m = a;
        if (c.modulate) m = m * (1.0f + scale.value(i, 0.0f));
        if (c.shift.kind != NssOperand::Kind::absent) m = m + shift.value(i, 0.0f);
        y[i] = ref::round_to(dt, m);
        continue;
      }
      const float y0 = ref::round_to(dt, a);
      const float y1 = ref::round_to(dt, y0 * ref::round_to(dt, 1.0f + scale.value(i, 0.0f)));
      y[i] = c.shift.kind != NssOperand::Kind::absent ? ref::round_to(dt, y1 + shift.value(i, 0.0f)) : y1;
    }
  }

  if (c.store_y) {
    char* yr = const_cast<char*>(at(c.out.y, row_offset(c.out.y, b, s)));
    for (int i = 0; i < d; ++i) ref::store_act(yr, i, dt, y[i]);
  }
  if (c.quant == NssQuant::fp8) {
    const float input_scale = *static_cast<const float*>(c.in.input_scale.data);
    const float inv = c.options.fp8_reciprocal == Fp8Reciprocal::div_full ? ref::div_full(1.0f, input_scale)
                                                                           : 1.0f / input_scale;
    uint8_t* q = reinterpret_cast<uint8_t*>(const_cast<char*>(at(c.out.fp8, row_offset(c.out.fp8, b, s))));
    for (int i = 0; i < d; ++i) q[i] = ref::float_to_e4m3_satfinite(y[i] * inv);
  }
  if (c.quant == NssQuant::fp8_rowwise) {
    uint16_t amax = 0;
    for (int i = 0; i < d; ++i) amax = std::max(amax, ref::magnitude_bits(ref::float_to_act_bits(y[i], dt)));
    const float row_scale = ref::fp8_rowwise_scale(amax, dt);
    static_cast<float*>(c.out.fp8_scale.data)[row] = row_scale;
    auto* q = reinterpret_cast<uint8_t*>(const_cast<char*>(at(c.out.fp8_rowwise, row_offset(c.out.fp8_rowwise, b, s))));
    for (int i = 0; i < d; ++i) q[i] = ref::fp8_rowwise_e4m3(y[i], row_scale);
  }
  if (c.quant == NssQuant::nvfp4) {
    const float global_scale = *static_cast<const float*>(c.in.global_scale.data);
    uint8_t* packed = static_cast<uint8_t*>(c.out.nvfp4_packed.data) + row * (d / 2);
    uint8_t* scales = static_cast<uint8_t*>(c.out.nvfp4_scales.data);
    for (int k = 0; k < d / 16; ++k) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(y[16 * k + i]));
      uint8_t sf8;
      const float out_scale = ref::nvfp4_block_scale(amax, global_scale, &sf8);
      scales[nvfp4_scale_offset(row, k, d / 16)] = sf8;
      for (int i = 0; i < 16; i += 2) {
        const uint8_t lo = ref::float_to_e2m1_satfinite(y[16 * k + i] * out_scale);
        const uint8_t hi = ref::float_to_e2m1_satfinite(y[16 * k + i + 1] * out_scale);
        packed[(16 * k + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

}  // namespace

void norm_scale_shift_reference(const NormScaleShiftCall& call) {
  for (const TensorView* t : {&call.in.x, &call.in.residual, &call.in.gate, &call.in.weight, &call.in.bias,
                              &call.in.scale, &call.in.shift, &call.in.input_scale, &call.in.global_scale,
                              &call.out.y, &call.out.residual_out, &call.out.fp8, &call.out.nvfp4_packed,
                              &call.out.nvfp4_scales, &call.out.fp8_rowwise, &call.out.fp8_scale}) {
    if (t->data && t->device.kind != DeviceKind::cpu)
      throw Error("norm_scale_shift reference: every tensor must be on the CPU (" + t->describe() + ")");
  }
  const DType dt = call.in.x.dtype;
  if (dt != DType::f32 && dt != DType::f16 && dt != DType::bf16)
    throw Error(std::string("norm_scale_shift reference: unsupported dtype ") + dtype_name(dt));
  if (call.dim <= 0 || call.dim % 4 != 0)
    throw Error("norm_scale_shift reference: D must be a positive multiple of 4, got " + std::to_string(call.dim));
  const int64_t rows = call.rows;

  auto run_rows = [&](int64_t begin, int64_t end) {
    std::vector<float> v(call.dim), y(call.dim);
    for (int64_t r = begin; r < end; ++r) process_row(call, r, v, y);
  };
  constexpr int64_t kRowsPerThreadMin = 256;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers =
      rows > kRowsPerThreadMin ? std::min<int64_t>(hardware, (rows + kRowsPerThreadMin - 1) / kRowsPerThreadMin) : 1;
  if (workers <= 1) {
    run_rows(0, rows);
  } else {
    // Rows are independent, so the result does not depend on the split.
    std::vector<std::thread> threads;
    const int64_t chunk = (rows + workers - 1) / workers;
    for (int64_t w = 1; w < workers; ++w) {
      const int64_t begin = std::min(rows, w * chunk), end = std::min(rows, begin + chunk);
      try {
        threads.emplace_back(run_rows, begin, end);
      } catch (const std::system_error&) {
        run_rows(begin, end);
      }
    }
    run_rows(0, std::min(rows, chunk));
    for (std::thread& t : threads) t.join();
  }

  if (call.quant == NssQuant::nvfp4) {
    // Scale rows past the last row (up to the next multiple of 128) are zero.
    uint8_t* scales = static_cast<uint8_t*>(call.out.nvfp4_scales.data);
    const int cols = call.dim / 16;
    const int64_t padded = (rows + 127) / 128 * 128;
    for (int64_t m = rows; m < padded; ++m)
      for (int k = 0; k < cols; ++k) scales[nvfp4_scale_offset(m, k, cols)] = 0;
  }
}

}  // namespace ditops
