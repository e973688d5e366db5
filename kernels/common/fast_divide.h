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

}  // namespace ditops
