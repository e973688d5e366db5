// The rowwise dynamic e4m3 recipe on the host (kernels/common/fp8_rowwise.cuh on the device), shared
// by the CPU references of the FP8 producers: fp8_rowwise_quant, layernorm_modulate_fp8_rowwise and
// norm_scale_shift's fp8_rowwise output. Every operation one IEEE binary32 operation (src/reference
// compiles without FP contraction), rounding by integer arithmetic (reference/half.h, fp8_fp4.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "ditops/tensor.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops::ref {

// The magnitude pattern of a 16-bit value (sign cleared): its integer order is the order of the
// magnitudes, every NaN above +Inf, so the max of the patterns is torch's NaN-propagating amax.
inline uint16_t magnitude_bits(uint16_t bits) { return static_cast<uint16_t>(bits & 0x7FFFu); }

inline float act_bits_to_float(uint16_t bits, DType dtype) {
  return dtype == DType::bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
}
inline uint16_t float_to_act_bits(float v, DType dtype) {
  return dtype == DType::bf16 ? float_to_bf16_rne(v) : float_to_fp16_rne(v);
}

// s = float(T(amax * fp32(1 / 448))), 1 where it is 0: `amax / 448.0` of a 16-bit tensor (ATen
// multiplies by the fp32 reciprocal of the scalar and rounds the product to T), then our rule.
inline float fp8_rowwise_scale(uint16_t amax_bits, DType dtype) {
  const float inv448 = 1.0f / 448.0f;  // the IEEE quotient, as ATen's host computes it
  const float s = act_bits_to_float(float_to_act_bits(act_bits_to_float(amax_bits, dtype) * inv448, dtype), dtype);
  return s == 0.0f ? 1.0f : s;
}

// e4m3(clamp(y / s, +-448)) with the IEEE division; a NaN quotient is 0x7F (the GPU's canonical
// NaN, which eager's division returns).
inline uint8_t fp8_rowwise_e4m3(float y, float s) {
  const float q = y / s;
  return std::isnan(q) ? uint8_t{0x7F} : float_to_e4m3_satfinite(q);
}

// F.gelu(x, approximate="tanh") in fp32 as ATen's CUDA kernel computes it (kernels/common/gelu.cuh:
// the gelu_tanh op, fp8_rowwise_quant's act=gelu_tanh), before the rounding to the dtype, x + kKappa * x^3 as one fma.
// tanh is taken in double and rounded to fp32 (CUDA's tanhf is within 2 ulp of that).
inline float gelu_tanh(float x) {
  const float beta = static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
  const float kappa = static_cast<float>(0.044715);
  const float x_cube = (x * x) * x;
  const float inner = beta * std::fma(kappa, x_cube, x);
  const float th = static_cast<float>(std::tanh(static_cast<double>(inner)));
  return (0.5f * x) * (1.0f + th);
}

// F.silu(x) in fp32 as ATen's CUDA kernel computes it (kernels/common/swiglu.cuh), x / (1 + exp(-x)),
// before the rounding to the dtype. exp is taken in double and rounded to fp32 (CUDA's expf is
// within 2 ulp of that).
inline float silu(float x) { return x / (1.0f + static_cast<float>(std::exp(-static_cast<double>(x)))); }

// F.silu(gate) * up of two 16-bit values as eager computes it (the swiglu op, fp8_rowwise_quant's
// act=swiglu): silu rounded to the dtype, then the fp32 product (exact for 16-bit operands) rounded
// to the dtype.
inline uint16_t swiglu(uint16_t gate, uint16_t up, DType dtype) {
  const float silu_t = act_bits_to_float(float_to_act_bits(silu(act_bits_to_float(gate, dtype)), dtype), dtype);
  return float_to_act_bits(silu_t * act_bits_to_float(up, dtype), dtype);
}

}  // namespace ditops::ref
