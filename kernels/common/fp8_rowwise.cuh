// The per-token (rowwise) dynamic e4m3 recipe of the FP8 producers (fp8_rowwise_quant,
// layernorm_modulate_fp8_rowwise, norm_scale_shift's fp8_rowwise output): torchao 0.18's float8
// dynamic rowwise activation quantization as eager PyTorch computes it on CUDA, for a row y of
// 16-bit values (T = bf16 or f16, the model's dtype):
//
//   amax = y.abs().amax(-1)                 exact in T; NaN propagates (torch's amax does)
//   s    = T(amax * fp32(1 / 448))           amax / 448.0: ATen multiplies a tensor by the fp32
//                                            reciprocal of a Python scalar, rounds the fp32
//                                            product to T (RNE)
//   s    = float(s), 1 where it is 0         our zero-row rule (torchao has none: 0 -> NaN bytes)
//   q    = e4m3(clamp(float(y) / s, +-448))  IEEE fp32 division, RNE e4m3 with saturation
//
// amax works on the raw 16-bit patterns: with the sign cleared, the integer order of bf16 and f16
// patterns is their magnitude order, and every NaN pattern lies above +Inf, so an integer max
// propagates NaN as torch's amax does (its payload does not matter: the fp32 product that follows
// returns the GPU's canonical NaN, which rounds to T's canonical 0x7FFF, as in eager).
// docs/fp8_rowwise_quant.md states the recipe and where it differs from torchao.
#pragma once

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops::kernel {

// Lane-wise max of two pairs of unsigned 16-bit values (max.u16x2: sm_90+; two compares elsewhere).
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 out;
  asm("max.u16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
#else
  const u32 lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const u32 hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

// The running abs-max of a thread's packed 16-bit words: both halves' magnitudes (sign cleared).
__device__ __forceinline__ u32 abs_max_pairs(u32 running, u32 word) { return max_u16x2(running, word & 0x7FFF7FFFu); }
// The larger half of a running pair: one 16-bit magnitude pattern.
__device__ __forceinline__ u32 fold_pairs(u32 pairs) {
  const u32 lo = pairs & 0xFFFFu, hi = pairs >> 16;
  return lo > hi ? lo : hi;
}

// Max over the warp (redux.sync, sm_80+).
__device__ __forceinline__ u32 warp_max_u32(u32 v) {
  u32 out;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(out) : "r"(v));
  return out;
}

// Max over the CTA (blockDim.x a multiple of 32, at most 32 warps), every thread receiving it.
// `partials` is shared memory of 32 words, one buffer per row parity: a warp rewrites its word of
// a buffer only after the next row's barrier, which every warp reaches after reading this row's.
__device__ __forceinline__ u32 block_max_u32(u32 v, u32* partials) {
  v = warp_max_u32(v);
  const unsigned lane = threadIdx.x & 31u, warps = blockDim.x >> 5;
  if (lane == 0) partials[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_max_u32(lane < warps ? partials[lane] : 0u);
}

// s from the row's amax pattern (a 16-bit magnitude of T): T(amax * fp32(1/448)) widened, 1 where
// it is 0. 1.0f / 448.0f is folded by the compiler to the IEEE quotient, the value ATen's host
// computes for its reciprocal (0x1.24924ap-9).
template <typename T>
__device__ __forceinline__ float fp8_rowwise_scale(u32 amax_bits) {
  T amax;
  amax.bits = static_cast<unsigned short>(amax_bits);
  const float s = round_to<T>(__fmul_rn(to_float(amax), 1.0f / 448.0f));
  return s == 0.0f ? 1.0f : s;
}

// y / s as the IEEE division computes it, from r = 1 / s (IEEE, once per row). kExact: the division
// itself (div.rn: a reciprocal, a Newton step and a range check with a slow path per element, ~11
// SASS instructions). Otherwise the correction of Markstein's theorem: q0 = y * r, the negated
// remainder s * q0 - y exactly by an fma, q = q0 - rem * r rounded once: 3 instructions. In this
// order of signs a zero y keeps its sign (-0: -0 * s - -0 = +0, then -0 + -0; the remainder
// y - s * q0 would give +0 + -0 = +0), so no sign fix is needed. It equals the division on rows
// where fp8_rowwise_fast(s) (s normal and >= 2^-64): wherever the e4m3 byte depends on the quotient
// (>= 2^-12), y >= 2^-76 and the remainder is exact; tiny y give signed e4m3 zeros both ways.
// tests/test_fp8_rowwise_quant.cpp checks the equality for every pair of bf16 (f16) significands
// over every exponent offset.
__device__ __forceinline__ bool fp8_rowwise_fast(float s) { return s >= 0x1p-64f && s <= 0x1.fffffep127f; }

template <bool kExact>
__device__ __forceinline__ float fp8_rowwise_divide(float y, float s, float r) {
  if constexpr (kExact) {
    return __fdiv_rn(y, s);
  } else {
    const float q0 = __fmul_rn(y, r);
    return __fmaf_rn(-__fmaf_rn(s, q0, -y), r, q0);
  }
}

// One packed word of two T values divided by s: two e4m3 bytes in the low half. The saturating
// conversion is the clamp to +-448 and the RNE cast in one; a NaN quotient (kExact rows only) is
// the GPU's canonical NaN (0x7F), as eager's division gives.
template <typename T, bool kExact>
__device__ __forceinline__ u32 e4m3x2_of_word(u32 word, float s, float r) {
  T lo, hi;
  lo.bits = static_cast<unsigned short>(word);
  hi.bits = static_cast<unsigned short>(word >> 16);
  return e4m3x2_rn_satfinite(fp8_rowwise_divide<kExact>(to_float(lo), s, r),
                             fp8_rowwise_divide<kExact>(to_float(hi), s, r));
}

// Four packed words (8 T values) as two words of e4m3 bytes.
template <typename T, bool kExact>
__device__ __forceinline__ void e4m3x8_of_words(const u32 (&w)[4], float s, float r, u32* lo, u32* hi) {
  *lo = e4m3x2_of_word<T, kExact>(w[0], s, r) | (e4m3x2_of_word<T, kExact>(w[1], s, r) << 16);
  *hi = e4m3x2_of_word<T, kExact>(w[2], s, r) | (e4m3x2_of_word<T, kExact>(w[3], s, r) << 16);
}

}  // namespace ditops::kernel
