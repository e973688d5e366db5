// Exact 16-bit float conversions for the CPU reference (host only, header only).
//
// Written from the IEEE 754 binary16 definition and the bfloat16 layout (the top half of a
// binary32) with integer bit manipulation, so the result never depends on the host FPU, the
// compiler's _Float16 support or the current rounding mode:
//   * widening (16 -> 32 bit) is exact, including fp16 subnormals, infinities and NaNs;
//   * narrowing rounds to nearest, ties to even; fp16 produces subnormals and overflows to inf,
//     both keep NaN a (quiet) NaN with its sign.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "ditops/tensor.h"

namespace ditops::ref {

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// ---- bfloat16: the high 16 bits of a binary32 ----

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16_rne(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: keep sign and the top payload bits, force the quiet bit (a payload living only in
    // the low 16 bits would otherwise truncate to an infinity).
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even on bit 16. A carry out of the mantissa bumps the exponent, which is
  // exactly right (up to the largest finite value rounding to infinity).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// ---- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ----

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) {  // inf / NaN (payload kept, NaN stays NaN)
    return bits_float(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);  // +-0
    // Subnormal: mantissa * 2^-24. Normalize: shift the leading one up to bit 10.
    int e = -14;  // unbiased exponent the value would have with a leading one at bit 10
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    mantissa &= 0x3FFu;
    return bits_float(sign | (static_cast<uint32_t>(e + 127) << 23) | (mantissa << 13));
  }
  return bits_float(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

inline uint16_t float_to_fp16_rne(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  // 65520 = halfway between 65504 (largest finite, odd mantissa) and 65536: ties to even go up.
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // inf (and overflow)
  if (abs >= 0x38800000u) {
    // Normal range [2^-14, 65520): rebias the exponent (127 -> 15) and round on bit 13. A carry
    // out of the mantissa increments the exponent, which is the correctly rounded result.
    const uint32_t lsb = (abs >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((abs - (112u << 23) + 0xFFFu + lsb) >> 13));
  }
  // Subnormal range: the result is round(|value| * 2^24), an integer in [0, 1024] (1024 is the
  // smallest normal, whose bit pattern 0x0400 is exactly that integer).
  if (abs <= 0x33000000u) return sign;  // <= 2^-25: rounds to 0 (the tie 2^-25 goes to even 0)
  const uint32_t exponent = abs >> 23;                     // 102 .. 112
  const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;  // 24 significant bits
  // |value| * 2^24 = mantissa * 2^(exponent - 126 - 23 + 23) = mantissa >> (126 - exponent)
  const uint32_t shift = 126u - exponent;  // 14 .. 24
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

// ---- activation access: element `index` (in elements) of a buffer of f32/f16/bf16 ----

inline float load_act(const void* base, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(base)[index];
    case DType::f16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default:
      throw Error("ditops reference: load_act supports f32/f16/bf16 only (dtype code " +
                  std::to_string(static_cast<int>(dtype)) + ")");
  }
}

inline void store_act(void* base, int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(base)[index] = value;
      return;
    case DType::f16:
      static_cast<uint16_t*>(base)[index] = float_to_fp16_rne(value);
      return;
    case DType::bf16:
      static_cast<uint16_t*>(base)[index] = float_to_bf16_rne(value);
      return;
    default:
      throw Error("ditops reference: store_act supports f32/f16/bf16 only (dtype code " +
                  std::to_string(static_cast<int>(dtype)) + ")");
  }
}

// rne16(x) of the contract: x rounded to the 16-bit dtype and widened back (exact), as fp32.
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f16:
      return fp16_to_float(float_to_fp16_rne(value));
    case DType::bf16:
      return bf16_to_float(float_to_bf16_rne(value));
    default:
      return value;
  }
}

}  // namespace ditops::ref
