// An independent rounding for the tests' oracles: binary floating point with `precision`
// significant bits, computed in double (no use of the library's conversions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ditops/tensor.h"

namespace ditops::testing_oracle {

inline double power_of_two(int e) {  // 2^e for e in the normal double range, built from its bits
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

inline double round_binary(double x, int precision, int emin, double max_finite) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);                       // |x| = m * 2^e, m in [0.5, 1)
  const int lead = std::max(e - 1, emin);  // subnormals share the smallest quantum
  const int q = lead - (precision - 1);
  const double r = std::nearbyint(x * power_of_two(-q)) * power_of_two(q);  // exact scalings; ties to even, -0 kept
  if (std::fabs(r) > max_finite) return std::copysign(INFINITY, x);
  return r;
}
inline double round_f32(double x) { return round_binary(x, 24, -126, 0x1.fffffep127); }
inline double round_dtype(double x, DType t) {
  switch (t) {
    case DType::bf16: return round_binary(x, 8, -126, 0x1.fep127);
    case DType::f16: return round_binary(x, 11, -14, 65504.0);
    default: return round_f32(x);
  }
}

// fp32(a + b) for doubles holding values of at most 24 significant bits, correctly rounded: the
// double sum is exact unless the exponents lie far apart, and then it matters only on an fp32
// midpoint, where the part the double sum lost decides the direction (TwoSum).
inline double round_f32_sum(double a, double b) {
  const double s = a + b;
  if (!std::isfinite(s)) return s;
  const double bb = s - a, lost = (a - (s - bb)) + (b - bb);
  if (lost == 0) return round_f32(s);
  const bool midpoint = round_f32(std::nextafter(s, INFINITY)) != round_f32(std::nextafter(s, -INFINITY));
  return round_f32(midpoint ? std::nextafter(s, lost > 0 ? INFINITY : -INFINITY) : s);
}

// F.silu(gate) * up in double (the swiglu op's oracle, and fp8_rowwise_quant's act=swiglu): the fp32
// steps of ATen's silu (exp in double rounded to fp32, its sum, the division), rounded to the dtype,
// then the product (exact in double) rounded to the dtype; f32: no rounding between the steps.
inline double swiglu(double gate, double up, DType dtype) {
  const double silu = round_dtype(round_f32(gate / round_f32_sum(1.0, round_f32(std::exp(-gate)))), dtype);
  return round_dtype(silu * up, dtype);
}

// F.gelu(x, approximate="tanh") in double (the gelu_tanh op's oracle, and fp8_rowwise_quant's
// act=gelu_tanh): the fp32 steps of ATen's kernel, each rounded to fp32 (nvcc's fma of x + kappa x^3
// as one rounding of the double fma), tanh in double; then the dtype.
inline double gelu_tanh(double x, DType dtype) {
  const double beta = round_f32(1.41421356237309504880 * 1.12837916709551257390 * 0.5), kappa = round_f32(0.044715);
  const double cube = round_f32(round_f32(x * x) * x);
  const double inner = round_f32(beta * round_f32(std::fma(kappa, cube, x)));
  return round_dtype(round_f32(round_f32(0.5 * x) * round_f32(1.0 + round_f32(std::tanh(inner)))), dtype);
}

// The e4m3fn value a static fp8 quantization stores for fp32 product p: NaN stays NaN, the rest
// clamped to +-448 and rounded to 4 significant bits (subnormals from 2^-6 down, in steps of 2^-9).
inline double round_e4m3_saturated(double p) {
  if (std::isnan(p)) return p;
  return round_binary(std::fmin(std::fmax(p, -448.0), 448.0), 4, -6, 448.0);
}
// fl32(1 / scale): IEEE division (53 >= 2 * 24 + 2 bits: the double quotient rounds correctly).
inline double ieee_inverse(double scale) { return round_f32(1.0 / scale); }

}  // namespace ditops::testing_oracle
