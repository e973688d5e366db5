// Exact host conversions to the 8- and 4-bit float formats of the quantized outputs, and the
// host stand-ins of the GPU's approximate reciprocals (header only, integer/double arithmetic so
// the result never depends on the host FPU mode).
//
//   E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity; 0x7F/0xFF are NaN;
//     largest finite 448, smallest subnormal 2^-9. float_to_e4m3_satfinite is
//     cvt.rn.satfinite.e4m3x2.f32: round to nearest even, finite values beyond 448 -> +-448,
//     infinities -> +-448, NaN -> NaN (0x7F with the sign).
//   E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit: {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
//     float_to_e2m1_satfinite is cvt.rn.satfinite.e2m1x2.f32 for one value: round to nearest even
//     (ties to the even code), beyond 6 -> +-6, the sign kept (-0.1 -> 0x8). NaN -> 0x7 is an
//     assumption (PTX leaves it to the hardware; no tested input is NaN).
//   rcp_approx_ftz / div_full: the GPU uses rcp.approx.ftz.f32 and div.full.f32 (both within
//     1-2 ulp, not correctly rounded); here they are the correctly rounded 1/x and a/b (with
//     flush-to-zero of subnormal inputs and outputs for the ftz one). Where the GPU's result
//     differs in its last bit, a scale byte or a value at a rounding midpoint can differ: the GPU
//     tests count such differences instead of asserting equality (docs/norm_scale_shift.md §5).
#pragma once

#include <cmath>
#include <cstdint>

#include "reference/half.h"

namespace ditops::ref {

inline float e4m3_to_float(uint8_t byte) {
  const uint32_t e = (byte >> 3) & 15u, m = byte & 7u;
  if (e == 15 && m == 7) return std::nanf("");
  const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -9)
                            : std::ldexp(static_cast<double>(8 + m), static_cast<int>(e) - 10);
  return static_cast<float>((byte & 0x80u) ? -mag : mag);
}

inline uint8_t float_to_e4m3_satfinite(float x) {
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7F);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<uint8_t>(sign | 0x7E);
  if (a == 0.0) return sign;
  int exponent;  // a = f * 2^exponent, f in [0.5, 1)
  std::frexp(a, &exponent);
  const int e = exponent - 1;             // a in [2^e, 2^(e+1))
  const int quantum_exp = e < -6 ? -9 : e - 3;  // spacing of E4M3 values around a
  // a / 2^quantum_exp is exact in double; rint rounds to nearest even (default rounding mode).
  const double r = std::rint(std::ldexp(a, -quantum_exp));
  if (e < -6) return static_cast<uint8_t>(sign | static_cast<uint32_t>(r));  // r in [0, 8]: 8 is 2^-6
  uint32_t field = static_cast<uint32_t>(e + 7);
  uint32_t mant = static_cast<uint32_t>(r) - 8;  // r in [8, 16]
  if (mant == 8) {
    ++field;
    mant = 0;
  }
  return static_cast<uint8_t>(sign | (field << 3) | mant);
}

inline float e2m1_to_float(uint8_t nibble) {
  static const float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kMagnitude[nibble & 7u];
  return (nibble & 8u) ? -mag : mag;
}

inline uint8_t float_to_e2m1_satfinite(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 7;
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 8u);
  const float a = std::fabs(x);
  // Each threshold is the midpoint between two neighbours; at a midpoint the even code wins, so
  // the compare is strict where the lower neighbour is even and inclusive where it is odd.
  const uint8_t code = static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                                            (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
  return static_cast<uint8_t>(sign | code);
}

// ftz: subnormal inputs read as zero (same sign), subnormal results flush to zero.
inline float flush_subnormal(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
inline float rcp_approx_ftz(float x) { return flush_subnormal(1.0f / flush_subnormal(x)); }
inline float div_full(float a, float b) { return a / b; }

// The NVFP4 output scale of a block (TRT-LLM's cvt_warp_fp16_to_fp4 recipe) from its amax;
// *sf8 receives the E4M3 scale byte.
inline float nvfp4_block_scale(float amax, float global_scale, uint8_t* sf8) {
  const float sf = global_scale * (amax * rcp_approx_ftz(6.0f));
  *sf8 = float_to_e4m3_satfinite(sf);
  const float sff = e4m3_to_float(*sf8);
  return sff != 0.0f ? rcp_approx_ftz(sff * rcp_approx_ftz(global_scale)) : 0.0f;
}

}  // namespace ditops::ref
