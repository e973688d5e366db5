// Division of 31-bit unsigned integers by a divisor fixed at launch: the host computes a
// multiplier and a shift once per call, the kernel divides by one 32 x 32 -> 64-bit multiply and a
// shift instead of the ~20-instruction division sequence (a reciprocal through the MUFU unit and
// two corrections) whose result the first dependent load waits for.
//
// Why it is exact (round-up method, Granlund and Montgomery 1994): for a divisor 1 <= d < 2^31 let
// l = ceil(log2 d), p = 31 + l and m = ceil(2^p / d), so m d = 2^p + e with 0 <= e < d <= 2^l, and
// m <= 2^32 - 1 (m = 2^31 for d a power of two, otherwise 2^p / d < 2^(31+l) / 2^(l-1)). For
// 0 <= n < 2^31: n m / 2^p = n / d + n e / (d 2^p), and n e < 2^31 2^l = 2^p, so the error term is
// below 1 / d and cannot carry n / d past the next integer: floor(n m / 2^p) = floor(n / d).
// tests/test_residual_gate_add.cpp checks it against `/` over divisors and dividends at the edges.
//
// Plain data and constexpr arithmetic: the same header serves the host (which fills the params)
// and the kernels (nvcc and NVRTC).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DITOPS_HOST_DEVICE __host__ __device__
#else
#define DITOPS_HOST_DEVICE
#endif

namespace ditops {

struct FastDivisor {
  unsigned multiplier;
  unsigned shift;  // p = 31 + ceil(log2 d), 31..61
};

// The divisor d (1 <= d < 2^31) as a multiplier and a shift.
DITOPS_HOST_DEVICE constexpr FastDivisor fast_divisor(unsigned d) {
  unsigned l = 0;
  while ((1ull << l) < d) ++l;
  const unsigned p = 31 + l;
  return FastDivisor{static_cast<unsigned>(((1ull << p) + d - 1) / d), p};
}

// floor(n / d) for 0 <= n < 2^31.
DITOPS_HOST_DEVICE constexpr unsigned fast_quotient(unsigned n, FastDivisor d) {
  return static_cast<unsigned>((static_cast<unsigned long long>(n) * d.multiplier) >> d.shift);
}

// The same at twice the width, for 0 <= n < 2^63 and 1 <= d < 2^63: l = ceil(log2 d), p = 63 + l,
// m = ceil(2^p / d) (the proof above with 63 for 31: m < 2^64, and n e < 2^63 2^l = 2^p). The
// quotient is the high half of the 128-bit n m shifted right by p - 64 = l - 1: one
// multiply-high instead of a 64-bit division (~70 instructions). d = 1 (l = 0, p = 63) is kept as
// the identity (multiplier 0), since its quotient needs the product's low half.
struct FastDivisor64 {
  unsigned long long multiplier;  // 0: d = 1
  unsigned shift;                 // p - 64 = l - 1, 0..62
};

// m by long division of 2^p, one bit at a time (no 128-bit type: NVRTC and every host compiler
// take it); the remainder stays below d < 2^63, so 2 r + 1 fits 64 bits.
DITOPS_HOST_DEVICE constexpr FastDivisor64 fast_divisor64(unsigned long long d) {
  if (d <= 1) return FastDivisor64{0, 0};
  unsigned l = 0;
  while ((1ull << l) < d) ++l;
  const unsigned p = 63 + l;
  unsigned long long q = 0, r = 0;
  for (int bit = static_cast<int>(p); bit >= 0; --bit) {
    r = 2 * r + (bit == static_cast<int>(p) ? 1 : 0);
    q <<= 1;
    if (r >= d) r -= d, q |= 1;
  }
  return FastDivisor64{q + (r != 0 ? 1 : 0), l - 1};
}

// floor(n / d) for 0 <= n < 2^63.
DITOPS_HOST_DEVICE inline unsigned long long fast_quotient64(unsigned long long n, FastDivisor64 d) {
  if (d.multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
  return __umul64hi(n, d.multiplier) >> d.shift;
#else
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(n) * d.multiplier) >> 64) >> d.shift;
#endif
}

}  // namespace ditops
